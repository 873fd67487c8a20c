#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# docs_link_check.sh — the documentation's links hold: every relative link and #anchor in
# README.md and docs/*.md resolves (the file or folder exists inside the repository; an anchor
# matches a heading of the target page by GitHub's slug rules, or an explicit <a id|name="...">),
# and README.md stays the short page a newcomer reads (at most 300 lines). Links in code blocks
# and code spans are text, not links; http(s), mailto and other URLs with a scheme are not
# fetched. Prints one line per broken link (FILE:LINE, the target, what is wrong) and exits 1;
# exits 0 when all hold. ctest runs it as unit.docs_links. Run with --help for the manual.
set -euo pipefail

usage() {
  cat <<'EOF'
NAME
    docs_link_check.sh - check the relative links and anchors of README.md and docs/*.md

SYNOPSIS
    tests/tools/docs_link_check.sh [--max-readme-lines N] REPO
    tests/tools/docs_link_check.sh --help

DESCRIPTION
    Reads REPO/README.md and every REPO/docs/*.md and checks each Markdown link written there
    ([text](target), ![alt](target) and reference definitions "[name]: target"):
      - a relative target (path[#anchor]) must name a file or folder that exists, resolved from
        the folder of the page that links it, and must stay inside REPO;
      - an anchor (#anchor, or path.md#anchor) must equal the GitHub slug of a heading of the
        target page (lower case; punctuation but "-" and "_" dropped; each space a "-"; the
        second heading of the same slug gets "-1", the third "-2", ...) or an explicit
        <a id="..."> / <a name="..."> in it. An anchor on a file that is not Markdown is an error.
    Targets with a scheme (https:, http:, mailto:, ...) are not checked. Fenced code blocks and
    `code spans` are skipped: a "[x](y)" there is text. Finally README.md must have at most
    --max-readme-lines lines (default 300): the details belong in docs/.

    Each broken link is printed as
        FILE:LINE: link 'TARGET': WHAT IS WRONG
    with, for a missing anchor, the anchors the target page does have.

OPTIONS
    --max-readme-lines N   the most lines README.md may have (default 300)
    --help                 this text

EXIT STATUS
    0 every link resolves and README.md is short enough; 1 a link is broken or README.md is too
    long (each problem printed); 2 usage error (no REPO, REPO without README.md, bad option).

EXAMPLES
    tests/tools/docs_link_check.sh .
    cd build && ctest -R unit.docs_links --output-on-failure

SEE ALSO
    README.md, docs/, tests/tools/spdx_check.sh
EOF
}

max_readme_lines=300
repo=
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --max-readme-lines)
      [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "docs_link_check: --max-readme-lines needs a number of lines, e.g. --max-readme-lines 300" >&2; exit 2; }
      max_readme_lines=$2; shift 2 ;;
    -*) echo "docs_link_check: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [ -z "$repo" ] || { echo "docs_link_check: one REPO only, got '$repo' and '$1' (see --help)" >&2; exit 2; }
       repo=$1; shift ;;
  esac
done
[ -n "$repo" ] || { echo "docs_link_check: usage: docs_link_check.sh [--max-readme-lines N] REPO (see --help)" >&2; exit 2; }
[ -f "$repo/README.md" ] || { echo "docs_link_check: $repo/README.md not found: REPO must be the repository's root" >&2; exit 2; }
command -v python3 >/dev/null || { echo "docs_link_check: python3 is needed (apt install python3)" >&2; exit 2; }

# A hang (it cannot, but every test has a watchdog) fails instead of stalling CI.
source "$(dirname "$0")/../support/watchdog.sh"
watchdog_run 50 python3 - "$repo" "$max_readme_lines" <<'PY'
import glob, os, re, sys

repo, max_readme = os.path.realpath(sys.argv[1]), int(sys.argv[2])
FENCE = re.compile(r'^\s{0,3}(```|~~~)')

def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fence = None
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line)
            if m:
                if fence is None: fence = m.group(1)
                elif m.group(1) == fence: fence = None
                continue
            if fence is None:
                yield n, line.rstrip('\n')

def slug(text):
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', text)   # links and images: their text
    text = re.sub(r'<[^>]+>', '', text)                       # inline HTML
    text = text.replace('`', '').replace('*', '')
    text = re.sub(r'[^\w\- ]', '', text.strip().lower())
    return text.replace(' ', '-')

_anchors = {}
def anchors(path):
    if path not in _anchors:
        seen, found, prev = {}, set(), ''
        for _, line in prose_lines(path):
            heading = None
            m = re.match(r'^ {0,3}#{1,6}\s+(.*?)(\s+#+)?\s*$', line)
            if m:
                heading = m.group(1)
            elif re.match(r'^ {0,3}(=+|-+)\s*$', line) and prev.strip() and not prev.lstrip().startswith(('|', '-', '*', '#')):
                heading = prev.strip()                         # a setext heading
            if heading is not None:
                s = slug(heading)
                found.add(s if s not in seen else f'{s}-{seen[s]}')
                seen[s] = seen.get(s, 0) + 1
            for a in re.findall(r'<a\s+(?:id|name)="([^"]+)"', line):
                found.add(a)
            prev = line
        _anchors[path] = found
    return _anchors[path]

LINK = re.compile(r'!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)')
REFDEF = re.compile(r'^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)')

pages = [os.path.join(repo, 'README.md')] + sorted(glob.glob(os.path.join(repo, 'docs', '*.md')))
problems, checked = [], 0
for page in pages:
    rel = os.path.relpath(page, repo)
    for n, line in prose_lines(page):
        text = re.sub(r'(`+)(?:(?!\1).)+?\1', '', line)        # code spans are text
        targets = LINK.findall(text) + [m.group(1) for m in [REFDEF.match(text)] if m]
        for target in targets:
            if re.match(r'^[A-Za-z][A-Za-z0-9+.-]*:', target):
                continue                                       # https:, mailto:, ...
            checked += 1
            path_part, _, anchor = target.partition('#')
            dest = page if not path_part else os.path.normpath(os.path.join(os.path.dirname(page), path_part))
            where = f'{rel}:{n}: link {target!r}'
            if not os.path.realpath(dest).startswith(repo + os.sep) and os.path.realpath(dest) != repo:
                problems.append(f'{where}: points outside the repository ({dest}); link a file of the repository or a URL')
                continue
            if not os.path.exists(dest):
                problems.append(f'{where}: {os.path.relpath(dest, repo)} does not exist; fix the path (relative to {os.path.dirname(rel) or "the repository root"})')
                continue
            if anchor:
                if not dest.endswith('.md') or os.path.isdir(dest):
                    problems.append(f'{where}: an anchor on {os.path.relpath(dest, repo)}, which is not a Markdown page')
                elif anchor not in anchors(dest):
                    have = ', '.join(sorted(anchors(dest))) or 'none'
                    problems.append(f'{where}: no heading of {os.path.relpath(dest, repo)} has the slug #{anchor} (its anchors: {have})')

with open(pages[0], encoding='utf-8') as f:
    readme_lines = sum(1 for _ in f)
if readme_lines > max_readme:
    problems.append(f'README.md: {readme_lines} lines, more than {max_readme}: move details to docs/ and link them')

for p in problems:
    print(p, file=sys.stderr)
if problems:
    print(f'docs_link_check: {len(problems)} problem(s) in {len(pages)} pages ({checked} relative links checked)', file=sys.stderr)
    sys.exit(1)
print(f'docs_link_check: {checked} relative links in {len(pages)} pages resolve; README.md has {readme_lines} lines (at most {max_readme})')
PY
