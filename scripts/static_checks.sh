#!/usr/bin/env bash
# Type checks (mypy --strict) and the import contracts (import-linter, [tool.importlinter] in
# pyproject.toml) over the package as it is installed.
# setup.py maps operator/ and workers/ onto rhymerl.operator and rhymerl.workers; neither mypy nor
# import-linter can follow that mapping (to them `rhymerl.workers.x` would be a missing module, typed
# Any), so both run over a shadow tree whose rhymerl/ holds links to the files of rhymerl/,
# operator/ and workers/, and each native module as its .pyi stub. Paths in the output are the
# repository's.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
shadow="$(mktemp -d)"
trap 'rm -rf "$shadow"' EXIT
cp -rs "$repo/rhymerl" "$shadow/rhymerl"
cp -rs "$repo/operator" "$shadow/rhymerl/operator"
cp -rs "$repo/workers" "$shadow/rhymerl/workers"
find "$shadow/rhymerl" -name '__pycache__' -prune -exec rm -rf {} +
find "$shadow/rhymerl" -name '*.so' -delete
cd "$shadow"
status=0
"$repo/.venv/bin/mypy" --config-file "$repo/pyproject.toml" --cache-dir "$repo/.mypy_cache/shadow" rhymerl \
  | sed -e 's#^rhymerl/operator/#operator/#' -e 's#^rhymerl/workers/#workers/#' || status=1
find "$shadow/rhymerl" -name '*.pyi' -exec sh -c 'cp "$1" "${1%.pyi}.py"' _ {} \;
PYTHONPATH="$shadow" "$repo/.venv/bin/lint-imports" --no-logo --no-cache --config "$repo/pyproject.toml" \
  || status=1
exit $status
