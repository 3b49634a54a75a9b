#!/usr/bin/env bash
# Epoch 1 of the quickstart with and without the recent responses' index (speculation.recentTokens),
# interleaved, REPEATS times each; every run's metrics.jsonl and the sha256 of its responses are kept beside this
# script. Then: python benchmarks/group-drafts/recent/summary.py
# Run from the repository root: bash benchmarks/group-drafts/recent/run.sh [REPEATS] [EXTRA --set ...]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPEATS="${1:-3}"
shift || true
for rep in $(seq 1 "$REPEATS"); do
  order=(on off)
  if (( rep % 2 == 0 )); then order=(off on); fi
  for mode in "${order[@]}"; do
    budget=262144
    [[ $mode == off ]] && budget=0
    out="$(mktemp -d)"
    rhymerl run examples/quickstart.yaml --out "$out/run" --set algorithm.epochs=1 \
      --set rollout.speculation.recentTokens="$budget" "$@" > "$out/log" 2>&1
    cp "$out/run/metrics.jsonl" "$HERE/$mode-$rep.metrics.jsonl"
    cat "$out"/run/rollouts/step_*.jsonl | python -c 'import json,sys
for line in sys.stdin:
    r = json.loads(line); print(json.dumps([r["step"], r["prompt_id"], r["sample_index"], r["response_ids"]]))' \
      | sha256sum | cut -d" " -f1 > "$HERE/$mode-$rep.responses.sha256"
    echo "repeat $rep $mode: $(grep -c . "$HERE/$mode-$rep.metrics.jsonl") steps"
    rm -rf "$out"
  done
done
