# Sourced by the device scripts here: rhymerl built from this checkout on a GPU machine with no
# network (torch with CUDA preinstalled; pydantic and redis carried as wheels in .whl/), into
# /tmp/site on PYTHONPATH. The build's log lands in $OUT/build.log.
export PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site . \
  > "$OUT/build.log" 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
