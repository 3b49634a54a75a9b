#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite, plus lint and type checks of the package.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1  # see scripts/setup.sh: keep the repo root off sys.path
bash scripts/setup.sh --dev
.venv/bin/ruff check rhymerl operator workers tests
bash scripts/static_checks.sh  # mypy --strict and the import contracts (import-linter)
# pytest-xdist: a worker per core (at most 4); each file's tests stay on one worker (--dist loadfile), the
# files with slow tests first (tests/conftest.py). On two cores this uses the core a serial run leaves idle about half the time.
workers=$(nproc)
.venv/bin/python -m pytest -q -n $(( workers < 4 ? workers : 4 )) --dist loadfile --no-loadscope-reorder "$@"
# the wheel as users get it (not editable), installed outside the checkout
bash scripts/wheel_check.sh
