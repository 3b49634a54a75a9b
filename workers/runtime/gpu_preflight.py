"""Whether a GPU pod can run what its image brings, decided before vLLM or Triton fail deep inside.

Two things a GPU image cannot carry: the node's NVIDIA driver, which must be new enough for the CUDA
the image's torch was built with (PyPI's torch 2.13 wheels: CUDA 13, an R580+ driver), and, in an
image that lacks them, the C compiler and Python headers Triton builds its CUDA launcher with at the
first kernel launch. Pure: gpu_probe.py gathers the facts; this says what is missing, in one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]

# NVIDIA CUDA Toolkit Release Notes, "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor
# Version Compatibility" (Linux x86_64): any driver of at least this runs every release of the major.
MINOR_COMPAT_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580"}
# Same notes, "CUDA Toolkit and Corresponding Driver Versions" (Linux x86_64, each minor's GA): the
# driver a toolkit release ships with; between this and the line above it runs under minor version
# compatibility (no JIT of PTX newer than the driver).
TOOLKIT_DRIVER: dict[tuple[int, int], str] = {
    (12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03", (12, 3): "545.23.06",
    (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03", (12, 8): "570.26",
    (12, 9): "575.51.03", (13, 0): "580.65.06",
}
VARIANTS = "images/README.md, 'CUDA variants'"
_DRIVER = re.compile(r"(?<![\d.])(\d{3,4})\.(\d{1,3})(?:\.(\d{1,3}))?(?![\d.])")


@dataclass(frozen=True)
class GpuFacts:
    """What a GPU pod found about itself (gpu_probe.py reads them)."""

    torch_version: str
    torch_cuda: str | None  # torch.version.cuda: None in a CPU-only build
    driver: str | None  # the text of /proc/driver/nvidia/version or nvidia-smi; None: neither found
    cc: str | None  # $CC as set, which Triton prefers to gcc and clang
    compiler: str | None  # the C compiler Triton would run, resolved on PATH; None: none
    python_include: str
    python_h: bool  # Python.h is in python_include, which Triton's launcher build includes


@dataclass(frozen=True)
class Verdict:
    problems: tuple[str, ...]
    notes: tuple[str, ...]


def version(text: str) -> Version:
    """'580.65.06' -> (580, 65, 6); missing parts are 0."""
    parts = [int(p) for p in text.split(".")[:3]] + [0, 0, 0]
    return parts[0], parts[1], parts[2]


def driver_string(text: str) -> str | None:
    """The driver version in `nvidia-smi --query-gpu=driver_version` output or /proc/driver/nvidia/version
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  ..."); None when it names none."""
    found = _DRIVER.search(text)
    return found[0] if found else None


def decide(facts: GpuFacts) -> Verdict:
    problems = [p for p in (_cuda_problem(facts), compiler_problem(facts.cc, facts.compiler)) if p]
    if facts.compiler and not facts.python_h:
        problems.append(f"no Python.h in {facts.python_include}: Triton's CUDA launcher includes Python's "
                        "headers (the python:*-slim base has them; a Debian python3 needs python3-dev)")
    return Verdict(tuple(problems), _notes(facts))


def _cuda_problem(facts: GpuFacts) -> str | None:
    if facts.torch_cuda is None:
        return (f"this image's torch {facts.torch_version} is built without CUDA: GPU roles run the worker-gpu "
                "image (spec.images.rollout/train)")
    if facts.driver is None:
        return ("no NVIDIA driver in this pod (neither /proc/driver/nvidia/version nor nvidia-smi): a pod that "
                "requests nvidia.com/gpu needs the node's driver exposed by its device plugin or GPU operator")
    driver = driver_string(facts.driver)
    if driver is None:
        return f"could not read the NVIDIA driver version from {facts.driver.strip()[:80]!r}"
    cuda = version(facts.torch_cuda)
    floor = MINOR_COMPAT_DRIVER.get(cuda[0])
    if floor is not None and version(driver) < version(floor):
        return (f"NVIDIA driver {driver} is too old for torch {facts.torch_version} (CUDA {facts.torch_cuda} "
                f"needs a driver >= {floor}, NVIDIA's minimum for CUDA {cuda[0]}.x): upgrade the GPU nodes' driver, "
                f"or run a worker-gpu image built for an older CUDA ({VARIANTS})")
    return None


def compiler_problem(cc: str | None, compiler: str | None) -> str | None:
    """What is wrong when Triton finds no compiler (`cc`: $CC as set, `compiler`: the one resolved)."""
    if compiler is not None:
        return None
    why = "Triton builds its CUDA launcher with it at the first kernel launch"
    if cc:
        return f"CC={cc}: no such compiler ({why})"
    return f"no C compiler ($CC, gcc or clang): {why}; the worker-gpu image installs gcc"


def _notes(facts: GpuFacts) -> tuple[str, ...]:
    if facts.torch_cuda is None or facts.driver is None:
        return ()
    driver = driver_string(facts.driver)
    cuda = version(facts.torch_cuda)
    shipped = TOOLKIT_DRIVER.get((cuda[0], cuda[1]))
    if driver is None:
        return ()
    if cuda[0] not in MINOR_COMPAT_DRIVER:
        return (f"CUDA {facts.torch_cuda}: no driver requirement known to this release; driver not checked",)
    if shipped is not None and version(MINOR_COMPAT_DRIVER[cuda[0]]) <= version(driver) < version(shipped):
        return (f"NVIDIA driver {driver} runs CUDA {facts.torch_cuda} under minor version compatibility "
                f"(its toolkit's driver is {shipped}): no JIT of newer PTX",)
    return ()


def failure(verdict: Verdict) -> str | None:
    """The one line a pod exits with, or None when nothing is missing."""
    return "GPU preflight: " + "; ".join(verdict.problems) if verdict.problems else None
