#!/usr/bin/env bash
# Epoch 1 of the quickstart, history against fastest-of-n with the draft model now that Fastest-of-N
# prices the draft model's steps; interleaved, REPEATS times each (default 2). OUT: scratch folder.
# Writes priced-{history,fastest-of-n-draft}-{1..REPEATS}.metrics.jsonl beside this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp/ep1}"
repeats="${REPEATS:-2}"
rhymerl="${RHYMERL:-rhymerl}"
for rep in $(seq 1 "$repeats"); do
  for name in history fastest-of-n-draft; do
    extra=()
    if [ "$name" = fastest-of-n-draft ]; then
      extra=(--set rollout.speculation.method=fastest-of-n --set rollout.speculation.draftModel=builtin:tiny-arith-draft)
    fi
    rm -rf "$out/$name-$rep"
    OMP_NUM_THREADS=1 "$rhymerl" run examples/quickstart.yaml --set algorithm.epochs=1 "${extra[@]}" \
      --out "$out/$name-$rep" > "$out/$name-$rep.log" 2>&1
    cp "$out/$name-$rep/metrics.jsonl" "$here/priced-$name-$rep.metrics.jsonl"
  done
done
