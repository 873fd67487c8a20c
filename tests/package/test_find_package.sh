#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_find_package.sh — proves the install rule and package config: installs the build tree into a
# temporary prefix, builds tests/package/consumer with find_package(mall) (a C program on mall::mall
# a C++ one on mall::tf, an MPI one on mall::mpi that is only linked and, when the build has
# TensorFlow, a TensorFlow Session on mall::tf_tensorflow), runs all but the MPI one. Cleans up.
set -euo pipefail
build=$1; src=$2
tmp=$(mktemp -d /tmp/mall-pkg.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in include/mall/mall.h include/mall/mall.hpp include/mall/tf/pool_parking.hpp include/mall/tf/detail/pool_parking_detail.hpp \
         include/mall/tf/mall_pool_glue.hpp include/mall/adapter/attach.hpp include/mall/adapter/allocation_cpus.hpp \
         include/mall/openmp/adapter.hpp include/mall/libtorch/adapter.hpp \
         include/mall/tf/openmp_adapter.hpp include/mall/tf/libtorch_adapter.hpp include/mall/tf/allocation_cpus.hpp \
         include/mall/mall_mpi.h bin/malld bin/mallctl bin/mallrun; do
  [ -e "$tmp/prefix/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
# A build with TensorFlow installs its Session adapter: the consumer then builds one on it too.
with_tensorflow=OFF
[ -e "$tmp/prefix/include/mall/tf/tensorflow_session.hpp" ] && with_tensorflow=ON
cmake -G Ninja -S "$src/tests/package/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DMALL_CONSUMER_TENSORFLOW=$with_tensorflow >/dev/null
ninja -C "$tmp/consumer" >/dev/null
libdir="$(dirname "$(find "$tmp/prefix" -name 'libmall.so*' | head -n 1)")"
LD_LIBRARY_PATH="$libdir" "$tmp/consumer/consumer"
LD_LIBRARY_PATH="$libdir" "$tmp/consumer/consumer_tf"
if [ "$with_tensorflow" = ON ]; then
  TF_CPP_MIN_LOG_LEVEL=2 LD_LIBRARY_PATH="$libdir" "$tmp/consumer/consumer_session"
fi
# Only mall_* symbols may be exported by the shared library.
lib=$(find "$tmp/prefix" -name 'libmall.so.*' -type f | head -n 1)
[ -n "$lib" ] || { echo "libmall.so was not installed" >&2; exit 1; }
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /[TDBRWVu]/ {print $3}' | grep -v '^mall_' || true)
if [ -n "$bad" ]; then echo "libmall exports non-mall symbols:" $bad >&2; exit 1; fi
echo "find_package(mall): ok"
