"""The I/O side of gpu_preflight.py: read what a GPU pod has (driver, torch's CUDA, C compiler,
Python headers) and refuse to start with one plain line when something is missing, instead of
vLLM's or Triton's traceback minutes later. `python -m rhymerl.workers.runtime.gpu_probe
--build-check` is the image build's half: it compiles a module the way Triton builds its CUDA
launcher (no GPU needed); the kernel launch itself needs a GPU, so the pod's preflight covers it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from rhymerl.api import RLJob
from rhymerl.api.roles import Role
from rhymerl.errors import UserError
from rhymerl.workers.runtime.gpu_preflight import GpuFacts, compiler_problem, decide, failure

SKIP_ENV = "RHYMERL_SKIP_GPU_PREFLIGHT"
PROC_VERSION = Path("/proc/driver/nvidia/version")
_CHECK_MODULE = "rhymerl_cc_check"
_CHECK_SOURCE = f"""#include "cuda.h"
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "{_CHECK_MODULE}", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit_{_CHECK_MODULE}(void) {{ return PyModule_Create(&module); }}
"""


class GpuPreflightError(UserError):
    """A GPU pod that lacks what its image needs from the node or from itself."""


def needs_preflight(job: RLJob, role: Role) -> bool:
    """Rollout and train pods that request GPUs, unless RHYMERL_SKIP_GPU_PREFLIGHT=1."""
    if os.environ.get(SKIP_ENV) == "1":
        return False
    gpus = {"rollout": job.spec.rollout.resources.gpu, "train": job.spec.train.resources.gpu}
    return gpus.get(role, 0) > 0


def preflight(job: RLJob, role: Role) -> None:
    """Raise GpuPreflightError (exit 2, one line) when this GPU pod cannot run its role; print notes."""
    if not needs_preflight(job, role):
        return
    verdict = decide(facts())
    for note in verdict.notes:
        print(f"{role}: {note}", flush=True)
    line = failure(verdict)
    if line is not None:
        raise GpuPreflightError(line)


def facts() -> GpuFacts:
    import torch

    include = python_include()
    return GpuFacts(torch_version=torch.__version__, torch_cuda=torch.version.cuda, driver=driver_text(),
                    cc=os.environ.get("CC"), compiler=c_compiler(), python_include=include,
                    python_h=(Path(include) / "Python.h").is_file())


def driver_text() -> str | None:
    """/proc/driver/nvidia/version (the loaded kernel module), else nvidia-smi's driver_version; None: neither."""
    try:
        return PROC_VERSION.read_text()
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and done.stdout.strip() else None


def c_compiler() -> str | None:
    """The compiler Triton's runtime/build.py would run: $CC, else gcc, else clang (None: not found)."""
    cc = os.environ.get("CC")
    if cc is not None:
        return shutil.which(cc)
    return shutil.which("gcc") or shutil.which("clang")


def python_include() -> str:
    """Python's include folder as Triton finds it (Debian's posix_local scheme read as posix_prefix)."""
    scheme = sysconfig.get_default_scheme()
    return sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]


def build_check() -> str:
    """Compile and load a Python module with Triton's own builder and its CUDA headers, as Triton builds
    its launcher (the link against libcuda.so.1 and the launch are left to a GPU); the compiler used."""
    from triton.runtime.build import compile_module_from_src

    compiler = c_compiler()
    if compiler is None:
        raise GpuPreflightError(f"GPU build check: {compiler_problem(os.environ.get('CC'), None)}")
    include = Path(sys.modules["triton"].__file__ or "").parent / "backends" / "nvidia" / "include"
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            module = compile_module_from_src(_CHECK_SOURCE, _CHECK_MODULE, include_dirs=[str(include)])
        except subprocess.CalledProcessError as exc:
            raise GpuPreflightError(f"GPU build check: {compiler} could not build a module as Triton builds its "
                                    f"CUDA launcher (exit {exc.returncode}; {python_include()}/Python.h and the "
                                    "C library's headers are needed)") from None
    if module.__name__ != _CHECK_MODULE:
        raise GpuPreflightError(f"Triton's builder loaded {module.__name__}, not {_CHECK_MODULE}")
    return compiler


def main(argv: list[str]) -> int:
    if argv != ["--build-check"]:
        print("usage: python -m rhymerl.workers.runtime.gpu_probe --build-check", file=sys.stderr)
        return 2
    try:
        compiler = build_check()
    except UserError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    print(f"gpu build check: {compiler} builds Triton's CUDA launcher module", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
