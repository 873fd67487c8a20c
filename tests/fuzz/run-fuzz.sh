#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-fuzz.sh — builds mall's libFuzzer targets in a clang tree (ASan + UBSan, UBSan halting) and
# runs each for a bounded time on a temporary copy of its committed seed corpus (the committed
# corpus never grows here). Prints one line per target (executions, exec/s, corpus, result) and
# exits non-zero on any crash, leak, timeout, out-of-memory, sanitizer report or broken invariant.
# Every build and run is bounded by tests/support/watchdog.sh; temporary folders are removed on exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=../support/watchdog.sh
source "$repo/tests/support/watchdog.sh"

usage() {
  cat <<EOF
NAME
    run-fuzz.sh - build and run mall's libFuzzer targets for a bounded time

SYNOPSIS
    tests/fuzz/run-fuzz.sh [--seconds N] [--build-dir DIR] [--keep-corpus DIR] [--no-build]
                           [--jobs N] [TARGET...] [-- LIBFUZZER-FLAG...]

DESCRIPTION
    Configures (CC=clang CXX=clang++, -DMALL_BUILD_FUZZERS=ON, Ninja) and builds the fuzz targets
    of tests/fuzz in a tree of their own, then runs each TARGET (default: all) for N seconds with
    libFuzzer, AddressSanitizer with leak detection, and UndefinedBehaviorSanitizer that stops at
    the first report. Each target starts from a copy of its committed seeds in
    tests/fuzz/corpus/TARGET/ (and tests/fuzz/dict/TARGET.dict when present); what it finds
    lives in a temporary folder that is removed at the end, so the committed corpus never grows.

    A target fails on a crash, a broken invariant (the targets check more than "no crash"), a
    leak, an input that runs over 10 s (-timeout), going over 2 GB (-rss_limit_mb), any sanitizer
    report, or when the watchdog has to stop it. The failing input is kept as
    DIR/fuzz-artifacts/TARGET/crash-<sha1> (or leak-, timeout-, oom-) and the report's end is
    printed with the command that reproduces it.

    One line per target:
        fuzz_cpuset_parse      PASS  executions 412345  exec/s 20617  corpus 22 -> 151  20 s

TARGETS
    fuzz_protocol_decode    proto::decode(), the wire packets malld and libmall read
    fuzz_cpuset_parse       CpuSet::parse(), cpu lists ("0-3,8")
    fuzz_state_file         load_state(), malld's state file (malld.state.json)
    fuzz_malleable_option   the Slurm option --malleable[=MIN[:MAX]][,weight=W]
    fuzz_plugstack_args     the Slurm plugin's plugstack.conf arguments
    fuzz_oci_annotations    mall-oci-hook's OCI state and io.mall.* annotations, within its limits
    Each tests/fuzz/fuzz_*.cpp is a target; each file says what it checks and its input format.

OPTIONS
    --seconds N
        Fuzz each target for N seconds (default 20). The watchdog stops a target after N + 120 s.
    --build-dir DIR
        The clang build tree (default <repo>/build-fuzz). It must not be a gcc tree.
    --keep-corpus DIR
        Fuzz in DIR/TARGET/ instead of a temporary copy and keep what is found there for the next
        run (the committed seeds are copied in first). For long runs; DIR is never the committed
        corpus, and nothing is added to git.
    --no-build
        Run the fuzzers already in DIR/bin without configuring or building.
    --jobs N
        Ninja's parallel jobs (default \$MALL_JOBS, else 2).
    -- LIBFUZZER-FLAG...
        Everything after -- goes to every fuzzer (e.g. -- -max_len=65552 -fork=2; prefer -fork
        to -jobs, whose fuzz-N.log files would land in the temporary folder and go with it).
    -h, --help
        This text.

ENVIRONMENT
    MALL_JOBS       default for --jobs.
    ASAN_OPTIONS, UBSAN_OPTIONS
        Added after this script's (detect_leaks=1, halt_on_error=1, ...), so they can override.

EXIT STATUS
    0 when every target ran its time without a finding; 1 when any target failed; 2 for a usage
    error, a missing corpus or a failed configure or build.

FILES
    tests/fuzz/corpus/TARGET/   committed seeds (small, meaningful inputs; add by hand)
    tests/fuzz/dict/TARGET.dict libFuzzer dictionaries (tokens of the input format)
    DIR/bin/TARGET              the fuzzer programs
    DIR/fuzz-artifacts/TARGET/  inputs that failed, for reproduction

EXAMPLES
    tests/fuzz/run-fuzz.sh                                  # every target, 20 s each (CI)
    tests/fuzz/run-fuzz.sh --seconds 600 fuzz_state_file    # one target, ten minutes
    tests/fuzz/run-fuzz.sh --seconds 3600 --keep-corpus ~/mall-fuzz -- -fork=2
    build-fuzz/bin/fuzz_protocol_decode build-fuzz/fuzz-artifacts/fuzz_protocol_decode/crash-<sha1>

SEE ALSO
    https://llvm.org/docs/LibFuzzer.html, docs/testing.md (section Fuzzing), tests/support/watchdog.sh
EOF
}

seconds=20
build="$repo/build-fuzz"
keep_corpus=""
do_build=1
jobs=${MALL_JOBS:-2}
targets=()
fuzzer_flags=()

die_usage() {
  echo "run-fuzz: $1 (see --help)" >&2
  exit 2
}
need_value() { if [ $# -lt 2 ] || [ -z "$2" ]; then die_usage "$1 needs a value"; fi; }

while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --seconds) need_value "$@"; seconds=$2; shift 2 ;;
    --seconds=*) seconds=${1#*=}; shift ;;
    --build-dir) need_value "$@"; build=$2; shift 2 ;;
    --build-dir=*) build=${1#*=}; shift ;;
    --keep-corpus) need_value "$@"; keep_corpus=$2; shift 2 ;;
    --keep-corpus=*) keep_corpus=${1#*=}; shift ;;
    --no-build) do_build=0; shift ;;
    --jobs) need_value "$@"; jobs=$2; shift 2 ;;
    --jobs=*) jobs=${1#*=}; shift ;;
    --) shift; fuzzer_flags=("$@"); break ;;
    -*) die_usage "unknown option $1" ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || die_usage "--seconds must be a whole number of seconds above 0, got '$seconds'"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die_usage "--jobs must be a whole number above 0, got '$jobs'"
# Every tests/fuzz/fuzz_*.cpp is a target.
all_targets=()
for src in "$here"/fuzz_*.cpp; do all_targets+=("$(basename "$src" .cpp)"); done
if [ ${#targets[@]} -eq 0 ]; then targets=("${all_targets[@]}"); fi
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || die_usage "unknown target '$t'; the targets are: ${all_targets[*]}"
  [ -d "$here/corpus/$t" ] || { echo "run-fuzz: no seed corpus at tests/fuzz/corpus/$t" >&2; exit 2; }
done

mkdir -p "$build"
build=$(cd "$build" && pwd)
if [ -n "$keep_corpus" ]; then
  mkdir -p "$keep_corpus"
  keep_corpus=$(cd "$keep_corpus" && pwd)
  [ "$keep_corpus" != "$here/corpus" ] || die_usage "--keep-corpus must not be the committed corpus $here/corpus"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/mall-fuzz.XXXXXX")
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

if [ $do_build -eq 1 ]; then
  if [ -f "$build/CMakeCache.txt" ] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang' "$build/CMakeCache.txt"; then
    echo "run-fuzz: $build was configured with another compiler than clang; remove it or pass --build-dir" >&2
    exit 2
  fi
  started=$(date +%s)
  # Only the fuzzers' sources are built; the options below also keep the configure short.
  # (CC and CXX count at a tree's first configure only; the check above covers later ones.)
  export CC=clang CXX=clang++
  if ! watchdog_run 600 cmake -G Ninja -S "$repo" -B "$build" \
         -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMALL_BUILD_FUZZERS=ON -DMALL_BUILD_TESTS=OFF \
         -DMALL_BUILD_EXAMPLES=OFF -DMALL_BUILD_BENCHMARKS=OFF -DMALL_WITH_SLURM=OFF \
         -DMALL_WITH_MPI=OFF -DMALL_WITH_TENSORFLOW=OFF -DMALL_WITH_LIBTORCH=OFF >"$work/configure.log" 2>&1; then
    cat "$work/configure.log" >&2
    echo "run-fuzz: configure failed (clang and its fuzzer runtime: Debian clang libclang-rt-14-dev)" >&2
    exit 2
  fi
  if ! watchdog_run 3600 ninja -C "$build" -j "$jobs" "${targets[@]}" >"$work/build.log" 2>&1; then
    cat "$work/build.log" >&2
    echo "run-fuzz: build failed" >&2
    exit 2
  fi
  echo "run-fuzz: built ${#targets[@]} target(s) in $build in $(( $(date +%s) - started )) s"
fi

# Sanitizers: leaks are findings, UBSan stops at the first report, reports carry stacks; the
# caller's own options come last and win.
symbolizer=$(command -v llvm-symbolizer || true)
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:symbolize=1${symbolizer:+:external_symbolizer_path=$symbolizer}${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# The state-file target writes its file under TMPDIR: ours, so it goes with the rest.
export TMPDIR="$work"

# fuzz_stat NAME LOG: a number from libFuzzer's -print_final_stats lines; without them (-fork
# mode) from its last progress line ("#N ... exec/s: R" or "#N: ... exec/s R"); "?" when absent.
fuzz_stat() {
  local value
  value=$(sed -n "s/^stat::$1: *\([0-9]*\).*/\1/p" "$2" | tail -1)
  if [ -z "$value" ]; then
    local last
    last=$(grep -E '^#[0-9]+' "$2" | tail -1)
    case "$1" in
      number_of_executed_units) value=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last") ;;
      average_exec_per_sec) value=$(sed -n 's/.*exec\/s:\{0,1\} \([0-9]*\).*/\1/p' <<<"$last") ;;
    esac
  fi
  echo "${value:-?}"
}
count_files() { find "$1" -maxdepth 1 -type f | wc -l; }

status=0
for t in "${targets[@]}"; do
  bin="$build/bin/$t"
  if [ ! -x "$bin" ]; then
    echo "run-fuzz: $bin is missing (build it, or drop --no-build)" >&2
    exit 2
  fi
  if [ -n "$keep_corpus" ]; then
    corpus="$keep_corpus/$t"
    mkdir -p "$corpus"
    cp -n "$here/corpus/$t"/* "$corpus"/ 2>/dev/null || true
  else
    corpus="$work/corpus/$t"
    mkdir -p "$corpus"
    cp "$here/corpus/$t"/* "$corpus"/
  fi
  artifacts="$build/fuzz-artifacts/$t"
  mkdir -p "$artifacts"
  dict=()
  [ -f "$here/dict/$t.dict" ] && dict=(-dict="$here/dict/$t.dict")
  before=$(count_files "$corpus")
  log="$work/$t.log"
  touch "$work/$t.start"
  rc=0
  # From inside the temporary folder: anything libFuzzer writes to its working folder goes too.
  (cd "$work" && watchdog_run $((seconds + 120)) "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -detect_leaks=1 -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" \
    ${fuzzer_flags[@]+"${fuzzer_flags[@]}"} "$corpus") >"$log" 2>&1 || rc=$?

  result=PASS
  if [ $rc -eq 124 ]; then
    result="FAIL (watchdog: still running after $((seconds + 120)) s)"
  elif grep -q 'ERROR: LeakSanitizer' "$log"; then
    result="FAIL (leak)"
  elif grep -q 'ERROR: libFuzzer: timeout' "$log"; then
    result="FAIL (timeout: one input ran over 10 s)"
  elif grep -qE 'ERROR: libFuzzer: (out-of-memory|malloc\(.*\) exceeds limit)' "$log"; then
    result="FAIL (out of memory)"
  elif grep -q '==mall-fuzz== invariant broken' "$log"; then
    result="FAIL (invariant broken)"
  elif grep -qE 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer)|runtime error:' "$log"; then
    result="FAIL (sanitizer report)"
  elif [ $rc -ne 0 ] || grep -qE 'ERROR: libFuzzer|^SUMMARY: ' "$log"; then
    result="FAIL (crash, exit status $rc)"
  fi
  printf '%-22s %-4s  executions %-9s exec/s %-7s corpus %s -> %s  %s s\n' "$t" "${result%% *}" \
    "$(fuzz_stat number_of_executed_units "$log")" "$(fuzz_stat average_exec_per_sec "$log")" "$before" \
    "$(count_files "$corpus")" "$seconds"
  if [ "$result" != PASS ]; then
    status=1
    echo "run-fuzz: $t: $result; the end of its output:"
    grep -vE '^#[0-9]+ ' "$log" | tail -40 | sed 's/^/    /'
    find "$artifacts" -type f -newer "$work/$t.start" | while read -r found; do
      echo "run-fuzz: $t: the input is $found; reproduce with:"
      echo "    $bin $found"
    done
  fi
done

if [ $status -eq 0 ]; then
  echo "run-fuzz: all ${#targets[@]} target(s) passed ($seconds s each)"
else
  echo "run-fuzz: FAILED" >&2
fi
exit $status
