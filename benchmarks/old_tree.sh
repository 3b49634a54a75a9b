#!/usr/bin/env bash
# Build the `rhymerl` CLI of an older commit beside this checkout, for side-by-side benchmarks:
#   bash benchmarks/old_tree.sh c474982      # then: /tmp/rhymerl-c474982/rhymerl bench ...
# The commit's tree is checked out as a git worktree, its native extensions built in place with
# this checkout's venv, and its files linked as the installed package would lay them out
# (rhymerl/, operator/ -> rhymerl/operator, workers/ -> rhymerl/workers).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
rev="${1:?usage: old_tree.sh COMMIT}"
home="/tmp/rhymerl-$rev"
rm -rf "$home" && mkdir -p "$home"
git -C "$repo" worktree add -f "$home/tree" "$rev" -q
"$repo/.venv/bin/pip" install -q --target "$home/build-deps" pybind11 setuptools 2>&1 | grep -v WARNING || true
(cd "$home/tree" && PYTHONPATH="$home/build-deps" PYTHONSAFEPATH=1 "$repo/.venv/bin/python" setup.py -q build_ext --inplace)
cp -rs "$home/tree/rhymerl" "$home/shadow-rhymerl"
mkdir "$home/shadow" && mv "$home/shadow-rhymerl" "$home/shadow/rhymerl"
cp -rs "$home/tree/operator" "$home/shadow/rhymerl/operator"
cp -rs "$home/tree/workers" "$home/shadow/rhymerl/workers"
cat > "$home/rhymerl" <<SCRIPT
#!/usr/bin/env bash
cd /tmp && PYTHONSAFEPATH=1 PYTHONPATH="$home/shadow" exec "$repo/.venv/bin/python" -c "import sys; sys.argv[0] = 'rhymerl'; from rhymerl.cli.main import app; app()" "\$@"
SCRIPT
chmod +x "$home/rhymerl"
"$home/rhymerl" --version
echo "old CLI: $home/rhymerl (remove with: git -C $repo worktree remove --force $home/tree)"
