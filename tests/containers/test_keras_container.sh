#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_keras_container.sh — ctest containers.keras: a Keras model.fit (examples/keras_digits.py with
# mall.keras.Malleable, TensorFlow's pools parked through libmall_tf_ops.so) inside a podman
# container follows `mallctl set` from the host, checked as a user sees it. The container is the
# kit's tiny rootfs with the host's /usr; the venv (TensorFlow's wheel), the checkout's python/ and
# examples/ and the build's bin/ and lib/ are mounted read-only at the same paths. Twice:
#   1. started with `mallrun --container --malleable=1:N -- podman run --rm ...` (mallrun mounts the
#      socket folder and sets MALL_SOCKET/MALL_JOB_ID);
#   2. started with plain `podman run --rm --annotation io.mall.malleable=1:N` through the OCI hook
#      (the shipped launch_scripts/examples/mall-hooks.d files and containers.conf.mall lines: the
#      socket folder and MALL_SOCKET, no MALL_JOB_ID: libmall finds the job by its cgroup).
# Each time, once the timed fit runs:
#   - `mallctl set JOB --cpus C` (C: the pool's first cpu): the job's output shows
#     "resize step N threads A -> 1 cpus C", every thread of the python process read from the host
#     (/proc/PID/task/*/status Cpus_allowed_list) is on C, and the "parked step N tids ..." line lists
#     tids, each a thread of that python process (container tids, through NSpid on the host);
#   - `mallctl set JOB --cpus auto`: "resize step M threads 1 -> N cpus POOL", every thread back on
#     the pool, nothing parked, and a later step line runs N threads on POOL;
#   - the fit ends: the container exits 0 ("done" and "final" lines), the job is gone from malld.
# Then malld stops, its cgroup folders are gone and the kit's leak check finds nothing.
# Exit 0 pass, 1 fail, 2 usage, 77 skip (not root, or podman not installed: printed, and logged to
# $MALL_TEST_SKIP_LOG). --help for the manual.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=container_kit.sh
. "$here/container_kit.sh"

usage() {
  cat <<'EOF'
NAME
    test_keras_container.sh - a Keras training in a podman container follows mallctl set
    (ctest containers.keras, label containers)

SYNOPSIS
    test_keras_container.sh --bin-dir DIR --python PY --tf-ops LIB [--library LIB] [--steps N]
                            [--timeout SECONDS]
    test_keras_container.sh --help

DESCRIPTION
    Starts a private malld (cgroup backend, a unique --cgroup-parent) on a socket in the container
    kit's folder, installs the shipped OCI hook files in the kit's private podman, and runs
    examples/keras_digits.py --log-changes in a podman container twice: through `mallrun
    --container` and through the OCI hook (--annotation io.mall.malleable=1:N). While the timed fit
    runs it moves the job to one cpu and back with mallctl set and checks the job's resize and
    parked lines, every thread's Cpus_allowed_list of the python process seen from the host, the
    parked tids against that process's threads, and that the container exits 0. The venv of PY
    (or PY's prefix), the checkout's python/ and examples/, DIR and the library folders are
    mounted read-only at the same paths. Every step is bounded by a watchdog; timings are printed.

OPTIONS
    --bin-dir DIR     the build's runtime output folder: malld, mallctl, mallrun, mall-oci-hook
    --python PY       a Python with TensorFlow's wheel (CMake's MALL_TENSORFLOW_PYTHON)
    --tf-ops LIB      mall's TensorFlow op library, libmall_tf_ops.so (MALL_TF_OPS_LIBRARY inside)
    --library LIB     libmall.so (MALL_LIBRARY inside; default DIR/../lib/libmall.so.0)
    --steps N         timed steps of each fit (default 4000: ~6 s on 2 cpus; the moves take ~1 s)
    --timeout S       the whole run's watchdog (default 240)

EXIT STATUS
    0 every check passed; 1 a check failed (FAIL lines say which); 2 usage; 77 skipped: not root,
    or podman (or runc, conmon) is not installed.
EOF
}

bin="" py="" tf_ops="" lib="" steps=4000 timeout_s=240
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    --python) py=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    --tf-ops) tf_ops=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    --library) lib=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    --steps) steps=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    --timeout) timeout_s=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    -h|--help) usage; exit 0 ;;
    *) echo "test_keras_container.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$bin" ] && [ -n "$py" ] && [ -n "$tf_ops" ] ||
  { echo "test_keras_container.sh: --bin-dir, --python and --tf-ops are required" >&2; usage >&2; exit 2; }
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "test_keras_container.sh: --steps takes a positive number" >&2; exit 2; }
watchdog_script "$timeout_s" --bin-dir "$bin" --python "$py" --tf-ops "$tf_ops" ${lib:+--library "$lib"} \
  --steps "$steps" --timeout "$timeout_s"
export CTR_STEP_TIMEOUT_S=${CTR_STEP_TIMEOUT_S:-30}

ctr_test_reporting containers.keras   # pass, fail, note, skip
t_start=$(ctr__now_ms)
skip_all() { skip "$1"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip_all "needs root (cgroup folders, malld's cgroup backend, podman as root); run as root"
ctr_have podman || skip_all "$CTR_WHY"
for p in malld mallctl mallrun mall-oci-hook; do
  [ -x "$bin/$p" ] || { fail "$bin/$p is missing: build it first"; exit 1; }
done
bin=$(cd "$bin" && pwd)
[ -n "$lib" ] || lib=$bin/../lib/libmall.so.0
for f in "$lib" "$tf_ops"; do [ -f "$f" ] || { fail "$f is missing: build mall and mall_tf_ops first"; exit 1; }; done
lib=$(realpath -s "$lib") tf_ops=$(realpath -s "$tf_ops")
command -v jq >/dev/null || { fail "jq is not installed (launch_scripts/install-deps.sh installs it)"; exit 1; }
[ -x "$py" ] || { fail "no Python at $py (CMake's MALL_TENSORFLOW_PYTHON)"; exit 1; }
"$py" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("tensorflow") and u.find_spec("keras")))' ||
  { fail "$py cannot import tensorflow and keras (launch_scripts/install-deps.sh makes the venv)"; exit 1; }
# What the container must see: the venv (a venv's python is a link into /usr, which the kit
# mounts; its pyvenv.cfg and site-packages are beside bin/), or the folder PY lives in.
py_dir=$(dirname "$(realpath -s "$py")")
venv=$py_dir
[ -f "$py_dir/../pyvenv.cfg" ] && venv=$(cd "$py_dir/.." && pwd)
trainer=$repo/examples/keras_digits.py

ctr_sweep
ctr_init keras || { fail "ctr_init"; exit 1; }
sock=$CTR_DIR/sock/malld.sock
hook_log=$CTR_DIR/hook.log
mparent=${CTR_CGROUP#/}-malld   # malld's --cgroup-parent: one name, unique to this run
mparent_dirs() { ctr_malld_parent_dirs "$mparent"; }
remove_mparent() { ctr_malld_parent_remove "$mparent"; }
run_pid=""
cleanup() {
  trap - EXIT
  [ -n "$run_pid" ] && kill -TERM "$run_pid" 2>/dev/null
  ctr_malld_stop
  ctr_cleanup
  remove_mparent
}
trap cleanup EXIT
trap 'watchdog_fired "$timeout_s"; exit 1' TERM
trap 'echo "FAIL: interrupted"; exit 130' INT
note "kit folder $CTR_DIR, cgroup $CTR_CGROUP, malld's --cgroup-parent $mparent; venv $venv"

# ---- helpers -------------------------------------------------------------------------------------
mstatus() { ctr_malld_status "$bin" "$sock"; }
job_json() { mstatus | jq -c --arg j "$1" '.jobs[] | select(.job == $j)'; }
job_absent() { mstatus >/dev/null && [ -z "$(job_json "$1")" ]; }
job_attached() { [ "$(job_json "$1" | jq -r '.attached // 0')" -ge 1 ] 2>/dev/null; }
host_masks() { # the distinct Cpus_allowed_list of PID's threads, comma-joined
  local t
  for t in /proc/"$1"/task/*; do sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$t/status" 2>/dev/null; done | sort -u | paste -sd, -
}
masks_are() { [ "$(host_masks "$1")" = "$2" ]; }
ctr_tids() { # PID's threads as the container numbers them (the last NSpid field of each), one a line
  local t
  for t in /proc/"$1"/task/*; do awk '/^NSpid:/ { print $NF }' "$t/status" 2>/dev/null; done | sort -n
}
has_line() { grep -qE "$2" "$1"; }   # has_line FILE REGEX
line_after() { # line_after FILE N REGEX: a line matching REGEX after the first N lines
  tail -n +"$(( $2 + 1 ))" "$1" | grep -qE "$3"
}
times=()

# ---- a private malld, and the shipped OCI hook files in the kit's private podman -------------------
ctr_malld_start "$bin" "$sock" --cgroup-parent "$mparent" --log-level info || { fail "private malld (log above)"; exit 1; }
backend=$(mstatus | jq -r .backend) pool=$(mstatus | jq -r .pool)
case $backend in
  cgroup-v1|cgroup-v2) pass "private malld answers on $sock (backend $backend, pool $pool)" ;;
  *) fail "malld chose backend '$backend': a container job needs cgroup-v1 or cgroup-v2"; exit 1 ;;
esac
npool=$(ctr__cpulist_expand "$pool" | wc -l)
first=$(ctr__cpulist_expand "$pool" | head -n 1)
[ "$npool" -ge 2 ] || skip_all "malld's pool ($pool) has one cpu: nothing can move"

ctr_podman version >/dev/null || { fail "podman version (private podman setup)"; exit 1; }
examples=$repo/launch_scripts/examples
for f in "$examples"/mall-hooks.d/*.json; do
  sed -e "s#\"/usr/local/bin/mall-oci-hook\"#\"$bin/mall-oci-hook\"#" \
      -e "s#\"--socket\", \"/run/mall/malld.sock\"#\"--log\", \"$hook_log\", \"--socket\", \"$sock\"#" \
      "$f" >"$CTR_DIR/podman/hooks.d/$(basename "$f")"
  grep -qF "$sock" "$CTR_DIR/podman/hooks.d/$(basename "$f")" ||
    { fail "$f: its --socket is not the one this test rewrites (/run/mall/malld.sock)"; exit 1; }
done
# containers.conf(5): the shipped [containers] lines (socket folder and MALL_SOCKET), made private.
# mallrun --container adds the same mount and variables itself (and MALL_JOB_ID).
conf_lines=$(grep -E '^(volumes|env) *=' "$examples/containers.conf.mall" | sed "s#/run/mall#$CTR_DIR/sock#g")
awk -v lines="$conf_lines" '{ print } /^\[containers\]$/ { print lines }' "$CTR_DIR/podman/containers.conf" >"$CTR_DIR/podman/containers.conf.new" &&
  mv "$CTR_DIR/podman/containers.conf.new" "$CTR_DIR/podman/containers.conf"

ctr_bind_ro "$bin" "$(dirname "$lib")" "$repo/python" "$repo/examples" "$venv" || { fail "ctr_bind_ro"; exit 1; }
[ "$(dirname "$tf_ops")" = "$(dirname "$lib")" ] || ctr_bind_ro "$(dirname "$tf_ops")"
# The trainer inside: its environment (no registry image knows mall) and its command line.
keras_env=(--env=PYTHONPATH="$repo/python" --env=MALL_LIBRARY="$lib" --env=MALL_TF_OPS_LIBRARY="$tf_ops"
           --env=TF_CPP_MIN_LOG_LEVEL=2 --env=HOME=/tmp)
keras_cmd=("$py" -u "$trainer" --steps "$steps" --print-every 100 --log-changes)

# check_job WAY JOB OUT [NAME]: the moves and what the user sees, while the container of JOB (named
# NAME, default JOB; the hook's jobs carry its --job-prefix) runs its fit.
check_job() {
  local way=$1 job=$2 out=$3 name=${4:-$2} pid n masks tids tid parked bad t resize_line
  if ! ctr_wait_until 90000 "$way: the first step line of the timed fit" has_line "$out" '^step 1 '; then
    fail "$way: no step line within 90 s:"; sed 's/^/      /' "$out"; return 1
  fi
  pid=$(ctr_pid podman "$name") || { fail "$way: no host pid for the container"; return 1; }
  note "$way: $(grep -m1 '^start ' "$out") (container view); host pid $pid, $(ls /proc/"$pid"/task | wc -l) threads, cgroup $(ctr_cgroup_of "$pid")"
  if ctr_wait_until 10000 "$job attached" job_attached "$job"; then
    pass "$way: job $job is a container job with libmall inside attached ($(job_json "$job" | jq -c '{cpus, container, attached}'))"
  else fail "$way: job $job is not attached: $(job_json "$job")"; fi
  masks=$(host_masks "$pid")
  [ "$masks" = "$pool" ] || fail "$way: before the move the threads are on '$masks', not the pool $pool"

  # To one cpu.
  n=$(wc -l <"$out")
  ctr_ms t timeout 15 "$bin/mallctl" --socket "$sock" set "$job" --cpus "$first" >/dev/null || fail "$way: mallctl set $job --cpus $first"
  if ctr_wait_until 20000 "$way: the resize line to cpu $first" line_after "$out" "$n" "^resize step [0-9]+ threads [0-9]+ -> 1 cpus $first\$" &&
     ctr_wait_until 5000 "$way: every thread on $first" masks_are "$pid" "$first"; then
    resize_line=$(tail -n +"$(( n + 1 ))" "$out" | grep -m1 -E '^resize ')
    pass "$way: mallctl set $job --cpus $first ($t ms): '$resize_line'; every thread of the python process (host pid $pid, $(ls /proc/"$pid"/task | wc -l)) has Cpus_allowed_list $first"
  else
    fail "$way: after set --cpus $first: host thread masks '$(host_masks "$pid")'; the job's lines since:"
    tail -n +"$(( n + 1 ))" "$out" | sed 's/^/      /'
  fi
  parked=$(tail -n +"$(( n + 1 ))" "$out" | sed -n -E 's/^parked step [0-9]+ tids //p' | head -n 1)
  tids=$(ctr_tids "$pid")
  bad=""
  for tid in ${parked//,/ }; do grep -qx "$tid" <<<"$tids" || bad+=" $tid"; done
  if [[ $parked =~ ^[0-9]+(,[0-9]+)*$ ]] && [ -z "$bad" ]; then
    pass "$way: 'parked ... tids $parked': each a thread of the python process (container tids, read from the host's NSpid)"
  else fail "$way: parked tids '$parked' (not threads of pid $pid:${bad:- none}); its container tids: $(tr "\n" " " <<<"$tids")"; fi

  # Back to the pool.
  n=$(wc -l <"$out")
  ctr_ms t timeout 15 "$bin/mallctl" --socket "$sock" set "$job" --cpus auto >/dev/null || fail "$way: mallctl set $job --cpus auto"
  if ctr_wait_until 20000 "$way: the resize line back to $pool" line_after "$out" "$n" "^resize step [0-9]+ threads 1 -> $npool cpus $pool\$" &&
     ctr_wait_until 5000 "$way: every thread on $pool" masks_are "$pid" "$pool" &&
     ctr_wait_until 20000 "$way: a step line with $npool threads on $pool" line_after "$out" "$n" "^step [0-9]+ loss [0-9.]+ threads $npool cpus $pool\$"; then
    resize_line=$(tail -n +"$(( n + 1 ))" "$out" | grep -m1 -E '^resize ')
    pass "$way: mallctl set $job --cpus auto ($t ms): '$resize_line', '$(tail -n +"$(( n + 1 ))" "$out" | grep -m1 -E '^parked ')'; every thread back on $pool; then '$(tail -n +"$(( n + 1 ))" "$out" | grep -m1 -E "^step .* threads $npool ")'"
  else
    fail "$way: after set --cpus auto: host thread masks '$(host_masks "$pid")'; the job's lines since:"
    tail -n +"$(( n + 1 ))" "$out" | sed 's/^/      /'
  fi
  tail -n +"$(( n + 1 ))" "$out" | grep -qE '^parked step [0-9]+ tids -$' ||
    fail "$way: after --cpus auto a worker is still parked: $(tail -n +"$(( n + 1 ))" "$out" | grep -E '^parked ')"
}

# check_end WAY JOB OUT RC: the container exited 0 after its fit, and its job is gone.
check_end() {
  local way=$1 job=$2 out=$3 rc=$4
  if [ "$rc" = 0 ] && has_line "$out" "^done steps $steps " && has_line "$out" '^final loss '; then
    pass "$way: the container exited 0 after its fit: '$(grep -m1 '^done ' "$out" | cut -d' ' -f1-6)', '$(grep -m1 '^final ' "$out")'"
  else fail "$way: the container exited $rc; its output:"; sed 's/^/      /' "$out"; fi
  if ctr_wait_until 10000 "$job gone" job_absent "$job"; then pass "$way: job $job is gone from malld"
  else fail "$way: job $job is still listed: $(job_json "$job")"; fi
}

# ---- 1. mallrun --container -- podman run --rm ... ------------------------------------------------------
way=mallrun out=$CTR_DIR/mallrun.out
ctr_run_args podman kerasrun || { fail "ctr_run_args"; exit 1; }
engine_bin=$(ctr_engine_bin podman)
t0=$(ctr__now_ms)
timeout 180 "$bin/mallrun" --socket "$sock" --container --malleable="1:$npool" --job kerasrun --require -- \
  "$engine_bin" run --rm "${keras_env[@]}" "${CTR_RUN_ARGS[@]}" "${keras_cmd[@]}" >"$out" 2>&1 &
run_pid=$!
check_job "$way" kerasrun "$out"
rc=0; wait "$run_pid" || rc=$?
run_pid=""
times+=("mallrun --container run of the fit $(( $(ctr__now_ms) - t0 )) ms")
check_end "$way" kerasrun "$out" "$rc"

# ---- 2. podman run --rm --annotation io.mall.malleable=1:N (the OCI hook) ----------------------------------
way=oci-hook out=$CTR_DIR/hook.out
t0=$(ctr__now_ms)
CTR_STEP_TIMEOUT_S=180 ctr_run podman kerashook --rm --annotation io.mall.malleable="1:$npool" --annotation io.mall.job=kerashook \
  "${keras_env[@]}" -- "${keras_cmd[@]}" >"$out" 2>&1 &
run_pid=$!
if ctr_wait_until 60000 "job ctr-kerashook registered by the hook" sh -c "[ -n \"\$(timeout 10 '$bin/mallctl' --socket '$sock' status --json | jq -r '.jobs[] | select(.job == \"ctr-kerashook\") | .job')\" ]"; then
  j=$(job_json ctr-kerashook)
  if jq -e '.container == true and ([.cgroups[] | select(.in_place == true)] | length == 1)' <<<"$j" >/dev/null; then
    pass "$way: the hook registered job ctr-kerashook in place in the container's cgroup ($(jq -c '{min, max, cpus}' <<<"$j"))"
  else fail "$way: job ctr-kerashook is not a container job in place: $j"; fi
  check_job "$way" ctr-kerashook "$out" kerashook
else
  fail "$way: no job ctr-kerashook; the hook's log:"; sed 's/^/      /' "$hook_log" 2>/dev/null
fi
rc=0; wait "$run_pid" || rc=$?
run_pid=""
times+=("podman run of the fit through the hook $(( $(ctr__now_ms) - t0 )) ms")
check_end "$way" ctr-kerashook "$out" "$rc"
grep -q "poststop container .*job ctr-kerashook" "$hook_log" 2>/dev/null || fail "$way: the hook's log shows no poststop for ctr-kerashook"

# ---- 3. nothing left ------------------------------------------------------------------------------------------
left=$(mstatus | jq -r '[.jobs[].job] | join(",")')
if [ -z "$left" ]; then pass "no job left in malld"; else fail "jobs left in malld: $left"; fi
ctr_malld_stop
if [ -z "$(mparent_dirs)" ]; then pass "malld stopped and removed its --cgroup-parent folder $mparent"
else fail "malld's folders left after it stopped: $(mparent_dirs | tr '\n' ' ')"; fi
remove_mparent
ctr_ms t ctr_check_nothing_left
times+=("cleanup and leak check $t ms")
trap - EXIT

times+=("total $(( $(ctr__now_ms) - t_start )) ms")
summary=$(printf '%s; ' "${times[@]}")
note "times: ${summary%; }"
if [ "$failures" -gt 0 ]; then echo "test_keras_container: $failures check(s) failed"; exit 1; fi
echo "test_keras_container: all checks passed"
