#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite, plus lint and type checks of the package.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1  # see scripts/setup.sh: keep the repo root off sys.path
bash scripts/setup.sh --dev
.venv/bin/ruff check rhymerl operator workers tests
bash scripts/static_checks.sh  # mypy --strict and the import contracts (import-linter)
.venv/bin/python -m pytest -q "$@"
# the wheel as users get it (not editable), installed outside the checkout
bash scripts/wheel_check.sh
