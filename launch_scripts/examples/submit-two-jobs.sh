#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# submit-two-jobs.sh — submits train-malleable.sbatch, then (once it runs) a plain one-core job, so
# the malleable job shrinks to its own core while the second runs and grows back when it ends.
# Run from the repository root with the cluster's environment: eval "$(launch_scripts/local-cluster.sh env)"
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
first=$(sbatch --parsable "$here/train-malleable.sbatch")
echo "malleable job $first submitted"
deadline=$(( SECONDS + 60 ))
until scontrol show job "$first" | grep -q 'JobState=RUNNING'; do
  [ $SECONDS -lt $deadline ] || { echo "job $first did not start within 60 s" >&2; exit 1; }
  sleep 0.2
done
second=$(sbatch --parsable --ntasks=1 --cpus-per-task=1 --output=plain-%j.out \
  --wrap 'for i in 1 2 3; do grep Cpus_allowed_list /proc/self/status; sleep 2; done')
echo "plain one-core job $second submitted; watch the cores move with: mallctl --socket \"\$MALL_SOCKET\" watch"
