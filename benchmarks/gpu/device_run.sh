#!/usr/bin/env bash
# The GPU measurements of benchmarks/gpu/README.md (training step, rollout by method), as one
# command on a GPU machine with no network: install.sh, then a finished quickstart run folder in
# .gpu/run. Results land in $OUT.
set -euo pipefail
source benchmarks/gpu/install.sh
mkdir -p "$OUT/train" "$OUT/rollout"
python3 benchmarks/gpu/train_step.py "$OUT/train" --sizes 25m,110m,350m --steps 3
python3 -m rhymerl.cli.main bench rollout --run .gpu/run --device cuda --batch-sizes job \
  --methods none,ngram,history --repeats 3 --out "$OUT/rollout"
