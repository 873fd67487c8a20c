# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# slurm_recipe.sh — reads docs/admin-slurm.md's recipe "mall for Slurm 24.11 on Debian 13" (the
# ```bash block between `<!-- slurm-24.11-recipe:begin -->` and `<!-- slurm-24.11-recipe:end -->`)
# so that the site guest runs the doc's lines themselves (issue 38): make-site-root.sh installs the
# packages of its `apt-get install` command, build-site-deb.sh runs the whole block in the root.
# Sourced, never run (make-site-root.sh, build-site-deb.sh, tests/vm/test_site_recipe_tied.sh).
# Contract: defines functions and SLURM_RECIPE_DOC (the doc of the tree this file is in, or
# $MALL_SLURM_RECIPE_DOC: tests point it at an edited copy) only; each function prints its answer on
# stdout, or a message saying what is wrong with the doc on stderr and returns 1.

SLURM_RECIPE_DOC=${MALL_SLURM_RECIPE_DOC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/docs/admin-slurm.md}

# slurm_recipe_text [DOC]: the recipe's lines, without the ``` fences. Fails unless DOC has exactly
# one begin and one end marker, in that order, around a single ```bash block.
slurm_recipe_text() {
  local doc=${1:-$SLURM_RECIPE_DOC}
  [ -r "$doc" ] || { echo "slurm_recipe: $doc is not readable" >&2; return 1; }
  awk -v doc="$doc" '
    function bad(why) { print "slurm_recipe: " doc ": " why >"/dev/stderr"; failed = 1; exit 1 }
    # The block may be indented (inside a list item): the begin marker'"'"'s indent is taken off
    # every line up to the end marker.
    function body(line) { return substr(line, 1, length(indent)) == indent ? substr(line, length(indent) + 1) : line }
    /^[ ]*<!-- slurm-24\.11-recipe:begin -->[ ]*$/ {
      begins++; if (begins > 1) bad("two begin markers")
      inside = 1; indent = $0; sub(/<.*/, "", indent); next
    }
    /^[ ]*<!-- slurm-24\.11-recipe:end -->[ ]*$/ {
      ends++
      if (!inside) bad("an end marker before the begin marker")
      if (fence != 2) bad("the markers must hold one ```bash block, opened and closed")
      inside = 0; next
    }
    !inside { next }
    fence == 0 && /^[[:space:]]*$/ { next }
    fence == 0 { if (body($0) != "```bash") bad("the begin marker must be followed by a ```bash line, not: " $0); fence = 1; next }
    fence == 1 && body($0) == "```" { fence = 2; next }
    fence == 1 { print body($0); lines++; next }
    fence == 2 && !/^[[:space:]]*$/ { bad("text after the ```bash block, before the end marker: " $0) }
    END {
      if (failed) exit 1
      if (begins != 1 || ends != 1) bad("want one begin and one end marker (<!-- slurm-24.11-recipe:begin/end -->), found " begins + 0 " and " ends + 0)
      if (lines == 0) bad("the recipe block is empty")
    }' "$doc"
}

# slurm_recipe_commands [DOC]: the recipe's commands, one a line: comments and blank lines
# dropped, backslash-continued lines joined (with one space), runs of blanks squeezed.
slurm_recipe_commands() {
  local text
  text=$(slurm_recipe_text "$@") || return 1
  awk '
    { sub(/[[:space:]]+$/, "") }
    cont == "" && /^[[:space:]]*(#|$)/ { next }
    /\\$/ { cont = cont substr($0, 1, length($0) - 1) " "; next }
    { line = cont $0; cont = ""; gsub(/[[:space:]]+/, " ", line); sub(/^ /, "", line); print line }
    END { if (cont != "") { print "slurm_recipe: the recipe ends in a backslash" >"/dev/stderr"; exit 1 } }' <<<"$text"
}

# slurm_recipe_packages [DOC]: the packages of the recipe's one `apt-get install` command that
# names no file (./x.deb), comma-separated in its order (mmdebstrap --include's form).
slurm_recipe_packages() {
  local commands
  commands=$(slurm_recipe_commands "$@") || return 1
  awk '
    $1 == "apt-get" && $2 == "install" {
      pkgs = ""; files = 0
      for (i = 3; i <= NF; i++) {
        if ($i ~ /^-/) continue
        if ($i ~ /\//) { files = 1; break }
        if ($i !~ /^[a-z0-9][a-z0-9+.-]+$/) { print "slurm_recipe: not a package name: " $i >"/dev/stderr"; exit 1 }
        pkgs = pkgs (pkgs == "" ? "" : ",") $i
      }
      if (files) next
      n++; found = pkgs
    }
    END {
      if (n != 1) { print "slurm_recipe: want one `apt-get install PACKAGE...` command in the recipe, found " n + 0 >"/dev/stderr"; exit 1 }
      print found
    }' <<<"$commands"
}

# slurm_recipe_key [DOC]: 8 hex digits that change with any line of the recipe (comments too).
slurm_recipe_key() {
  local text
  text=$(slurm_recipe_text "$@") || return 1
  printf '%s\n' "$text" | md5sum | cut -c1-8
}
