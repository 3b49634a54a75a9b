#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh venv outside the checkout and run the
# installed console script from a neutral folder: validate, a one-step job, a tiny schedule bench.
# Catches what editable installs hide (a package folder missing from the wheel, assets not shipped).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$repo/.venv/bin/pip" wheel -q --no-deps -w "$work/dist" "$repo" 2>&1 | grep -v '^WARNING: Location' || true
"${PYTHON:-python3}" -m venv "$work/venv"
# The venv is thrown away after: pip compiles no bytecode (every file, one at a time), and the check's
# processes write what they compile (the modules they import), so each is compiled once.
unset PYTHONDONTWRITEBYTECODE
"$work/venv/bin/pip" install -q --no-compile "torch==${TORCH_VERSION:-2.13.0}" 2>&1 | grep -v '^WARNING: Location' || true
"$work/venv/bin/pip" install -q --no-compile "$work"/dist/rhymerl-*.whl 2>&1 | grep -v '^WARNING: Location' || true
cd "$work"
bin="$work/venv/bin/rhymerl"
"$bin" --version
# every module of the installed package imports (a folder left out of the wheel, a missing data file)
"$work/venv/bin/python" -c "
import importlib, pkgutil, rhymerl
names = [m.name for m in pkgutil.walk_packages(rhymerl.__path__, 'rhymerl.')]
for name in names:
    importlib.import_module(name)
assert len(names) > 100, names
print(f'{len(names)} modules import from the wheel')"
"$bin" validate "$repo/examples/quickstart.yaml"
"$bin" run "$repo/examples/quickstart.yaml" --out "$work/run" --set data.num_prompts=2 \
  --set algorithm.prompts_per_step=2 --set algorithm.group_size=2 --set algorithm.epochs=1 \
  --set algorithm.max_response_length=32
test -f "$work/run/checkpoints/step_000001/manifest.json"
"$bin" bench schedule --trace synthetic:math --workers 2 --groups 2 --steps 1 \
  --synthetic prompts_per_step=8 --synthetic steps=3 --out "$work/bench" > /dev/null
test -f "$work/bench/results.json"
echo "wheel check passed: the installed wheel validates, runs a job and a bench outside the checkout"
