#!/usr/bin/env bash
# A/B of the verifier's choice between its own drafts and a freed worker's (forced pairs), epoch 1, 3 workers
set -e
out=$1
rm -rf "$out"
RHYMERL_FORCE=freed-drafters OMP_NUM_THREADS=1 ${RHYMERL:-rhymerl} run examples/quickstart.yaml \
  --set algorithm.epochs=1 --set rollout.replicas=3 --set rollout.maxReplicas=3 \
  --set rollout.speculation.freedDrafters=true --out "$out" > "$out.log" 2>&1
