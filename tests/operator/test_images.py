"""images/: the Dockerfiles parse, build from files that exist, run `rhymerl` as a non-root user, and
build exactly the images that the chart, the spec's defaults and images/README.md name. (No Docker
daemon here: what needs one is left to a build.)"""

from __future__ import annotations

import io
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from helm_runner import CHART, REPO

from rhymerl.api.placement import WORKER_CPU_IMAGE, WORKER_GPU_IMAGE

IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("Dockerfile.*"))
KNOWN = {"FROM", "ARG", "RUN", "COPY", "ENV", "WORKDIR", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "LABEL"}
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _parse(path: Path) -> list[dict[str, Any]]:
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))  # read only: a path would be written to
    structure: list[dict[str, Any]] = parser.structure
    return [i for i in structure if i["instruction"] != "COMMENT"]


def _stages(instructions: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    stages: list[list[dict[str, Any]]] = []
    for i in instructions:
        if i["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(i)
    return stages


def _readme_images() -> dict[str, str]:
    """Dockerfile name -> image, from the table in images/README.md."""
    rows = re.findall(r"^\| `(Dockerfile\.[\w-]+)` \| `([^`]+)` \|", (IMAGES / "README.md").read_text(), re.M)
    return dict(rows)


def test_there_are_an_operator_a_cpu_worker_and_a_gpu_worker_dockerfile() -> None:
    assert [d.name for d in DOCKERFILES] == ["Dockerfile.operator", "Dockerfile.worker-cpu", "Dockerfile.worker-gpu"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[d.name for d in DOCKERFILES])
def test_a_dockerfile_uses_known_instructions_in_named_stages_and_ends_non_root(dockerfile: Path) -> None:
    instructions = _parse(dockerfile)
    assert {i["instruction"] for i in instructions} <= KNOWN
    stages = _stages(instructions)
    assert len(stages) >= 2, "multi-stage: a build stage makes the wheel, the runtime stage installs it"
    names = [re.split(r"\s+as\s+", s[0]["value"], flags=re.I) for s in stages]
    assert all(len(n) == 2 and n[1] for n in names), f"every stage is named: {names}"
    final = stages[-1]
    users = [i["value"] for i in final if i["instruction"] == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert users[-1].split(":")[0] == "10001", "the pod templates' runAsUser"
    entrypoints = [i["value"] for i in final if i["instruction"] == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ["rhymerl"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[d.name for d in DOCKERFILES])
def test_every_copy_source_exists_in_the_repository_or_an_earlier_stage(dockerfile: Path) -> None:
    instructions = _parse(dockerfile)
    stage_names: list[str] = []
    for i in instructions:
        if i["instruction"] == "FROM":
            stage_names.append(re.split(r"\s+as\s+", i["value"], flags=re.I)[-1].strip())
        if i["instruction"] != "COPY":
            continue
        words = i["value"].split()
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        sources = paths[:-1]
        assert sources, i["value"]
        from_stage = [f.split("=", 1)[1] for f in flags if f.startswith("--from=")]
        if from_stage:
            assert from_stage[0] in stage_names[:-1], f"COPY --from an earlier stage: {i['value']}"
            continue
        for source in sources:
            assert (REPO / source).exists(), f"{dockerfile.name}: COPY source {source} is not in the repository"


def test_the_build_context_keeps_what_the_wheel_needs() -> None:
    kept = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
            if line.startswith("!")}
    copied = {w.rstrip("/") for d in DOCKERFILES for i in _parse(d) if i["instruction"] == "COPY"
              and "--from" not in i["value"] for w in i["value"].split()[:-1]}
    assert copied == kept


def test_the_entrypoint_is_the_console_script_pyproject_declares() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["rhymerl"] == "rhymerl.cli.main:app"


def test_readme_chart_and_spec_name_the_images_these_dockerfiles_build() -> None:
    readme = _readme_images()
    assert set(readme) == {d.name for d in DOCKERFILES}
    assert all(image.endswith(f":{VERSION}") for image in readme.values()), "images are tagged with the version"
    for dockerfile, image in readme.items():  # each Dockerfile's own build command names its image
        assert f"-t {image} ." in (IMAGES / dockerfile).read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION
    assert f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}" == \
        readme["Dockerfile.operator"]
    assert (readme["Dockerfile.worker-cpu"], readme["Dockerfile.worker-gpu"]) == (WORKER_CPU_IMAGE, WORKER_GPU_IMAGE)


def test_the_operator_image_runs_a_rhymerl_command_with_the_flags_the_chart_passes() -> None:
    import typer.main

    from rhymerl.cli.main import app

    commands = {c.name for c in typer.main.get_command(app).commands.values()}  # type: ignore[attr-defined]
    cmd = [i["value"] for i in _parse(IMAGES / "Dockerfile.operator") if i["instruction"] == "CMD"]
    assert json.loads(cmd[-1]) == ["operator"] and "operator" in commands
    operator = typer.main.get_command(app).commands["operator"]  # type: ignore[attr-defined]
    flags = {opt for p in operator.params for opt in p.opts}
    template = (CHART / "templates" / "deployment.yaml").read_text()
    passed = set(re.findall(r"^\s+- (--[a-z-]+)$", template, re.M))
    assert passed and passed <= flags, f"the chart passes {sorted(passed - flags)}, which `rhymerl operator` lacks"
