#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite, plus lint and type checks of the package.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
.venv/bin/ruff check rhymerl operator workers tests
.venv/bin/mypy rhymerl operator workers
.venv/bin/python -m pytest -q "$@"
