#!/usr/bin/env bash
# Create .venv and install rhymerl into it (editable, native extensions built by pip).
#   bash scripts/setup.sh          runtime only
#   bash scripts/setup.sh --dev    plus test tools and the system services the tests start
set -euo pipefail
cd "$(dirname "$0")/.."
# The repository root holds operator/ (imported as rhymerl.operator): never let `python -m/-c`
# put the working directory on sys.path, where it would shadow the standard library's operator.
export PYTHONSAFEPATH=1
dev=0
[ "${1:-}" = "--dev" ] && dev=1

if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
# Install torch on its own first, pinned: a bare `torch` requirement lets the resolver pick the
# newest CUDA build (several GB) even on a CPU-only machine where a local 2.13.0 wheel is available.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q "torch==${TORCH_VERSION:-2.13.0}" 2>&1 | grep -v '^WARNING: Location' || true
fi
extras=""
[ $dev -eq 1 ] && extras="[dev]"
.venv/bin/pip install -q -e ".${extras}" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import rhymerl.workers, rhymerl.operator" 
echo "rhymerl installed in $(pwd)/.venv"
