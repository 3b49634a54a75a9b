#!/usr/bin/env bash
# Build vLLM's suffix decoding (arctic-inference, the peer `rhymerl bench rollout --engine vllm`
# measures HistoSpec against) into .venv from its sdist. Its PyPI install fails here: pip's isolated
# build environment cannot resolve torch under this machine's pip constraints, and its CMake build
# looks for nanobind with the first python3 on PATH. So: the build tools into .venv, .venv/bin first
# on PATH, and no build isolation (it builds against .venv's torch). Needs `setup.sh --vllm` first.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/pip install -q nanobind grpcio-tools cmake 2>&1 | grep -v '^WARNING' || true
PATH="$(pwd)/.venv/bin:$PATH" .venv/bin/pip install -q --no-build-isolation --no-deps "arctic-inference==${ARCTIC_VERSION:-0.3.0}" \
  2>&1 | grep -v '^WARNING' || true
.venv/bin/python -c "import arctic_inference; print('arctic-inference', arctic_inference.__file__)"
