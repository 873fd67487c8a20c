#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-tours.sh — the docs run: a code block of README.md or docs/*.md marked with the line
#   <!-- tour: NAME [needs="WORD ..."] [expect="TEXT"] [timeout=SECONDS] -->
# right before its ```sh/```bash fence is a tour, and `run-tours.sh REPO BUILD NAME` runs the one
# named NAME exactly as written, alone, in a fresh shell: `env -i` with a minimal PATH, HOME and
# TMPDIR in a temporary folder of its own, `bash -euo pipefail`, its own session, in the checkout
# REPO (as the tours say; BUILD must be REPO/build, run-tests.sh's tree, else exit 77).
# It fails when the block is missing or not a sh/bash fence, when a command fails (a flag that
# changed, a path that moved, a tour that needs another's set-up), when the output lacks the
# marker's expect="TEXT", when it runs past its timeout (default 120 s: TERM to its session, KILL
# 10 s later), or when a process of its session still runs 5 s after its shell ended (a reader's
# shell would keep it). Every process of the session is ended and the folder removed at the end. needs= words the
# machine must give, else exit 77 (ctest: Skipped) with the reason: root, podman, slurm (slurmd and
# BUILD/lib/mall_spank.so), venv (REPO/.venv's python imports tensorflow), tf-ops
# (BUILD/lib/libmall_tf_ops.so). Prints the tour, its output, and PASS/FAIL with the seconds it took.
# `run-tours.sh REPO BUILD --list` prints the tours' names (one a line) and where they are.
set -uo pipefail

if [ $# -ne 3 ] || [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then
  echo "usage: tests/docs/run-tours.sh REPO BUILD NAME|--list   (the file's header says the rest)" >&2
  exit 2
fi
repo=$(cd "$1" && pwd) build=$(cd "$2" && pwd) name=$3

# Prints "FILE:LINE<TAB>NAME<TAB>MARKER" for each tour marker of README.md and docs/*.md.
list_tours() {
  local f
  for f in "$repo/README.md" "$repo"/docs/*.md; do
    grep -n '^<!-- tour: ' "$f" | while IFS= read -r hit; do
      local line=${hit%%:*} marker=${hit#*:} tour_name
      tour_name=$(sed -E 's/^<!-- tour: ([A-Za-z0-9_.-]+).*/\1/' <<<"$marker")
      printf '%s:%s\t%s\t%s\n' "${f#"$repo"/}" "$line" "$tour_name" "$marker"
    done
  done
}

if [ "$name" = --list ]; then list_tours | cut -f1,2; exit 0; fi
if [ "$build" != "$repo/build" ]; then
  echo "SKIP: the tours use the checkout's build/ (run-tests.sh's tree); this tree is $build"; exit 77
fi

found=$(list_tours | awk -F'\t' -v n="$name" '$2 == n')
if [ -z "$found" ]; then echo "FAIL: no '<!-- tour: $name ... -->' marker in README.md or docs/*.md"; exit 1; fi
if [ "$(wc -l <<<"$found")" -ne 1 ]; then echo "FAIL: tour '$name' is marked twice:"; echo "$found"; exit 1; fi
where=$(cut -f1 <<<"$found") marker=$(cut -f3 <<<"$found")
file=$repo/${where%%:*} line=${where##*:}
attr() { sed -nE "s/.* $1=\"([^\"]*)\".*/\1/p" <<<"$marker"; }
needs=$(attr needs) expect=$(attr expect)
limit=$(sed -nE 's/.* timeout=([0-9]+).*/\1/p' <<<"$marker"); limit=${limit:-120}

# The block: the fence must be the marker's next line.
fence=$(sed -n "$((line + 1))p" "$file")
case $fence in
  '```sh'|'```bash') ;;
  *) echo "FAIL: $where: the line after the tour marker must open a \`\`\`sh or \`\`\`bash block (it is: $fence)"; exit 1 ;;
esac
script=$(awk -v start=$((line + 2)) 'NR >= start { if ($0 ~ /^```/) exit; print }' "$file")

for need in $needs; do
  why=""
  case $need in
    root) [ "$(id -u)" = 0 ] || why="not root" ;;
    podman) command -v podman >/dev/null || why="podman is not installed (launch_scripts/install-deps.sh)" ;;
    slurm) { command -v slurmd >/dev/null && [ -f "$build/lib/mall_spank.so" ]; } ||
             why="no slurmd or no $build/lib/mall_spank.so (libslurm-dev: launch_scripts/install-deps.sh)" ;;
    venv) "$repo/.venv/bin/python" -c 'import importlib.util as u, sys; sys.exit(not u.find_spec("tensorflow"))' \
            >/dev/null 2>&1 ||
            why="no $repo/.venv with TensorFlow (launch_scripts/install-deps.sh makes it)" ;;
    tf-ops) [ -f "$build/lib/libmall_tf_ops.so" ] || why="no $build/lib/libmall_tf_ops.so (a build without TensorFlow)" ;;
    *) echo "FAIL: $where: unknown needs word '$need'"; exit 1 ;;
  esac
  if [ -n "$why" ]; then echo "SKIP: tour $name ($where): $why"; exit 77; fi
done

work=$(mktemp -d /tmp/tourXXXX)
tour_pid=""
session_pids() { ps -e -o pid=,sid= | awk -v s="$tour_pid" '$2 == s { print $1 }'; }
# Gives the processes still in the tour's session GRACE tenths of a second to end by themselves
# (a malld the tour sent SIGTERM stops in a few ms), ends the rest (TERM, then KILL) and prints
# how many it had to end.
end_session() {
  [ -n "$tour_pid" ] || { echo 0; return; }
  local left grace=${1:-0}
  for _ in $(seq "$grace"); do [ -n "$(session_pids)" ] || break; sleep 0.1; done
  left=$(session_pids)
  if [ -n "$left" ]; then
    kill -TERM $left 2>/dev/null
    for _ in $(seq 50); do
      ps -e -o sid= | grep -qx " *$tour_pid" || break
      sleep 0.1
    done
    kill -KILL $(session_pids) 2>/dev/null
  fi
  wc -w <<<"$left"
}
cleanup() { end_session >/dev/null; rm -rf "$work"; }
trap cleanup EXIT
trap 'echo "FAIL: tour $name: run-tours.sh was terminated"; exit 1' TERM INT

# HOME and TMPDIR are a folder of the test's own; TMPDIR is that folder itself, like /tmp: mode
# 1777 (daemons that drop root, munged's user, must reach what the tour makes there) and a short
# path (podman refuses a --runroot over 50 characters; the container kit puts its runroot 35
# characters below TMPDIR). The tour runs in the checkout itself, as its text says: a copy or a
# folder of links would not do, since the demos mount the checkout into containers.
mkdir -p "$work/home"
chmod 1777 "$work"
printf '%s\n' "$script" >"$work/tour.sh"

echo "== tour $name ($where; needs: ${needs:-nothing}; timeout $limit s)"
sed 's/^/   | /' "$work/tour.sh"
start=$(date +%s%N)
(cd "$repo" &&
   exec setsid env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
     HOME="$work/home" TMPDIR="$work" LANG=C.UTF-8 TERM=dumb \
     bash -euo pipefail "$work/tour.sh" </dev/null >"$work/output" 2>&1) &
tour_pid=$!
rc=""
for _ in $(seq $((limit * 10))); do
  if ! kill -0 "$tour_pid" 2>/dev/null; then break; fi
  sleep 0.1
done
if kill -0 "$tour_pid" 2>/dev/null; then
  kill -TERM -- "-$tour_pid" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$tour_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$tour_pid" 2>/dev/null
  rc=timeout
fi
wait "$tour_pid"; status=$?
seconds=$(( ($(date +%s%N) - start) / 1000000 ))
seconds=$((seconds / 1000)).$(printf '%03d' $((seconds % 1000)))
left=$(end_session 50)
echo "== its output"
sed 's/^/   > /' "$work/output"

fail=()
[ "$rc" = timeout ] && fail+=("still running after $limit s (its session was terminated)")
[ "$rc" != timeout ] && [ "$status" -ne 0 ] && fail+=("a command failed: the tour's shell exited $status")
[ -n "$expect" ] && ! grep -qF -- "$expect" "$work/output" && fail+=("its output lacks \"$expect\"")
[ "$left" -gt 0 ] && fail+=("it left $left process(es) of its session running (ended now)")
if [ ${#fail[@]} -gt 0 ]; then
  for f in "${fail[@]}"; do echo "FAIL: tour $name ($where): $f"; done
  echo "(the tour took $seconds s)"
  exit 1
fi
echo "PASS: tour $name ($where) in $seconds s"
