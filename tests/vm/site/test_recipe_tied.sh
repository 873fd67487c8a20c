#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_recipe_tied.sh — ctest unit.site_recipe_tied (issue 38): docs/admin-slurm.md's recipe "mall for
# Slurm 24.11 on Debian 13" (the ```bash block between <!-- slurm-24.11-recipe:begin --> and
# <!-- slurm-24.11-recipe:end -->) is what the Debian 13 site guest runs, so the doc and ctest
# vm.site cannot drift apart. Checks, without root, a network or a guest (about 1 s):
#   (1) the doc has the recipe, and it is whole: the apt-get install of Slurm 24.11 (slurmd,
#       slurmctld, slurm-client, munge, libslurm-dev), cmake's configure line for /usr with the
#       plugin and malld's delegation, the build, cpack -G DEB, the .deb's install;
#   (2) build-site-deb.sh runs exactly the doc's block (--print-recipe, the script the chroot runs,
#       equals the block as this test reads it), also when the doc's recipe is edited;
#   (3) build-site-deb.sh runs no cmake, ninja, cpack or apt-get of its own;
#   (4) make-site-root.sh installs the packages of the recipe's apt-get line (--print-packages),
#       following an edited doc (a package added, one taken out);
#   (5) the root's cache key (--print-path) and the build tree's (--print-packages-key) change with
#       any line of the recipe, a comment too, and not with the doc's prose around it;
#   (6) a doc without the markers is refused by both scripts with words that name them;
#   (7) every configuration line the doc's 24.11 section quotes (slurm.conf, cgroup.conf,
#       plugstack.conf, /etc/default/malld, the cli_filter.lua install) is in the site guest's
#       files (tests/vm/site/slurm/, site_slurm.sh).
# The edited docs are copies in a temp folder (MALL_SLURM_RECIPE_DOC), removed on exit. One PASS or
# FAIL line per check; exit 1 when any failed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
doc=$(cd "$here/../../.." && pwd)/docs/admin-slurm.md
. "$here/../../support/watchdog.sh"
watchdog_script 60 "$@"
trap 'watchdog_fired 60; exit 124' TERM

failures=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
work=$(mktemp -d "${TMPDIR:-/tmp}/test_recipe_tied.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
# The scripts must not touch a real cache here: --print-path and --print-packages-key compute only.
export XDG_CACHE_HOME=$work/cache

# block DOC: the recipe block as this test reads it (independently of slurm_recipe.sh): the lines
# between the markers, less the fences and the indent of the begin marker.
block() {
  sed -n '/^ *<!-- slurm-24\.11-recipe:begin -->$/,/^ *<!-- slurm-24\.11-recipe:end -->$/p' "$1" |
    sed '1d; $d' | sed '/^ *```/d' | sed "s/^$(sed -n 's/^\( *\)<!-- slurm-24\.11-recipe:begin -->$/\1/p' "$1")//"
}
# apt_packages DOC: the packages of the block's `apt-get install` line (continuations joined) that
# installs packages, not a ./file.deb, sorted.
apt_packages() {
  block "$1" | sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | awk '$1 == "apt-get" && $2 == "install" && $0 !~ /\.deb/ {
    for (i = 3; i <= NF; i++) if ($i !~ /^-/) print $i }' | sort
}
site_packages() { MALL_SLURM_RECIPE_DOC=$1 "$here/make-site-root.sh" --print-packages | tr ',' '\n' | sort; }

# ---- (1) the doc has the whole recipe -------------------------------------------------------------
recipe=$(block "$doc")
joined=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' <<<"$recipe" | tr -s ' ')
missing=()
for want in 'apt-get install .*slurmd' 'apt-get install .*slurmctld' 'apt-get install .*slurm-client' \
            'apt-get install .*munge' 'apt-get install .*libslurm-dev' \
            '^cmake -G Ninja -S \. -B build-deb .*-DCMAKE_INSTALL_PREFIX=/usr' \
            '^cmake -G .*-DMALL_WITH_SLURM=ON' '^cmake -G .*-DMALL_SYSTEMD_DELEGATE=ON' \
            '^cmake --build build-deb$' '^cpack -G DEB .*-B build-deb/package$' \
            '^apt-get install -y \./build-deb/package/mall_\*_amd64\.deb$'; do
  grep -qE "$want" <<<"$joined" || missing+=("$want")
done
if [ -n "$recipe" ] && [ ${#missing[@]} -eq 0 ]; then
  pass "(1) docs/admin-slurm.md has the Slurm 24.11 recipe ($(wc -l <<<"$recipe") lines): packages, configure, build, cpack, install"
else
  fail "(1) docs/admin-slurm.md's Slurm 24.11 recipe is missing or lacks: ${missing[*]:-the whole block} (recipe: '${recipe:0:200}')"
fi

# Edited copies of the doc.
sed 's/-DMALL_WITH_SLURM=ON/-DMALL_WITH_SLURM=ON -DMALL_RECIPE_TEST=1/' "$doc" >"$work/configure.md"
sed 's/ munge \\$/ munge hello \\/; s/ dpkg-dev file$/ dpkg-dev/' "$doc" >"$work/packages.md"
sed 's/^\( *\)# The package, here and on every node/\1# The package (edited comment), here and on every node/' "$doc" >"$work/comment.md"
sed 's/^# Administering mall/# Administering mall (edited title)/' "$doc" >"$work/prose.md"
sed '/slurm-24\.11-recipe:/d' "$doc" >"$work/nomarkers.md"
for f in configure packages comment prose; do
  cmp -s "$doc" "$work/$f.md" && fail "(setup) the edit for $f.md changed nothing in the doc: fix this test's sed"
done

# ---- (2) build-site-deb.sh runs the doc's block -----------------------------------------------------
for d in "$doc" "$work/configure.md"; do
  runs=$(MALL_SLURM_RECIPE_DOC=$d "$here/build-site-deb.sh" --print-recipe 2>&1)
  if [ "$runs" = "$(block "$d")" ] && [ -n "$runs" ]; then
    pass "(2) build-site-deb.sh runs $(basename "$d")'s recipe line for line ($(grep -c . <<<"$runs") lines$(grep -q MALL_RECIPE_TEST <<<"$runs" && echo ', the edited configure line included'))"
  else
    fail "(2) build-site-deb.sh would run something else than $(basename "$d")'s recipe: $(diff <(block "$d") <(echo "$runs") | head -n 10 | tr '\n' '|')"
  fi
done
# ... and the chroot runs what --print-recipe prints: the file written from the same text.
if grep -qF "printf '%s\\n' \"\$recipe\" >\"\$root/tmp/slurm-24.11-recipe.sh\"" "$here/build-site-deb.sh" &&
   grep -qF 'exec /bin/bash -e -x /tmp/slurm-24.11-recipe.sh' "$here/build-site-deb.sh"; then
  pass "(2) the chroot runs /tmp/slurm-24.11-recipe.sh, written from the recipe --print-recipe shows"
else
  fail "(2) build-site-deb.sh no longer writes \$recipe to /tmp/slurm-24.11-recipe.sh and runs it with bash -e in the chroot"
fi

# ---- (3) no build command of build-site-deb.sh's own ------------------------------------------------
# Its lines less the --help text and comments; a command word is one not glued to a -, / or . (so
# make-site-root.sh is no `make`).
own=$(sed '/<<EOF$/,/^EOF$/d; s/^[[:space:]]*#.*//; s/[[:space:]]#.*$//' "$here/build-site-deb.sh" |
  grep -nE '(^|[^-./[:alnum:]_])(cmake|ninja|cpack|apt-get|apt|make|dpkg-buildpackage)([[:space:]]|$)')
if [ -z "$own" ]; then
  pass "(3) build-site-deb.sh runs no cmake, ninja, cpack or apt-get of its own (outside its --help text)"
else
  fail "(3) build-site-deb.sh builds by itself beside the doc's recipe: $own"
fi

# ---- (4) the root holds the recipe's packages --------------------------------------------------------
for d in "$doc" "$work/packages.md"; do
  want=$(apt_packages "$d")
  have=$(site_packages "$d" 2>&1)
  lacking=$(comm -23 <(echo "$want") <(echo "$have") | paste -sd' ')
  if [ -n "$want" ] && [ -z "$lacking" ]; then
    pass "(4) make-site-root.sh installs the $(wc -l <<<"$want") packages of $(basename "$d")'s apt-get line"
  else
    fail "(4) make-site-root.sh lacks $(basename "$d")'s packages '${lacking:-all}' (it installs: $(paste -sd' ' <<<"$have"))"
  fi
done
have=$(site_packages "$work/packages.md")
if grep -qx hello <<<"$have" && ! grep -qx file <<<"$have"; then
  pass "(4) a package added to the recipe (hello) is in the root, one taken out (file) is not"
else
  fail "(4) the root's packages do not follow the recipe: hello $(grep -qx hello <<<"$have" && echo in || echo missing), file $(grep -qx file <<<"$have" && echo 'still in (hard-coded in make-site-root.sh?)' || echo out)"
fi

# ---- (5) the cache keys follow the recipe ------------------------------------------------------------
keys() { echo "$(MALL_SLURM_RECIPE_DOC=$1 "$here/make-site-root.sh" --print-path) $(MALL_SLURM_RECIPE_DOC=$1 "$here/make-site-root.sh" --print-packages-key)"; }
base=$(keys "$doc")
for f in configure comment; do
  other=$(keys "$work/$f.md")
  if [ -n "$base" ] && [ "${other% *}" != "${base% *}" ] && [ "${other#* }" != "${base#* }" ]; then
    pass "(5) a recipe edit ($f.md) gives the root and the build tree new keys: $(basename "${other% *}")"
  else
    fail "(5) a recipe edit ($f.md) keeps the keys: '$base' vs '$other' (a stale root or build tree would be used)"
  fi
done
other=$(keys "$work/prose.md")
[ "$other" = "$base" ] && pass "(5) an edit of the doc outside the recipe keeps both keys" ||
  fail "(5) an edit outside the recipe changes the keys: '$base' vs '$other' (every doc edit would rebuild the root)"

# ---- (6) a doc without the recipe is refused -----------------------------------------------------------
for cmd in "make-site-root.sh --print-packages" "build-site-deb.sh --print-recipe"; do
  rc=0
  msg=$(MALL_SLURM_RECIPE_DOC=$work/nomarkers.md "$here"/$cmd 2>&1) || rc=$?
  if [ "$rc" = 1 ] && grep -q 'slurm-24.11-recipe:begin' <<<"$msg"; then
    pass "(6) $cmd refuses a doc without the recipe: $(head -n 1 <<<"$msg")"
  else
    fail "(6) $cmd with a doc without the recipe: exit $rc, '$msg'"
  fi
done

# ---- (7) the 24.11 section's configuration is the guest's --------------------------------------------
# The lines of the fenced blocks of items 2 and 3 of "Deploying on systemd + cgroup v2 + Slurm 24.11".
quoted=$(sed -n '/^2\. \*\*Install and start malld\*\*/,/^4\. \*\*podman 5\*\*/p' "$doc" |
  awk '/^ *```/ { inside = !inside; next } inside { sub(/^ +/, ""); if ($0 != "" && $0 !~ /^#/) print }')
guest=$(cat "$here"/slurm/slurm.conf "$here"/slurm/cgroup.conf "$here"/slurm/plugstack.conf "$here"/slurm/malld.default "$here"/slurm/site_slurm.sh)
absent=()
while IFS= read -r line; do
  case $line in
    "install -m 0644 /usr/share/mall/slurm/cli_filter.lua /etc/slurm/cli_filter.lua")
      grep -qF 'install -m 0644 /usr/share/mall/slurm/cli_filter.lua /etc/slurm/cli_filter.lua' "$here/slurm/site_slurm.sh" || absent+=("$line") ;;
    *) grep -qxF "$line" <<<"$guest" || absent+=("$line") ;;
  esac
done <<<"$quoted"
if [ "$(grep -c . <<<"$quoted")" -ge 8 ] && [ ${#absent[@]} -eq 0 ]; then
  pass "(7) the $(grep -c . <<<"$quoted") configuration lines the doc quotes for 24.11 are the site guest's ($(grep -c '^CliFilterPlugins=cli_filter/lua$' <<<"$quoted") CliFilterPlugins line)"
else
  fail "(7) the doc's 24.11 configuration is not the site guest's: not in tests/vm/site/slurm: ${absent[*]:-} (quoted: $(paste -sd'|' <<<"$quoted"))"
fi

[ "$failures" -eq 0 ] || { echo "test_recipe_tied.sh: $failures check(s) failed"; exit 1; }
echo "test_recipe_tied.sh: all checks passed"
