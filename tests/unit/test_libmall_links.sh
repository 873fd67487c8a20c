#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_libmall_links.sh — what a training process loads with libmall: `ldd libmall.so` must list only
# the C and C++ runtimes (libc, libstdc++, libm, libgcc_s, the loader, the vDSO; in a sanitizer
# build also libasan/libubsan/libtsan, which instrumentation adds to everything). libmall once
# pulled hwloc (and through it libudev) into every trainer: hwloc is malld's business, not the
# training process's (issue 30). libmall is linked -z nodelete (FLAGS_1 NODELETE in its dynamic
# section): a dlclose() with a handle open must not unmap the code its monitor thread runs; the
# probe (tests/support/dlclose_probe_main.c) does exactly that and must live on (issue 37).
# Usage: test_libmall_links.sh PATH/TO/libmall.so [PATH/TO/mall_dlclose_probe]
set -euo pipefail
library=${1:?usage: test_libmall_links.sh PATH/TO/libmall.so [PATH/TO/mall_dlclose_probe]}
probe=${2:-}
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

flags=$(readelf -d "$library" | grep -E '\(FLAGS_1\)' || true)
if ! grep -q NODELETE <<<"$flags"; then
  echo "FAIL: $library is not linked -z nodelete (readelf -d: ${flags:-no FLAGS_1 entry}):" >&2
  echo "  a dlclose() with a handle open would unmap the code its monitor thread runs (libmall/CMakeLists.txt)" >&2
  exit 1
fi
echo "libmall is linked -z nodelete: $flags"
if [ -n "$probe" ]; then
  [ -x "$probe" ] || { echo "FAIL: $probe is missing (build target mall_dlclose_probe)" >&2; exit 1; }
  status=0
  "$probe" "$library" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "FAIL: a process that dlclosed libmall with a handle open exited with status $status" \
         "(over 128: killed by signal $((status - 128)), e.g. 11 = SIGSEGV in the unmapped monitor thread)" >&2
    exit 1
  fi
fi
