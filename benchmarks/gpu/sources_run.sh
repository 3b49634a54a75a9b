#!/usr/bin/env bash
# Issue 28's draft sources on the GPU (benchmarks/gpu/sources/README.md), as one command on a GPU
# machine with no network: install.sh, then the 5-epoch quickstart run folder in .gpu/run.
# Epoch 6 (history of epochs 4-5) and epoch 1 (no history of its own) of the run, the job's shape;
# both benches' folders come back as $OUT/sources.tar, everything printed as $OUT/sources.log.
set -euo pipefail
source benchmarks/gpu/install.sh
bench=(python3 -m rhymerl.cli.main bench rollout --run .gpu/run --device cuda --batch-sizes job)
mkdir -p /tmp/sources
{  # the second bench runs, and what came back is kept, even where the first fails
  timeout 330 "${bench[@]}" --methods none,history,history-alone,fastest-of-n,draft-model --repeats 3 --out /tmp/sources/later \
    || echo "sources_run: the epoch-6 bench failed"
  timeout 200 "${bench[@]}" --epoch 1 --methods none,history,fastest-of-n --repeats 2 --out /tmp/sources/epoch1 \
    || echo "sources_run: the epoch-1 bench failed"
} 2>&1 | tee "$OUT/sources.log"
tar -C /tmp -cf "$OUT/sources.tar" sources
