#!/usr/bin/env bash
# The second call of benchmarks/gpu/sources/README.md, on the same warm machine: what each source
# adds in epoch 1 (history-alone there is the recent responses without the group's), and epoch 2
# (history of epoch 1 only). Results: $OUT/more.tar, $OUT/more.log.
set -euo pipefail
source benchmarks/gpu/install.sh
bench=(python3 -m rhymerl.cli.main bench rollout --run .gpu/run --device cuda --batch-sizes job)
mkdir -p /tmp/more
{
  timeout 200 "${bench[@]}" --epoch 1 --methods none,history,history-alone,ngram,draft-model --repeats 2 \
    --out /tmp/more/epoch1-sources || echo "sources_more: the epoch-1 bench failed"
  timeout 120 "${bench[@]}" --epoch 2 --methods none,history,history-alone --repeats 2 --out /tmp/more/epoch2 \
    || echo "sources_more: the epoch-2 bench failed"
} 2>&1 | tee "$OUT/more.log"
tar -C /tmp -cf "$OUT/more.tar" more
