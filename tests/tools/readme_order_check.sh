#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# readme_order_check.sh — the README's two commands in the README's order (issue 38): on a fresh
# clone `launch_scripts/demo.sh` may configure build/ before the TensorFlow venv exists, caching an
# empty MALL_TENSORFLOW_PYTHON; `launch_scripts/run-tests.sh` must still configure that folder with
# TensorFlow (it stopped at "MALL_WITH_TENSORFLOW=ON but the Session adapter cannot be built").
# Configures a temporary build folder as demo.sh did then (no venv), runs `run-tests.sh
# --configure-only` on it, and checks what CMake cached and that the op library is a target.
# Usage: readme_order_check.sh REPO
set -euo pipefail
repo=${1:?usage: readme_order_check.sh REPO}
venv_python=${MALL_TF_VENV:-$repo/.venv}/bin/python
[ -x "$venv_python" ] || { echo "FAIL: no $venv_python (launch_scripts/install-deps.sh makes it)" >&2; exit 1; }
build=$(mktemp -d /tmp/mall-readme-order.XXXXXX)
trap 'rm -rf -- "$build"' EXIT

# demo.sh's configure on a fresh clone, before install-deps made the venv.
timeout 300 cmake -G Ninja -S "$repo" -B "$build" -DMALL_TENSORFLOW_PYTHON= >"$build.log" 2>&1 ||
  { cat "$build.log" >&2; rm -f "$build.log"; echo "FAIL: the first configure" >&2; exit 1; }
rm -f "$build.log"
grep -q '^MALL_TENSORFLOW_PYTHON:FILEPATH=$' "$build/CMakeCache.txt" || { echo "FAIL: the first configure did not cache an empty MALL_TENSORFLOW_PYTHON" >&2; exit 1; }
if ninja -C "$build" -t query mall_tf_ops >/dev/null 2>&1; then echo "FAIL: without the venv there should be no op library" >&2; exit 1; fi

# The README's second command, up to its configure.
MALL_BUILD_DIR=$build timeout 600 "$repo/launch_scripts/run-tests.sh" --configure-only ||
  { echo "FAIL: run-tests.sh could not configure a folder that demo.sh configured first" >&2; exit 1; }
grep -q "^MALL_TENSORFLOW_PYTHON:FILEPATH=$venv_python\$" "$build/CMakeCache.txt" ||
  { echo "FAIL: MALL_TENSORFLOW_PYTHON is $(grep '^MALL_TENSORFLOW_PYTHON' "$build/CMakeCache.txt"), not $venv_python" >&2; exit 1; }
ninja -C "$build" -t query mall_tf_ops >/dev/null || { echo "FAIL: no mall_tf_ops target after run-tests.sh's configure" >&2; exit 1; }
echo "PASS: demo.sh's early configure, then run-tests.sh: TensorFlow ($venv_python) and the op library are there"
