#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-pip-keras.sh — mall installed with pip into a user's own TensorFlow, as a user does it, and the
# Keras tests against only what pip installed (no PYTHONPATH, no MALL_LIBRARY: tf_test_keras with
# MALL_TEST_TF_PYTHON). A venv made with Debian's python3 at BUILD_DIR/python-venvs/NAME. Modes:
#   mall-first  (ctest package.pip_venv_newest, the setup of integration.tf_test_keras*): pip install
#               SOURCE into a venv without TensorFlow: it must install without the op library, and
#               mall.tensorflow must name the one command that adds it; then pip install -r
#               REQUIREMENTS (TensorFlow), run exactly that command, and check the result. The venv
#               stays for the Keras tests; mode `cleanup` removes it.
#   keras       (ctest package.pip_keras_oldest): pip install -r REQUIREMENTS, then SOURCE, the same
#               checks, tf_test_keras's Keras trainer, tf.function loop, exit and Ctrl-C while
#               parked; the venv is removed at the end.
#   cleanup     removes the venv (ctest package.pip_venv_newest_cleanup).
# The checks: `import mall` is the venv's package, it loads the libmall.so.0 pip put beside it (or
# the node's, where the Debian package of this version is installed), and its op library was built
# for the venv's TensorFlow. pip's cache keeps the wheels between runs; mall is built with
# --no-cache-dir (a wheel built against another TensorFlow must never be reused).
# Usage: run-pip-keras.sh SOURCE BUILD_DIR NAME REQUIREMENTS mall-first|keras|cleanup
set -euo pipefail
source_dir=$1 build=$2 name=$3 requirements=$4 mode=$5
venv=$build/python-venvs/$name
log=$build/python-venvs/$name.log
say() { echo "run-pip-keras ($name): $*"; }
fail() { echo "run-pip-keras ($name): FAIL: $*" >&2; exit 1; }
mkdir -p "$build/python-venvs"
if [ "$mode" = cleanup ]; then rm -rf -- "$venv" "$log" "$log.mall"; say "removed $venv"; exit 0; fi
if [ "$mode" = keras ]; then trap 'rm -rf -- "$venv"' EXIT; else trap '[ $? -eq 0 ] || rm -rf -- "$venv"' EXIT; fi
rm -rf -- "$venv"
export TF_CPP_MIN_LOG_LEVEL=2
unset PYTHONPATH MALL_LIBRARY MALL_TF_OPS_LIBRARY

started=$SECONDS
/usr/bin/python3 -m venv "$venv" || fail "python3 -m venv (install python3-venv)"  # Debian's python3, as on a node
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
install_tensorflow() {
  local t=$SECONDS
  timeout 900 "${pip[@]}" install --quiet -r "$requirements" >"$log" 2>&1 || { cat "$log" >&2; fail "pip install -r $requirements"; }
  say "pip install -r $(basename "$requirements") ($(sed -n 's/^tensorflow[-a-z]*==//p' "$requirements")) in $((SECONDS - t)) s"
}
install_mall() { # install_mall ARGS...: pip install ARGS, its output in $log.mall
  local t=$SECONDS
  timeout 900 "$@" >"$log.mall" 2>&1 || { tail -n 60 "$log.mall" >&2; fail "$*"; }
  say "$* in $((SECONDS - t)) s"
}
# What the installed package says of itself: its file, the op library's state, the libmall it loads.
installed_facts() {
  (cd / && "$venv/bin/python" -c '
import mall, mall._install_paths as p, mall._library as l
print(mall.__file__)
print(p.OP_LIBRARY)
print(l.load().path)') || fail "the installed package does not import or finds no libmall"
}
check_installed() { # check_installed FACTS
  local package_file libmall
  package_file=$(sed -n 1p <<<"$1") libmall=$(sed -n 3p <<<"$1")
  case $package_file in "$venv"/lib/python3*/site-packages/mall/__init__.py) ;; *) fail "import mall found $package_file, not the venv's";; esac
  case $libmall in "$venv"/lib/python3*/site-packages/mall/libmall.so.0|/usr/lib/*/libmall.so.0) ;;
    *) fail "the package loaded $libmall, neither the libmall.so.0 pip put beside it nor the node's";; esac
}
check_op_library() { # check_op_library FACTS: built for the venv's TensorFlow, and beside the package
  local tf_version op_library
  op_library=$(sed -n 2p <<<"$1")
  tf_version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))')
  case $op_library in "built for tensorflow-cpu $tf_version"|"built for tensorflow_cpu $tf_version") ;;
    *) fail "op library: '$op_library', expected it built for tensorflow-cpu $tf_version";; esac
  [ -f "$(dirname "$(sed -n 1p <<<"$1")")/libmall_tf_ops.so" ] || fail "no libmall_tf_ops.so beside the package"
  say "$op_library"
}

if [ "$mode" = mall-first ]; then
  # 1. mall before TensorFlow: the rest installs, and mall.tensorflow names the command.
  install_mall "${pip[@]}" install --no-cache-dir --verbose "$source_dir"
  facts=$(installed_facts)
  check_installed "$facts"
  case $(sed -n 2p <<<"$facts") in "not built: no tensorflow module for "*) ;; *) fail "op library state: '$(sed -n 2p <<<"$facts")'";; esac
  grep -q "installing without the TensorFlow op library" "$log.mall" || fail "pip's build said nothing of the missing op library (log $log.mall)"
  words=$(cd / && "$venv/bin/python" -c 'import mall, mall.tensorflow as mt
try:
    mt.op_library_path()
except mall.MallError as e:
    print(e)' 2>&1 || true)
  want="build it against that TensorFlow: $venv/bin/python -m pip install --force-reinstall --no-deps --no-cache-dir $source_dir"
  [[ $words == *"$want"* ]] || fail "mall.tensorflow said: $words (expected it to name: $want)"
  say "without TensorFlow, mall.tensorflow says: $words"
  # 2. TensorFlow, then exactly the command mall.tensorflow gave.
  install_tensorflow
  command=${words#*build it against that TensorFlow: }
  command=${command% (MALL_ERR_*}
  read -r -a command_words <<<"$command"
  install_mall "${command_words[@]}"
  facts=$(installed_facts)
  check_installed "$facts"
  check_op_library "$facts"
  say "ready for the Keras tests in $((SECONDS - started)) s (the venv stays until package.pip_venv_newest_cleanup)"
  exit 0
fi

[ "$mode" = keras ] || fail "unknown mode '$mode' (mall-first, keras or cleanup)"
install_tensorflow
install_mall "${pip[@]}" install --no-cache-dir --verbose "$source_dir"
facts=$(installed_facts)
check_installed "$facts"
check_op_library "$facts"
t=$SECONDS
MALL_TEST_TF_PYTHON=$venv/bin/python timeout 600 "$build/bin/tf_test_keras" \
  --gtest_filter='Trainers/FollowsMallctlSet.OnTensorFlowsOwnPools/keras_cgroup_v1:Trainers/FollowsMallctlSet.OnTensorFlowsOwnPools/tf_function_cgroup_v1:KerasUnderMalld.AJobParkedWhenItEndsExitsZero:KerasUnderMalld.CtrlCWhileParkedEndsTheJob'
say "Keras tests passed in $((SECONDS - t)) s; $((SECONDS - started)) s in all"
