#!/usr/bin/env bash
# bench rollout per epoch on the 2-core CPU VM (benchmarks/rollout/by-epoch/README.md): epochs 1, 2
# and 6 of a 5-epoch quickstart run RUN, the job's shape, one bench per epoch.
#   bash benchmarks/rollout/by-epoch/run.sh RUN
set -euo pipefail
run="$1"
here="$(cd "$(dirname "$0")" && pwd)"
for epoch in 1 2 6; do
  .venv/bin/rhymerl bench rollout --run "$run" --epoch "$epoch" --batch-sizes job \
    --methods none,history,history-alone,fastest-of-n --repeats 3 --out "$here/epoch$epoch"
done
