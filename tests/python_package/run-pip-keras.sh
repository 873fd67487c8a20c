#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-pip-keras.sh — mall installed with pip into a user's own TensorFlow, as a user would do it, and
# the Keras tests against that install (ctest package.pip_keras_newest, package.pip_keras_oldest,
# package.pip_without_tensorflow):
#   python3 -m venv V && V/bin/pip install -r REQUIREMENTS && V/bin/pip install SOURCE
# then checks that pip built the op library for that TensorFlow (mall/_install_paths.py), that the
# venv's `import mall` is the installed package, and runs tf_test_keras's Keras trainer, exit while
# parked and Ctrl-C while parked with MALL_TEST_TF_PYTHON=V/bin/python (no PYTHONPATH, no
# MALL_LIBRARY: only what pip installed). With REQUIREMENTS "none": a venv without TensorFlow, where
# the install must succeed without the op library and mall.tensorflow must name the command that
# adds it. The venv (~1.6 GB with TensorFlow) is removed at the end; pip's cache keeps the wheels.
# Usage: run-pip-keras.sh SOURCE BUILD_DIR NAME REQUIREMENTS|none
set -euo pipefail
source_dir=$1 build=$2 name=$3 requirements=$4
venv=$build/python-venvs/$name
log=$build/python-venvs/$name.log
fail() { echo "run-pip-keras ($name): FAIL: $*" >&2; exit 1; }
cleanup() { rm -rf -- "$venv"; }
trap cleanup EXIT
mkdir -p "$build/python-venvs"
rm -rf -- "$venv"

python=/usr/bin/python3  # Debian's, as a user on the node would make a venv
started=$SECONDS
"$python" -m venv "$venv" || fail "python3 -m venv (install python3-venv)"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
if [ "$requirements" != none ]; then
  timeout 900 "${pip[@]}" install --quiet -r "$requirements" >"$log" 2>&1 || { cat "$log" >&2; fail "pip install -r $requirements"; }
fi
echo "run-pip-keras ($name): venv with $( [ "$requirements" = none ] && echo "no TensorFlow" || sed -n 's/^tensorflow[-a-z]*==//p' "$requirements") in $((SECONDS - started)) s"
started=$SECONDS
# --no-cache-dir: a wheel pip built for another TensorFlow must never be reused.
timeout 900 "${pip[@]}" install --no-cache-dir --verbose "$source_dir" >"$log.mall" 2>&1 || { tail -n 60 "$log.mall" >&2; fail "pip install $source_dir"; }
echo "run-pip-keras ($name): pip install $source_dir in $((SECONDS - started)) s"

export TF_CPP_MIN_LOG_LEVEL=2
unset PYTHONPATH MALL_LIBRARY MALL_TF_OPS_LIBRARY
facts=$(cd / && "$venv/bin/python" -c '
import mall, mall._install_paths as p, mall._library as l
print(mall.__file__)
print(p.OP_LIBRARY)
print(l.load().path)') || fail "the installed package does not import or finds no libmall"
echo "$facts" | sed "s/^/run-pip-keras ($name): /"
package_file=$(sed -n 1p <<<"$facts") op_library=$(sed -n 2p <<<"$facts") libmall=$(sed -n 3p <<<"$facts")
case $package_file in "$venv"/lib/python3*/site-packages/mall/__init__.py) ;; *) fail "import mall found $package_file, not the venv's";; esac
# Its own libmall.so.0, or (a node with the Debian package of this version) the node's.
case $libmall in "$venv"/lib/python3*/site-packages/mall/libmall.so.0|/usr/lib/*/libmall.so.0) ;;
  *) fail "the package loaded $libmall, neither the libmall.so.0 pip put beside it nor the node's";; esac

if [ "$requirements" = none ]; then
  case $op_library in "not built: no tensorflow module for "*) ;; *) fail "op library state: '$op_library'";; esac
  grep -q "installing without the TensorFlow op library" "$log.mall" || fail "pip's build said nothing of the missing op library (log $log.mall)"
  # What a user sees: mall.tensorflow needs TensorFlow itself first; the op library's absence is
  # named with the command (checked without TensorFlow: op_library_path() alone).
  words=$(cd / && "$venv/bin/python" -c 'import mall.tensorflow as mt
try:
    mt.op_library_path()
except mall.MallError as e:
    print(e)' 2>&1 || true)
  want="build it against that TensorFlow: $venv/bin/python -m pip install --force-reinstall --no-deps --no-cache-dir $source_dir"
  [[ $words == *"$want"* ]] || fail "mall.tensorflow said: $words (expected it to name: $want)"
  echo "run-pip-keras ($name): without TensorFlow: installed, and mall.tensorflow says: $words"
  exit 0
fi

tf_version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))')
[ "$op_library" = "built for tensorflow-cpu $tf_version" ] || [ "$op_library" = "built for tensorflow_cpu $tf_version" ] ||
  fail "op library: '$op_library', expected it built for tensorflow-cpu $tf_version"
[ -f "$(dirname "$package_file")/libmall_tf_ops.so" ] || fail "no libmall_tf_ops.so beside $package_file"

started=$SECONDS
MALL_TEST_TF_PYTHON=$venv/bin/python timeout 600 "$build/bin/tf_test_keras" \
  --gtest_filter='Trainers/FollowsMallctlSet.OnTensorFlowsOwnPools/keras_cgroup_v1:Trainers/FollowsMallctlSet.OnTensorFlowsOwnPools/tf_function_cgroup_v1:KerasUnderMalld.AJobParkedWhenItEndsExitsZero:KerasUnderMalld.CtrlCWhileParkedEndsTheJob'
echo "run-pip-keras ($name): TensorFlow $tf_version: Keras tests passed in $((SECONDS - started)) s"
