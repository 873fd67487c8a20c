#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_man_pages.sh — proves the man pages say what the tools say, as a reader sees them: each page
# renders without a groff warning; the rendered malld(8), mallctl(1), mallrun(1), mallsim(1) hold
# every line of `TOOL --help` (and of `mallctl help CMD` for each command --help lists; whitespace,
# case and a heading's ':' aside), every option and command; mall(3) every function, macro, return
# code, comment line and $MALL_* variable of mall.h; and `cmake --install` puts them where man finds them.
# Usage: test_man_pages.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "${1:?usage: test_man_pages.sh BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: test_man_pages.sh BUILD_DIR SOURCE_DIR}" && pwd)
. "$src/tests/support/watchdog.sh"   # watchdog_run: every command below is bounded
bounded() { watchdog_run 60 "$@"; }

tmp=$(mktemp -d /tmp/mall-man-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
checked=0   # lines compared for the current page (contains_lines counts them)

# The pages are made with MALL_* unset (mall-help2man), so the texts are compared the same way; the
# reader's man: a UTF-8 locale, a wide terminal (no wrapping inside table rows), no formatting kept.
for v in $(compgen -e); do case $v in MALL_*) unset "$v" ;; esac; done
export LC_ALL=C.UTF-8 MANWIDTH=200
unset MAN_KEEP_FORMATTING MANOPT MANPAGER PAGER

# A text as one lower-case line, whitespace collapsed.
flat() { tr '\n\t' '  ' | tr -s ' ' | tr '[:upper:]' '[:lower:]'; }
# Each non-empty line of a help text, as the page must hold it: whitespace collapsed, lower case,
# "usage:" and a heading's final ':' removed (the page says SYNOPSIS, OPTIONS, ...).
help_lines() {
  sed -E 's/^[[:space:]]*[Uu]sage:[[:space:]]*//; s/[[:space:]]+/ /g; s/^ //; s/ $//; s/:$//' | grep -v '^$' |
    tr '[:upper:]' '[:lower:]'
}

# check_page NAME PAGE: groff's warnings, then renders it into $tmp/NAME.txt (plain text) and
# $tmp/NAME.flat (one line).
check_page() {
  local name=$1 page=$2 warnings
  if [ ! -s "$page" ]; then
    fail "$name: no page at $page (build the 'man' target)"
    return 1
  fi
  warnings=$(bounded groff -man -Tutf8 -ww -z "$page" 2>&1) || fail "$name: groff failed: $warnings"
  [ -z "$warnings" ] || fail "$name: groff warns: $warnings"
  bounded man -l "$page" 2>"$tmp/man.err" | col -bx >"$tmp/$name.txt" || fail "$name: man -l failed: $(cat "$tmp/man.err")"
  [ -s "$tmp/$name.txt" ] || fail "$name: man -l rendered nothing"
  flat <"$tmp/$name.txt" >"$tmp/$name.flat"
}

# contains_lines NAME WHAT: every line of stdin (already normalised) is in the rendered page NAME.
# Feed it with < <(...), not a pipe: a pipe would run it in a subshell and lose its failures.
contains_lines() {
  local name=$1 what=$2 page line
  page=$(cat "$tmp/$name.flat")
  while IFS= read -r line; do
    checked=$((checked + 1))
    if [[ $page != *"$line"* ]]; then
      fail "$name: a line of $what is not in the page: '$line'"
    fi
  done
  return 0
}

# contains_words NAME WHAT WORD...: each word is in the rendered page NAME.
contains_words() {
  local name=$1 what=$2 word page
  shift 2
  page=$(cat "$tmp/$name.flat")
  for word in "$@"; do
    [[ $page == *"${word,,}"* ]] || fail "$name: $what '$word' is not in the page"
  done
}

# --- the tools ---
for entry in malld:8 mallctl:1 mallrun:1 mallsim:1; do
  tool=${entry%:*} section=${entry#*:}
  page=$build/man/man$section/$tool.$section
  check_page "$tool" "$page" || continue
  checked=0
  help=$(bounded "$build/bin/$tool" --help) || { fail "$tool --help failed"; continue; }
  contains_lines "$tool" "$tool --help" < <(help_lines <<<"$help")
  mapfile -t options < <(grep -oE -- '(^|[^[:alnum:]-])--?[[:alnum:]][[:alnum:]-]*' <<<"$help" | sed -E 's/^[^-]*//' | sort -u)
  [ ${#options[@]} -gt 2 ] || fail "$tool --help: found no options in it"
  contains_words "$tool" "option" "${options[@]}"
  if [ "$tool" = mallctl ]; then
    # The commands, read from --help's "Commands:" section the way a reader finds them.
    mapfile -t commands < <(awk '/^Commands:$/ {on = 1; next} on && /^$/ {exit} on && /^  [a-z]/ {print $1}' <<<"$help")
    [ ${#commands[@]} -ge 7 ] || fail "mallctl --help: expected at least 7 commands, found: ${commands[*]:-none}"
    for cmd in "${commands[@]}"; do
      grep -qE "^   $cmd\$" "$tmp/$tool.txt" || fail "mallctl: no subsection for the command '$cmd'"
      cmd_help=$(bounded "$build/bin/mallctl" help "$cmd") || { fail "mallctl help $cmd failed"; continue; }
      contains_lines mallctl "mallctl help $cmd" < <(help_lines <<<"$cmd_help")
      mapfile -t options < <(grep -oE -- '(^|[^[:alnum:]-])--[[:alnum:]][[:alnum:]-]*' <<<"$cmd_help" | sed -E 's/^[^-]*//' | sort -u)
      contains_words mallctl "option (of $cmd)" "${options[@]}"
    done
  fi
  for other in malld mallctl mallrun mallsim mall; do
    [ "$other" = "$tool" ] && continue
    grep -qE "SEE ALSO" "$tmp/$tool.txt" && sed -n '/^SEE ALSO/,$p' "$tmp/$tool.txt" | grep -qE "\b$other\([0-9]\)" ||
      fail "$tool: SEE ALSO does not name $other"
  done
  echo "PASS: $tool($section): groff quiet; every line ($checked), option and command of its help text in the page"
done

# --- mall(3) from mall.h ---
header=$src/libmall/include/mall/mall.h
if check_page mall "$build/man/man3/mall.3"; then
  checked=0
  mapfile -t functions < <(grep -oE '^(MALL_EXPORT|static inline) [^(]*\bmall_[a-z_]+ *\(' "$header" | grep -oE 'mall_[a-z_]+ *\($' | tr -d ' (')
  [ ${#functions[@]} -ge 15 ] || fail "mall.h: expected at least 15 functions, found ${#functions[@]}"
  synopsis=$(sed -n '/^SYNOPSIS/,/^DESCRIPTION/p' "$tmp/mall.txt")
  for f in "${functions[@]}"; do
    grep -qE "\b$f\(" <<<"$synopsis" || fail "mall(3): $f( is not in SYNOPSIS"
    grep -qE "^   ([^ ].*, )?$f(,|$)" "$tmp/mall.txt" || fail "mall(3): no subsection for $f"
  done
  mapfile -t macros < <(grep -oE '^#define MALL_[A-Z0-9_]+' "$header" | awk '{print $2}' | grep -vx 'MALL_MALL_H\|MALL_EXPORT')
  mapfile -t codes < <(grep -oE '^ +MALL_[A-Z_]+ = ' "$header" | awk '{print $1}')
  [ ${#codes[@]} -ge 10 ] || fail "mall.h: expected at least 10 return codes, found ${#codes[@]}"
  contains_words mall "macro" "${macros[@]}"
  contains_words mall "return code" "${codes[@]}"
  mapfile -t variables < <(grep -oE '\$MALL_[A-Z0-9_]+' "$header" | tr -d '$' | sort -u)
  [ ${#variables[@]} -ge 5 ] || fail "mall.h: expected at least 5 MALL_* variables, found ${#variables[@]}"
  environment=$(sed -n '/^ENVIRONMENT/,/^SEE ALSO/p' "$tmp/mall.txt")
  for v in "${variables[@]}"; do
    grep -qE "^       $v\$" <<<"$environment" || fail "mall(3): ENVIRONMENT has no entry for \$$v"
  done
  # Every line of mall.h's comments but its licence tag and the file's title line, markers and list
  # dashes removed (comments inside declarations are shown with them, so they match too).
  contains_lines mall "mall.h's comments" < <(grep -v '^/\* SPDX-License-Identifier:' "$header" | sed -n '2,$p' | grep -v '^#' | awk '
    { line = $0 }
    !in_comment && index(line, "/*") { in_comment = 1; line = substr(line, index(line, "/*") + 2) }
    in_comment {
      done = index(line, "*/")
      if (done) line = substr(line, 1, done - 1)
      sub(/^[[:space:]]*\*( |$)/, "", line); sub(/^[[:space:]]*- /, "", line)
      print line
      if (done) in_comment = 0
    }' | help_lines)
  echo "PASS: mall(3): groff quiet; ${#functions[@]} functions, ${#macros[@]} macros, ${#codes[@]} return codes," \
       "${#variables[@]} MALL_* variables and every comment line ($checked) of mall.h in the page"
fi

# --- cmake --install puts them where man finds them ---
if bounded cmake --install "$build" --prefix "$tmp/prefix" --component man >"$tmp/install.log" 2>&1; then
  for page in "8 malld" "1 mallctl" "1 mallrun" "1 mallsim" "3 mall"; do
    set -- $page
    where=$(bounded man -w -M "$tmp/prefix/share/man" "$1" "$2" 2>&1) || true
    [ "$where" = "$tmp/prefix/share/man/man$1/$2.$1.gz" ] || fail "man -w -M <prefix>/share/man $1 $2 says '$where'"
    [ "$(bounded zcat "$where" 2>/dev/null)" = "$(cat "$build/man/man$1/$2.$1")" ] ||
      fail "$where is not the gzip of $build/man/man$1/$2.$1"
  done
  echo "PASS: cmake --install puts the pages, gzip'd, under share/man, where man -w finds them"
else
  fail "cmake --install --component man: $(cat "$tmp/install.log")"
fi

if [ "$failures" -gt 0 ]; then
  echo "test_man_pages: $failures failure(s)"
  exit 1
fi
echo "test_man_pages: ok"
