#!/usr/bin/env bash
# The GPU measurements of benchmarks/gpu/README.md, as one command on a GPU machine with no
# network: torch (CUDA) preinstalled, rhymerl built from this checkout, pydantic carried as
# wheels in .whl/, a finished quickstart run folder in .gpu/run. Results land in $OUT.
set -euo pipefail
export PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site . \
  > "$OUT/build.log" 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
mkdir -p "$OUT/train" "$OUT/rollout"
python3 benchmarks/gpu/train_step.py "$OUT/train" --sizes 25m,110m,350m --steps 3
python3 -m rhymerl.cli.main bench rollout --run .gpu/run --device cuda --batch-sizes job \
  --methods none,ngram,history --repeats 3 --out "$OUT/rollout"
