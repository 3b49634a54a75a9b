#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite, plus lint and type checks of the package.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1  # see scripts/setup.sh: keep the repo root off sys.path
bash scripts/setup.sh --dev
.venv/bin/ruff check rhymerl operator workers tests
# mypy --strict with the import contracts (import-linter), then the wheel as users get it (not editable,
# installed outside the checkout), run beside pytest in a session of their own: each is one process at a
# time, and they use the CPU that pytest's scenarios leave idle while their processes start and wait
# (README: the suite's time). Their output follows pytest's; either failing fails the command.
side="$(mktemp -d)"
setsid bash -c 'status=0
  bash scripts/static_checks.sh || status=1
  bash scripts/wheel_check.sh || status=1
  exit $status' > "$side/log" 2>&1 &
side_pid=$!
trap 'kill -TERM -- -$side_pid 2>/dev/null || true; rm -rf "$side"' EXIT
# pytest-xdist: a worker per core (at most 4); each file's tests stay on one worker (--dist loadfile), the
# files with slow tests first (tests/conftest.py). On two cores this uses the core a serial run leaves idle about half the time.
workers=$(nproc)
tests=0
.venv/bin/python -m pytest -q -n $(( workers < 4 ? workers : 4 )) --dist loadfile --no-loadscope-reorder "$@" || tests=$?
checks=0
wait $side_pid || checks=$?
echo "--- type checks, import contracts and the wheel check (run beside pytest)"
cat "$side/log"
exit $(( tests != 0 ? tests : checks ))
