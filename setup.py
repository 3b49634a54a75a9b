"""Package layout (and, below, the native extensions), which pyproject.toml alone cannot express.

operator/ and workers/ sit at the top of the repository but import as rhymerl.operator and
rhymerl.workers, so neither can ever shadow the standard library's `operator`.
"""

import os

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import find_namespace_packages, setup

ROOTS = {"rhymerl": "rhymerl", "rhymerl.operator": "operator", "rhymerl.workers": "workers"}


def _packages() -> list[str]:
    """Every folder under the roots, data-only ones (assets, native sources) included: a package
    without __init__.py is still shipped, and setuptools has nothing to warn about."""
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"])
                  if all(part.isidentifier() for part in sub.split("."))]
    return sorted(set(found))


# The three translation units compile at once, both extensions side by side and the index's two files
# in parallel (pybind11's bindings take most of the time): a fresh setup and the wheel check each build them.
ParallelCompile("RHYMERL_BUILD_JOBS").install()
BUILD_JOBS = int(os.environ.get("RHYMERL_BUILD_JOBS") or os.cpu_count() or 1)

HISTORY_NATIVE = "rhymerl/algorithms/drafting/native"
MODEL_NATIVE = "workers/model/native"

setup(
    packages=_packages(),
    package_dir=ROOTS,
    ext_modules=[
        Pybind11Extension(
            "rhymerl.algorithms.drafting._suffix_index",
            [f"{HISTORY_NATIVE}/suffix_index.cpp", f"{HISTORY_NATIVE}/bindings.cpp"],
            depends=[f"{HISTORY_NATIVE}/suffix_index.hpp"],
            cxx_std=17,
            extra_compile_args=["-O3", "-g0"],
        ),
        Pybind11Extension(
            "rhymerl.workers.model._cached_attention",
            [f"{MODEL_NATIVE}/cached_attention.cpp"],
            cxx_std=17,
            # -Wno-psabi: the 64-byte vector helpers are inlined into per-ISA clones (avx512f, avx2,
            # default) chosen at load time, so no vector crosses an ABI boundary
            extra_compile_args=["-O3", "-g0", "-Wno-psabi"],
        ),
    ],
    options={"build_ext": {"parallel": BUILD_JOBS}},
)
