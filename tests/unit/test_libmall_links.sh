#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_libmall_links.sh — what a training process loads with libmall: `ldd libmall.so` must list only
# the C and C++ runtimes (libc, libstdc++, libm, libgcc_s, the loader, the vDSO; in a sanitizer
# build also libasan/libubsan/libtsan, which instrumentation adds to everything). libmall once
# pulled hwloc (and through it libudev) into every trainer: hwloc is malld's business, not the
# training process's (issue 30). Usage: test_libmall_links.sh PATH/TO/libmall.so
set -euo pipefail
library=${1:?usage: test_libmall_links.sh PATH/TO/libmall.so}
[ -r "$library" ] || { echo "FAIL: $library is missing (build target mall)" >&2; exit 1; }
listing=$(ldd "$library") || { echo "FAIL: ldd $library failed" >&2; exit 1; }
unexpected=$(awk '{print $1}' <<<"$listing" |
  grep -v -E '^(linux-vdso\.so\.1|/lib64/ld-linux-x86-64\.so\.2|ld-linux.*|libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$' |
  grep -v -E '^lib(a|ub|t)san\.so\.[0-9]+$' || true)   # a sanitizer tree's runtimes (run-tests.sh's ASan pass)
if [ -n "$unexpected" ]; then
  echo "FAIL: libmall loads more than the C/C++ runtimes into every training process:" >&2
  echo "$unexpected" | sed 's/^/  /' >&2
  echo "ldd $library:" >&2
  echo "$listing" >&2
  echo "(link such a dependency PRIVATE to malld's or the tools' targets, not to libmall: libmall/CMakeLists.txt)" >&2
  exit 1
fi
echo "libmall needs only the C/C++ runtimes:"
echo "$listing"
