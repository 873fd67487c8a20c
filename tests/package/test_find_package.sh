#!/usr/bin/env bash
# test_find_package.sh — proves the install rule and package config: installs the build tree into a
# temporary prefix, builds tests/package/consumer with find_package(mall) (a C program on mall::mall
# a C++ one on mall::tf, and an MPI one on mall::mpi that is only linked), runs the first two. Cleans up.
set -euo pipefail
build=$1; src=$2
tmp=$(mktemp -d /tmp/mall-pkg.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in include/mall/mall.h include/mall/mall.hpp include/mall/tf/resizable_thread_pool.hpp \
         include/mall/tf/mall_pool_glue.hpp include/mall/mall_mpi.h bin/malld bin/mallctl bin/mallrun; do
  [ -e "$tmp/prefix/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
cmake -G Ninja -S "$src/tests/package/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
ninja -C "$tmp/consumer" >/dev/null
libdir="$(dirname "$(find "$tmp/prefix" -name 'libmall.so*' | head -n 1)")"
LD_LIBRARY_PATH="$libdir" "$tmp/consumer/consumer"
LD_LIBRARY_PATH="$libdir" "$tmp/consumer/consumer_tf"
# Only mall_* symbols may be exported by the shared library.
lib=$(find "$tmp/prefix" -name 'libmall.so.*' -type f | head -n 1)
[ -n "$lib" ] || { echo "libmall.so was not installed" >&2; exit 1; }
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /[TDBRWVu]/ {print $3}' | grep -v '^mall_' || true)
if [ -n "$bad" ]; then echo "libmall exports non-mall symbols:" $bad >&2; exit 1; fi
echo "find_package(mall): ok"
