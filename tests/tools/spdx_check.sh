#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# spdx_check.sh — every source file of the repository says its licence: an
# "SPDX-License-Identifier: BSD-3-Clause" tag in its first two lines (after a shebang), so a site
# that ships a file alone still knows its terms (LICENSE holds the text). Source files: the tracked
# C/C++, shell, Python, CMake and Lua files, the .in templates but the Debian changelog's, .ci/run
# and the deployable examples. Prints the files without the tag. Usage: spdx_check.sh REPO
set -euo pipefail
repo=${1:?usage: spdx_check.sh REPO}
cd "$repo"
command -v git >/dev/null && [ -e .git ] || { echo "spdx_check: $repo is not a git checkout" >&2; exit 1; }
mapfile -t files < <(git ls-files |
  grep -E '\.(cpp|hpp|h|c|cc|sh|py|cmake|lua|in|map)$|(^|/)CMakeLists\.txt$|^\.ci/run$|^launch_scripts/examples/' |
  grep -v -E '^cmake/debian/changelog\.in$|\.(json|md)$')
[ "${#files[@]}" -ge 250 ] || { echo "spdx_check: only ${#files[@]} source files found: the list is wrong" >&2; exit 1; }
missing=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  head -n 2 "$f" | grep -q 'SPDX-License-Identifier: BSD-3-Clause' || missing+=("$f")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "spdx_check: ${#missing[@]} of ${#files[@]} source files lack 'SPDX-License-Identifier: BSD-3-Clause' in their first two lines:" >&2
  printf '  %s\n' "${missing[@]}" >&2
  exit 1
fi
echo "spdx_check: all ${#files[@]} source files carry SPDX-License-Identifier: BSD-3-Clause"
