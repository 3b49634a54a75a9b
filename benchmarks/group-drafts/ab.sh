#!/usr/bin/env bash
# One epoch of the quickstart under two settings, interleaved (the order swapped every other repeat),
# REPEATS times each; each run's metrics.jsonl and the sha256 of its responses go to OUT as
# LABEL-REPEAT.*. Then: python benchmarks/group-drafts/ab_summary.py OUT LABEL_A LABEL_B
# Run from the repository root, in the project's virtual environment:
#   bash benchmarks/group-drafts/ab.sh OUT REPEATS LABEL_A "KEY=VALUE ..." LABEL_B "KEY=VALUE ..." [KEY=VALUE ...]
# The last KEY=VALUEs apply to both (each becomes a --set of `rhymerl run`).
set -euo pipefail
OUT="$1"; REPEATS="$2"; LABELS=("$3" "$5"); SETS=("$4" "$6"); shift 6
common=(--set algorithm.epochs=1)
for kv in "$@"; do common+=(--set "$kv"); done
mkdir -p "$OUT"
for rep in $(seq 1 "$REPEATS"); do
  order=(0 1)
  if (( rep % 2 == 0 )); then order=(1 0); fi
  for i in "${order[@]}"; do
    own=()
    for kv in ${SETS[$i]}; do own+=(--set "$kv"); done
    tmp="$(mktemp -d)"
    rhymerl run examples/quickstart.yaml --out "$tmp/run" "${common[@]}" "${own[@]}" > "$tmp/log" 2>&1
    cp "$tmp/run/metrics.jsonl" "$OUT/${LABELS[$i]}-$rep.metrics.jsonl"
    cat "$tmp"/run/rollouts/step_*.jsonl | python -c 'import json,sys
for line in sys.stdin:
    r = json.loads(line); print(json.dumps([r["step"], r["prompt_id"], r["sample_index"], r["response_ids"]]))' \
      | sha256sum | cut -d" " -f1 > "$OUT/${LABELS[$i]}-$rep.responses.sha256"
    echo "repeat $rep ${LABELS[$i]}: $(grep -c . "$OUT/${LABELS[$i]}-$rep.metrics.jsonl") steps"
    rm -rf "$tmp"
  done
done
