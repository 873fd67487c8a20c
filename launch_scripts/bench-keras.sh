#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench-keras.sh — what mall gives Python Keras jobs (TensorFlow) that share a node: runs J copies
# of examples/keras_digits.py at once, three ways, one after the other, and prints each copy's
# training rate, the total throughput, the threads per core and the ratios:
#   default   every copy as TensorFlow starts it by default: it sees the whole node and sizes its
#             intra-op and inter-op pools to all the cpus (oversubscription)
#   confined  every copy under a private malld (mallrun --malleable=1:NCPU, policy equal or --policy), plain
#             Keras (--no-mall): malld confines it to its cores before it runs, so TensorFlow sizes
#             its pools to them and keeps them (confinement at start, not malleability)
#   mall      the same with mall's Keras callback (mall.keras.Malleable): TensorFlow's pools are
#             made as large as the node and parked to the job's share, released when it grows
# Then one copy alone, twice: "shrunk", started malleable on 2 cpus (pools of 2) and shrunk by
# `mallctl set --cpus 0` before its timed fit, against "small", started with one thread on one cpu;
# each one's rate and the cores it used (its cpu time over its fit's wall time).
# With --second-steps M the second copy trains M steps instead (fewer: it leaves early): the total
# then also shows what each way does with the cores the leaving copy frees.
# Last line: "mall_vs_default=X.XX mall_vs_confined=Y.YY shrunk_vs_small=Z.ZZ shrunk_cores=C.CC"
# (total images/s; the shrunk copy's rate over the small one's, and its cores). A benchmark, not a
# test: figures vary with the machine's load. Everything it starts (malld, copies, cgroups,
# temp folder) is removed at exit.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/launch_scripts/lib/stats.sh"  # median
build=${MALL_BUILD_DIR:-$repo/build}
venv=${MALL_TF_VENV:-$repo/.venv}
steps=8000
batch=128
hidden=128
model=mlp
jobs=2
repeat=1
second_steps=
policy=equal

usage() {
  cat <<EOF
bench-keras.sh — co-located Keras trainings: TensorFlow's defaults, confinement at start, and
mall's callback

Usage: launch_scripts/bench-keras.sh [--steps N] [--second-steps M] [--batch B] [--hidden H] [--model M]
                                     [--jobs J] [--repeat R] [--policy P]

Runs J copies of examples/keras_digits.py (a 64-H-10 MLP trained with model.fit on sklearn's
digits) at once, three ways:
  default   each copy sees the whole node; TensorFlow sizes its pools to every cpu
  confined  each copy runs as
              mallrun --socket S --malleable=1:NCPU --job kerasI -- python examples/keras_digits.py --no-mall
            under a private malld (policy equal, or --policy), which confines it to its share of the cores
            before it starts; TensorFlow sizes its pools to that share and keeps them fixed
  mall      the same without --no-mall: mall's Keras callback parks TensorFlow's own pools (made
            as large as the node) to the copy's share at each batch end, and releases them when
            it grows (when the other copy ends)

Options:
  --steps N    timed training steps per copy (default $steps), after 20 untimed warm-up steps;
               with the other defaults a step takes ~1 ms alone on two cores, and a run of
               two copies ~25 s here (~8 s of it TensorFlow's import)
  --second-steps M
               the second copy's timed steps (default: N). With M below N it leaves early, and
               the first copy trains on alone: TensorFlow's defaults and mall can then use the
               freed cores (mall releases the workers it parked), while a confined copy keeps
               the pools it started with, however many cpus malld gives it
  --batch B    images per step (default $batch)
  --hidden H   hidden units (default $hidden)
  --model M    keras_digits.py's --model: mlp, conv, gru or convnet (default $model). convnet
               is a step with idle time in it: two conv blocks with dropout, Adam, an accuracy
               metric and a validation pass every 50 steps (N and M multiples of 50), which
               leaves the cpus idle between kernels: Python, callbacks, metrics, tf.data
  --jobs J     copies run at once (default $jobs; at most the number of cpus)
  --repeat R   run the three ways R times, alternating, and report medians (default $repeat)
  --policy P   the private malld's policy: equal (default) or throughput (cores where a job's
               measured steps/s say they add the most: the callback reports each step; the
               confined way's copies report nothing, so malld has no rates for them)
  -h, --help   this text

Environment:
  MALL_BUILD_DIR  mall's build (default <repo>/build; malld, mallrun, mallctl built there if missing)
  MALL_TF_VENV    a Python venv with TensorFlow and Keras (default <repo>/.venv, which
                  launch_scripts/install-deps.sh makes)

Needs python3-sklearn's digits.csv.gz. As root with a cgroup-v1 cpuset hierarchy malld enforces
cores with cgroup cpusets (--backend auto); otherwise with thread affinity (it says so). TensorFlow
sees either as its affinity mask at start.

Each copy imports TensorFlow and runs 20 untimed warm-up steps; once all are ready, their timed
fits start together. Output, per run and copy: the cpus TensorFlow saw at start, its training rate
(images/s over its timed fit), its thread count and test accuracy. Per run:
  total       all copies' training images over the wall time from the timed fits' start to the
              last one's end (each copy times its steps 2..N: see keras_digits.py)
  makespan    wall time from launch to the last copy's end (imports and warm-up included)
  threads     the copies' threads (counted in /proc/PID/task after the fit) per cpu
  runnable    the copies' runnable threads (state R in /proc/PID/task/*/stat) per cpu, the mean
              of samples taken every 0.2 s from the start of the timed fits until one ends
Then one copy alone, R times each way, alternating (needs 2 cpus or more):
  shrunk      mallrun --malleable=1:2 with the callback, TensorFlow's pools made for 2 cpus, shrunk
              to cpu 0 by mallctl set before its timed fit (1 worker running, 1 parked per pool)
  small       taskset -c 0 ... --threads 1 --no-mall: TensorFlow started with one thread on one cpu
with each one's rate and the cores it used during its fit (cpu seconds / wall seconds).
Then a table of medians and
  mall_vs_default=X.XX mall_vs_confined=Y.YY shrunk_vs_small=Z.ZZ shrunk_cores=C.CC
Exit status: 0; 1 when something is missing or a copy fails; 2 for bad options.
EOF
}

while [ $# -gt 0 ]; do
  case $1 in
    --steps|--second-steps|--batch|--hidden|--model|--jobs|--repeat|--policy)
      [ $# -ge 2 ] || { echo "bench-keras.sh: $1 needs a value (see --help)" >&2; exit 2; }
      name=${1#--}; printf -v "${name//-/_}" '%s' "$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-keras.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
ncpu=$(nproc)
second_steps=${second_steps:-$steps}
for v in steps second_steps batch hidden jobs repeat; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench-keras.sh: --${v//_/-} must be a positive integer" >&2; exit 2; }
done
case $model in mlp|conv|gru|convnet) ;; *) echo "bench-keras.sh: --model takes mlp, conv, gru or convnet (got '$model')" >&2; exit 2 ;; esac
if [ "$model" = convnet ] && { [ $((steps % 50)) -ne 0 ] || [ $((second_steps % 50)) -ne 0 ]; }; then
  echo "bench-keras.sh: --model convnet validates every 50 steps: --steps and --second-steps must be multiples of 50" >&2
  exit 2
fi
case $policy in equal|throughput) ;; *) echo "bench-keras.sh: --policy takes equal or throughput (got '$policy')" >&2; exit 2 ;; esac
if [ "$jobs" -gt "$ncpu" ]; then
  echo "bench-keras.sh: --jobs $jobs is more than the $ncpu cpus (each copy needs at least one core under mall)" >&2
  exit 2
fi

python=$venv/bin/python
if [ ! -x "$python" ] || ! "$python" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("tensorflow") and u.find_spec("keras")))' 2>/dev/null; then
  echo "bench-keras.sh: no TensorFlow with Keras in $venv (MALL_TF_VENV): run launch_scripts/install-deps.sh," >&2
  echo "  which installs launch_scripts/requirements-tensorflow.txt into <repo>/.venv, or point MALL_TF_VENV at a venv that has it" >&2
  exit 1
fi

for program in bin/malld bin/mallrun bin/mallctl lib/libmall_tf_ops.so; do
  if [ ! -e "$build/$program" ]; then
    echo "bench-keras.sh: building ($build)"
    [ -f "$build/build.ninja" ] || cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    ninja -C "$build" -j2 malld mallrun mallctl mall_tf_ops >/dev/null ||
      { echo "bench-keras.sh: the build failed (mall_tf_ops needs TensorFlow: launch_scripts/install-deps.sh)" >&2; exit 1; }
    break
  fi
done
bin=$build/bin
# mall's Python package and libraries from this checkout and build, for the mall way's callback.
export PYTHONPATH=$repo/python${PYTHONPATH:+:$PYTHONPATH} MALL_LIBRARY=$build/lib/libmall.so.0 \
       MALL_TF_OPS_LIBRARY=$build/lib/libmall_tf_ops.so

tmp=$(mktemp -d /tmp/mall-bench-keras.XXXXXX)
malld_pid=
cleanup() {
  local pid child
  local -a ours=()
  # The copies (python, or mallrun with python as its child) and the sampler, but not malld yet:
  # it removes a job's cgroup only once the job's processes have ended.
  for pid in $(jobs -p); do
    [ "$pid" = "$malld_pid" ] && continue
    ours+=("$pid")
    for child in $(pgrep -P "$pid" || true); do ours+=("$child"); done
  done
  if [ "${#ours[@]}" -gt 0 ]; then
    kill "${ours[@]}" 2>/dev/null || true
    for _ in $(seq 50); do  # at most 5 s
      kill -0 "${ours[@]}" 2>/dev/null || break
      sleep 0.1
    done
  fi
  if [ -n "$malld_pid" ]; then
    kill -TERM "$malld_pid" 2>/dev/null || true
    wait "$malld_pid" 2>/dev/null || true
  fi
  # Our own cgroup folder, should malld have left it (rmdir removes only empty cgroups).
  local parent=/sys/fs/cgroup/cpuset/mall_bench_keras$$
  if [ -d "$parent" ]; then
    rmdir "$parent"/job_* "$parent" 2>/dev/null || echo "bench-keras.sh: could not remove $parent" >&2
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

train=("$python" "$repo/examples/keras_digits.py" --batch "$batch" --hidden "$hidden" --model "$model"
       --go-file "$tmp/go")
# The timed steps of copy $1: --second-steps for the second, --steps for the others.
copy_steps() { if [ "$1" = 1 ]; then echo "$second_steps"; else echo "$steps"; fi; }

# Starts the timed fits together: once every copy has printed "ready" (imported TensorFlow and
# warmed up), creates $tmp/go, which they wait for. Then samples the copies' runnable threads every
# 0.2 s until one of them ends its fit; appends one "<runnable threads>" line per sample to
# $tmp/samples. Arguments: the copies' launched pids. When a copy ends before it is ready, it
# creates go at once (the others then end too, and run_copies reports the failure).
start_and_sample() {
  local i line state
  local -a launched=("$@") pids=()
  for ((i = 0; i < jobs; i++)); do
    until grep -q '^ready$' "$tmp/job$i.out" 2>/dev/null; do
      state=$(sed -n 's/.*) \([A-Za-z]\) .*/\1/p' "/proc/${launched[$i]}/stat" 2>/dev/null) || true
      if [ -z "$state" ] || [ "$state" = Z ]; then touch "$tmp/go"; return 0; fi
      sleep 0.05
    done
    line=$(grep -m1 '^start pid ' "$tmp/job$i.out")
    pids+=("$(awk '{print $3}' <<<"$line")")
  done
  touch "$tmp/go"
  while sleep 0.2; do
    for ((i = 0; i < jobs; i++)); do
      grep -q '^fit ' "$tmp/job$i.out" && return 0  # a copy has finished: the overlap is over
    done
    # The state is the first field after the ")" that closes the thread's name.
    for i in "${pids[@]}"; do cat /proc/"$i"/task/*/stat 2>/dev/null || true; done |
      sed -n 's/.*) \([A-Za-z]\) .*/\1/p' | grep -c '^R$' >> "$tmp/samples" || true
  done
}

# Starts the copies at once with the command that "$1 <index>" puts in the array command (in this shell, so that
# cleanup finds them), waits for all, appends one line per copy to $tmp/copies and sets
# total_rate (images/s), makespan (s), threads_per_cpu, runnable_per_cpu and samples.
run_copies() {
  local make_command=$1 i start end sampler
  local -a pids=()
  rm -f "$tmp"/job*.out "$tmp"/job*.err "$tmp/samples" "$tmp/copies" "$tmp/go"
  touch "$tmp/samples"
  start=$(date +%s.%N)
  for ((i = 0; i < jobs; i++)); do
    "$make_command" "$i"
    "${command[@]}" > "$tmp/job$i.out" 2> "$tmp/job$i.err" &
    pids+=($!)
  done
  start_and_sample "${pids[@]}" &
  sampler=$!
  for ((i = 0; i < jobs; i++)); do
    if ! wait "${pids[$i]}"; then
      echo "bench-keras.sh: copy $i failed:" >&2
      cat "$tmp/job$i.err" >&2
      exit 1
    fi
  done
  end=$(date +%s.%N)
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  local first=0 last=0 threads=0 images=0 n line fit cpus rate k names accuracy
  for ((i = 0; i < jobs; i++)); do
    line=$(grep '^done ' "$tmp/job$i.out") || { echo "bench-keras.sh: copy $i printed no done line:" >&2; cat "$tmp/job$i.err" >&2; exit 1; }
    fit=$(grep '^fit ' "$tmp/job$i.out")
    cpus=$(grep -m1 '^start pid ' "$tmp/job$i.out" | awk '{print $5}')
    rate=$(awk '{print $7}' <<<"$line")
    k=$(awk '{print $13}' <<<"$line")
    names=$(grep '^thread_names ' "$tmp/job$i.out" | cut -d' ' -f2)
    accuracy=$(grep '^final ' "$tmp/job$i.out" | awk '{print $7}')
    printf '    copy %d  cpus at start %-5s %9.1f images/s  threads %2d (%s)  accuracy %s\n' \
      "$i" "$cpus" "$rate" "$k" "$names" "$accuracy" >> "$tmp/copies"
    threads=$((threads + k))
    n=$(copy_steps "$i")
    images=$((images + (n > 1 ? n - 1 : 1) * batch))
    first=$(awk -v a="$first" -v b="$(awk '{print $3}' <<<"$fit")" 'BEGIN {print (a == 0 || b < a) ? b : a}')
    last=$(awk -v a="$last" -v b="$(awk '{print $5}' <<<"$fit")" 'BEGIN {print (b > a) ? b : a}')
  done
  total_rate=$(awk -v images="$images" -v f="$first" -v l="$last" 'BEGIN {printf "%.1f", images / (l - f)}')
  makespan=$(awk -v s="$start" -v e="$end" 'BEGIN {printf "%.3f", e - s}')
  threads_per_cpu=$(awk -v t="$threads" -v n="$ncpu" 'BEGIN {printf "%.2f", t / n}')
  runnable_per_cpu=$(awk -v n="$ncpu" '{s += $1; c++} END {if (c) printf "%.2f", s / c / n; else print "n/a"}' "$tmp/samples")
  samples=$(wc -l < "$tmp/samples")
}

command=()
default_command() { command=("${train[@]}" --steps "$(copy_steps "$1")"); }
confined_command() { command=("$bin/mallrun" --socket "$tmp/malld.sock" --malleable="1:$ncpu" --job "keras$1" -- "${train[@]}" --steps "$(copy_steps "$1")" --no-mall); }
mall_command() { command=("$bin/mallrun" --socket "$tmp/malld.sock" --malleable="1:$ncpu" --job "keras$1" -- "${train[@]}" --steps "$(copy_steps "$1")"); }

backend=affinity
[ "$(id -u)" -eq 0 ] && [ -d /sys/fs/cgroup/cpuset ] && backend=auto
"$bin/malld" --socket "$tmp/malld.sock" --state-dir "$tmp" --cgroup-parent "mall_bench_keras$$" \
  --backend "$backend" --policy "$policy" --log-level warn 2> "$tmp/malld.log" &
malld_pid=$!
for _ in $(seq 100); do
  "$bin/mallctl" --socket "$tmp/malld.sock" status > "$tmp/status" 2>&1 && break
  kill -0 "$malld_pid" 2>/dev/null || { echo "bench-keras.sh: malld exited:" >&2; cat "$tmp/malld.log" >&2; exit 1; }
  sleep 0.1
done
[ "$backend" = affinity ] && echo "bench-keras.sh: not root (or no cpuset controller): malld enforces with thread affinity"

tf_version=$("$python" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))' 2>/dev/null ||
             "$python" -c 'import importlib.metadata as m; print(m.version("tensorflow"))' 2>/dev/null || echo '?')
steps_text="$steps steps"
[ "$jobs" -ge 2 ] && [ "$second_steps" != "$steps" ] && steps_text="$steps steps (the second copy $second_steps)"
echo "bench-keras.sh: $jobs copies of keras_digits.py (model $model, $steps_text of $batch images, $hidden hidden units)," \
  "TensorFlow $tf_version, $ncpu cpus, $repeat round(s), malld backend $(awk '$1 == "BACKEND" {print $2}' "$tmp/status"), policy $policy"
declare -A results
for ((round = 1; round <= repeat; round++)); do
  for way in default confined mall; do
    echo "  round $round $way:"
    run_copies "${way}_command"
    cat "$tmp/copies"
    printf '    total %9.1f images/s  makespan %7.3f s  threads/cpu %5.2f  runnable/cpu %s (%d samples)\n' \
      "$total_rate" "$makespan" "$threads_per_cpu" "$runnable_per_cpu" "$samples"
    results[$way]+="$total_rate "
  done
done

# One copy alone, for the shrunk/small comparison: "$@" is its command; with "shrink" as $1 (then
# the command), sets its job to cpu 0 once it is ready and waits for its resize line. Sets
# single_rate (images/s) and single_cores (cpu seconds / wall seconds of its timed fit).
run_single() {
  local shrink=0 pid line fit
  if [ "$1" = shrink ]; then shrink=1; shift; fi
  rm -f "$tmp/single.out" "$tmp/single.err" "$tmp/go"
  "$@" > "$tmp/single.out" 2> "$tmp/single.err" &
  pid=$!
  until grep -q '^ready$' "$tmp/single.out" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "bench-keras.sh: the single copy failed:" >&2; cat "$tmp/single.err" >&2; exit 1; }
    sleep 0.05
  done
  if [ "$shrink" = 1 ]; then
    "$bin/mallctl" --socket "$tmp/malld.sock" set shrunk --cpus 0 > /dev/null
    for _ in $(seq 600); do  # at most 60 s: it applies the change while it waits for the go file
      grep -q '^resize .* -> 1 cpus 0$' "$tmp/single.out" && break
      sleep 0.1
    done
    grep -q '^resize .* -> 1 cpus 0$' "$tmp/single.out" ||
      { echo "bench-keras.sh: the shrunk copy never applied cpus 0:" >&2; cat "$tmp/single.out" "$tmp/single.err" >&2; exit 1; }
  fi
  touch "$tmp/go"
  wait "$pid" || { echo "bench-keras.sh: the single copy failed:" >&2; cat "$tmp/single.err" >&2; exit 1; }
  line=$(grep '^done ' "$tmp/single.out")
  fit=$(grep '^fit ' "$tmp/single.out")
  single_rate=$(awk '{print $7}' <<<"$line")
  single_cores=$(awk '{printf "%.2f", $7 / ($5 - $3)}' <<<"$fit")
}

declare -A single
if [ "$ncpu" -ge 2 ]; then
  for ((round = 1; round <= repeat; round++)); do
    run_single shrink "$bin/mallrun" --socket "$tmp/malld.sock" --malleable=1:2 --job shrunk -- "${train[@]}" --steps "$steps" --log-changes
    printf '  round %d shrunk: %9.1f images/s  cores %s\n' "$round" "$single_rate" "$single_cores"
    single[shrunk_rate]+="$single_rate " single[shrunk_cores]+="$single_cores "
    run_single taskset -c 0 "${train[@]}" --steps "$steps" --threads 1 --no-mall
    printf '  round %d small:  %9.1f images/s  cores %s\n' "$round" "$single_rate" "$single_cores"
    single[small_rate]+="$single_rate " single[small_cores]+="$single_cores "
  done
fi

default=$(median <<<"${results[default]}")
confined=$(median <<<"${results[confined]}")
mall=$(median <<<"${results[mall]}")
printf '\n%-10s %14s\n' way "images/s (median)"
printf '%-10s %14.1f\n' default "$default" confined "$confined" mall "$mall"
shrunk_vs_small=n/a shrunk_cores=n/a
if [ "$ncpu" -ge 2 ]; then
  shrunk_rate=$(median <<<"${single[shrunk_rate]}") small_rate=$(median <<<"${single[small_rate]}")
  shrunk_cores=$(printf '%.2f' "$(median <<<"${single[shrunk_cores]}")")
  printf '%-10s %14.1f  cores %.2f\n' shrunk "$shrunk_rate" "$shrunk_cores" small "$small_rate" "$(median <<<"${single[small_cores]}")"
  shrunk_vs_small=$(awk -v a="$shrunk_rate" -v b="$small_rate" 'BEGIN {printf "%.2f", a / b}')
fi
awk -v m="$mall" -v d="$default" -v c="$confined" -v s="$shrunk_vs_small" -v k="$shrunk_cores" \
  'BEGIN {printf "mall_vs_default=%.2f mall_vs_confined=%.2f shrunk_vs_small=%s shrunk_cores=%s\n", m / d, m / c, s, k}'
