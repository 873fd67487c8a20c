#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# check-tours-registered.sh REPO "NAME ..." — every tour marked in README.md and docs/*.md
# (`<!-- tour: NAME ... -->`, see run-tours.sh) is one of the NAMEs tests/docs/CMakeLists.txt
# registers as docs.tour.NAME, and every NAME is marked: a tour without a test would never run.
set -euo pipefail
repo=$1 registered=" $2 "
marked=$("$(dirname "$0")/run-tours.sh" "$repo" "$repo/build" --list | cut -f2 | sort)
status=0
for name in $marked; do
  case $registered in *" $name "*) ;; *) echo "FAIL: tour '$name' is marked but tests/docs/CMakeLists.txt runs no docs.tour.$name"; status=1 ;; esac
done
for name in $2; do
  grep -qx "$name" <<<"$marked" || { echo "FAIL: docs.tour.$name is registered but no '<!-- tour: $name' marker exists"; status=1; }
done
[ $status -ne 0 ] || echo "PASS: $(wc -w <<<"$marked") tours marked, each with its docs.tour test"
exit $status
