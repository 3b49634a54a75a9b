#!/usr/bin/env bash
# The pass profile of benchmarks/gpu/sources/README.md on the GPU machine (install.sh, the run in
# .gpu/run): the first 3 steps of epoch 6, plain and with HistoSpec. Output: $OUT/profile.txt.
set -euo pipefail
source benchmarks/gpu/install.sh
python3 benchmarks/gpu/sources/profile_pass.py .gpu/run --device cuda --steps 3 --methods none,history \
  2>&1 | tee "$OUT/profile.txt"
