#!/usr/bin/env bash
# Epoch 1 of the quickstart on 2 rollout workers (backend: ray, a local Ray instance), the relay of
# siblings' tokens between workers on and off (rollout.speculation.groupRelay), interleaved, the
# order reversed every other repeat; REPEATS times each (default 3). OUT: scratch folder.
# Writes ray-{on,off}-{1..REPEATS}.metrics.jsonl beside this script; summary.py tabulates them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp/relay-ray}"
repeats="${REPEATS:-3}"
rhymerl="${RHYMERL:-rhymerl}"
mkdir -p "$out"
for rep in $(seq 1 "$repeats"); do
  order="on off"
  if [ $((rep % 2)) -eq 0 ]; then order="off on"; fi
  for relay in $order; do
    flag=true
    if [ "$relay" = off ]; then flag=false; fi
    rm -rf "$out/$relay-$rep"
    "$rhymerl" run examples/quickstart.yaml --set backend=ray --set rollout.replicas=2 \
      --set rollout.maxReplicas=2 --set rollout.speculation.groupRelay=$flag --set algorithm.epochs=1 \
      --set algorithm.maxOffPolicySteps=0 \
      --out "$out/$relay-$rep" > "$out/$relay-$rep.log" 2>&1
    cp "$out/$relay-$rep/metrics.jsonl" "$here/ray-$relay-$rep.metrics.jsonl"
    echo "ray relay $relay, repeat $rep: done"
  done
done
