# SPDX-License-Identifier: BSD-3-Clause
# stats.sh — the statistics the launch scripts print, sourced (never run) by bench-keras.sh,
# bench-oversubscription.sh, bench-scale.sh and demo.sh from "$repo/launch_scripts/lib/stats.sh".
# median [FORMAT [EMPTY]]: the median of the numbers on stdin (whitespace or newline separated, any
# order; the mean of the middle two for an even count), printed with awk's printf FORMAT, or with
# awk's print (the middle value as written, a mean as %.6g, then a newline) when FORMAT is empty or
# absent; EMPTY is printed when there are no numbers (without it: 0, as the mean of nothing).
median() {
  local format=${1:-} has_empty=0 empty=${2:-}
  [ $# -ge 2 ] && has_empty=1
  awk '{ for (i = 1; i <= NF; i++) print $i }' | sort -g | awk -v format="$format" -v has_empty="$has_empty" \
    -v empty="$empty" '
    { v[NR] = $1 }
    END {
      if (NR == 0 && has_empty) { print empty; exit }
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      if (format == "") print m; else printf format, m
    }'
}
