#!/usr/bin/env bash
# The quickstart (5 epochs) with each prompt's index holding its last K epochs (speculation.historyEpochs),
# K in KS (default "1 2 3"), interleaved (the order rotated every repeat), REPEATS times each; every
# run's metrics.jsonl and the sha256 of its responses are kept beside this script. Then:
# python benchmarks/history-epochs/summary.py
# Run from the repository root: bash benchmarks/history-epochs/run.sh [REPEATS] [KS]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPEATS="${1:-2}"
read -r -a KS <<< "${2:-1 2 3}"
n=${#KS[@]}
for rep in $(seq 1 "$REPEATS"); do
  for i in $(seq 0 $((n - 1))); do
    k=${KS[$(( (i + rep - 1) % n ))]}
    out="$(mktemp -d)"
    rhymerl run examples/quickstart.yaml --out "$out/run" --set rollout.speculation.historyEpochs="$k" \
      > "$out/log" 2>&1
    cp "$out/run/metrics.jsonl" "$HERE/k$k-$rep.metrics.jsonl"
    cat "$out"/run/rollouts/step_*.jsonl | python -c 'import json,sys
for line in sys.stdin:
    r = json.loads(line); print(json.dumps([r["step"], r["prompt_id"], r["sample_index"], r["response_ids"]]))' \
      | sha256sum | cut -d" " -f1 > "$HERE/k$k-$rep.responses.sha256"
    echo "repeat $rep historyEpochs $k: $(grep -c . "$HERE/k$k-$rep.metrics.jsonl") steps"
    rm -rf "$out"
  done
done
