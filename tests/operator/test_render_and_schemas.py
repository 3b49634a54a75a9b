"""`rhymerl render` and the chart produce objects that Kubernetes 1.29 through 1.34 accept
(kubernetes-validate, strict: unknown fields are errors), and every example RLJob fits our CRD's schema."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_runner import REPO, VARIANTS
from jobs import job_yaml
from kubernetes_validate.utils import all_versions, major_minor

from rhymerl.api import load_job
from rhymerl.api.crd import crd
from rhymerl.operator.manifests import desired

KUBERNETES = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34")
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
OURS = {("monitoring.coreos.com/v1", "ServiceMonitor")}  # not Kubernetes' own: checked in test_chart.py
SCRIPT = Path(sys.executable).parent / "rhymerl"


def rhymerl(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-P", "-m", "rhymerl.cli.main"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


def _problems(objects: list[dict[str, Any]]) -> list[str]:
    problems = []
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in OURS:
            continue
        for version in KUBERNETES:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                problems.append(f"{version} {obj['kind']}/{obj['metadata']['name']}: {where}: {exc.message}")
    return problems


def test_the_installed_kubernetes_validate_has_schemas_for_1_29_through_1_34() -> None:
    assert set(KUBERNETES) <= {major_minor(v) for v in all_versions()}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    out = {}
    for example in EXAMPLES:
        res = rhymerl("render", str(example))
        assert res.returncode == 0, res.stderr
        out[example.name] = [doc for doc in yaml.safe_load_all(res.stdout) if doc]
    return out


def test_render_prints_the_builders_objects_for_every_example(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert set(rendered) == {e.name for e in EXAMPLES} and len(EXAMPLES) >= 3
    for example in EXAMPLES:
        assert rendered[example.name] == desired(load_job(example), None)


@pytest.mark.parametrize("example", [e.name for e in EXAMPLES])
def test_rendered_examples_validate_against_kubernetes_1_29_to_1_34(
        example: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert _problems(rendered[example]) == []


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_chart_validates_against_kubernetes_1_29_to_1_34(variant: str,
                                                             chart: dict[str, list[dict[str, Any]]]) -> None:
    assert _problems(chart[variant]) == []


def test_the_validation_catches_a_broken_object(rendered: dict[str, list[dict[str, Any]]]) -> None:
    broken = next(o for o in rendered["quickstart.yaml"] if o["kind"] == "StatefulSet")
    broken = {**broken, "spec": {**broken["spec"], "replica": 3}}
    assert len(_problems([broken])) == len(KUBERNETES)


def test_render_refuses_a_bad_job_with_one_line_and_exit_2(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(job_yaml("metadata.name=Bad.Name", base="defaults"))
    res = rhymerl("render", str(job))
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith(f"error: {job}: metadata.name")


def test_render_applies_set_overrides() -> None:
    res = rhymerl("render", str(REPO / "examples" / "quickstart.yaml"), "--set", "spec.suspend=true")
    assert res.returncode == 0, res.stderr
    sets = [d for d in yaml.safe_load_all(res.stdout) if d and d["kind"] == "StatefulSet"]
    assert [s["spec"]["replicas"] for s in sets] == [0] * 5


def _json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """A structural OpenAPI v3 node as JSON Schema draft 4, strict like `kubectl apply --validate=strict`:
    nullable -> null allowed, int-or-string -> either, unknown fields refused."""
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes") and k not in {"nullable", "default"}}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "properties" in node:
        out["properties"] = {k: _json_schema(v) for k, v in node["properties"].items()}
        out["additionalProperties"] = bool(node.get("x-kubernetes-preserve-unknown-fields"))
    elif isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _json_schema(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        out["items"] = _json_schema(node["items"])
    return out


CRD_SCHEMA = _json_schema(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
CRD_SCHEMA["properties"]["metadata"]["additionalProperties"] = True


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_every_example_rljob_fits_the_crd_schema(example: Path) -> None:
    as_written = yaml.safe_load(example.read_text())
    resolved = load_job(example).model_dump(mode="json", by_alias=True)
    jsonschema.Draft4Validator(CRD_SCHEMA).validate(as_written)
    jsonschema.Draft4Validator(CRD_SCHEMA).validate(resolved)


def test_the_crd_schema_refuses_an_unknown_field_and_a_value_out_of_bounds() -> None:
    validator = jsonschema.Draft4Validator(CRD_SCHEMA)
    base = {"apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "x"}}
    assert not list(validator.iter_errors({**base, "spec": {"rollout": {"replicas": 2}}}))
    assert list(validator.iter_errors({**base, "spec": {"rolout": {"replicas": 2}}}))
    assert list(validator.iter_errors({**base, "spec": {"rollout": {"replicas": 0}}}))
