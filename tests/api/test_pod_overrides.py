"""spec.<role>.pod (rhymerl/api/pod.py) and the model/data sources (rhymerl/api/sources.py): Kubernetes'
shapes accepted as written, mistakes refused naming the field as the user wrote it (path and line), and
overrides that would undo the operator's own pod refused."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jobs import job_yaml

from rhymerl.api.crd import crd
from rhymerl.api.load import SpecError, parse_job
from rhymerl.api.pod import OPERATOR_MOUNT_PATHS, mount_path, reserved_clash
from rhymerl.api.sources import Source, parse

_job = partial(job_yaml, {"metadata": {"name": "j"}}, base="defaults")


def _problems(spec: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_job(_job(spec))
    return [f"{p.path}: {p.reason}" for p in caught.value.problems]


CLAIM = {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
MOUNT = {"name": "models", "mountPath": "/models", "readOnly": True}


def test_a_role_takes_kubernetes_shaped_volumes_env_and_init_containers_as_written() -> None:
    pod = {"volumes": [CLAIM, {"name": "code", "configMap": {"name": "rewards"}}],
           "volume_mounts": [MOUNT], "env": [{"name": "PYTHONPATH", "value": "/code"},
                                             {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
           "env_from": [{"secretRef": {"name": "s3-credentials"}}],
           "init_containers": [{"name": "warm", "image": "busybox:1.36", "command": ["true"]}],
           "labels": {"team": "rl"}, "annotations": {"example.com/owner": "me"}, "service_account_name": "reader",
           "priority_class_name": "high", "scheduler_name": "volcano",
           "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}}
    job = parse_job(_job({"train": {"pod": pod}}))
    dumped = job.spec.train.pod.model_dump(mode="json", exclude_none=True)
    assert dumped["volumes"] == pod["volumes"] and dumped["init_containers"] == pod["init_containers"]
    assert dumped["env"] == pod["env"] and dumped["affinity"] == pod["affinity"]


@pytest.mark.parametrize(("spec", "problem"), [
    ({"rollout": {"pod": {"volumes": [{"name": "data", "emptyDir": {}}]}}},
     "spec.rollout.pod.volumes.0.name: data is one of the operator's volumes"),
    ({"train": {"pod": {"volumes": [CLAIM], "volume_mounts": [MOUNT, {"name": "gone", "mountPath": "/x"}]}}},
     "spec.train.pod.volume_mounts.1.name: gone is not in volumes"),
    ({"train": {"pod": {"volumes": [CLAIM, CLAIM]}}}, "spec.train.pod.volumes.1.name: models is named twice"),
    ({"reward": {"pod": {"volumes": [{"name": "x", "emptyDir": {}, "secret": {"secretName": "s"}}]}}},
     "spec.reward.pod.volumes.0.name: volume x needs exactly one source"),
    ({"reward": {"pod": {"volumes": [{"name": "x", "emptyDri": {}}]}}},
     "spec.reward.pod.volumes.0.emptyDri: not a volume source"),
    ({"history": {"pod": {"volumes": [CLAIM], "volume_mounts": [{**MOUNT, "mountPath": "/tmp"}]}}},
     "spec.history.pod.volume_mounts.0.mountPath: /tmp is where the operator mounts its own volumes"),
    ({"history": {"pod": {"labels": {"app.kubernetes.io/component": "x"}}}},
     "spec.history.pod.labels: app.kubernetes.io/component is set by the operator"),
    ({"history": {"pod": {"annotations": {"rhymerl.io/spec-hash": "x"}}}},
     "spec.history.pod.annotations: rhymerl.io/spec-hash: the rhymerl.io/ prefix is the operator's"),
    ({"rollout": {"pod": {"env": [{"name": "RHYMERL_ROLE", "value": "train"}]}}},
     "spec.rollout.pod.env.0.name: RHYMERL_ROLE is set by the operator"),
    ({"rollout": {"pod": {"env": [{"name": "A", "value": "1", "valueFrom": {}}]}}},
     "spec.rollout.pod.env.0.valueFrom: give value or valueFrom, not both"),
    ({"rollout": {"pod": {"env_from": [{"prefix": "X_"}]}}},
     "spec.rollout.pod.env_from.0.configMapRef: give exactly one of configMapRef and secretRef"),
    ({"rollout": {"pod": {"init_containers": [{"name": "fetch", "image": "busybox"}]}}},
     "spec.rollout.pod.init_containers.0.name: fetch is one of the operator's containers"),
    ({"rollout": {"pod": {"init_containers": [{"name": "x", "image": "busybox",
                                               "securityContext": {"privileged": True}}]}}},
     "spec.rollout.pod.init_containers.0.securityContext.privileged: the job's pods run non-root"),
    ({"rollout": {"pod": {"init_containers": [{"name": "x", "image": "busybox",
                                               "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]}}},
     "spec.rollout.pod.init_containers.0.securityContext.capabilities: the job's pods drop every capability"),
    ({"controller": {"pod": {"service_account_name": "mine"}}},
     "spec.controller.pod.service_account_name: the controller runs as the job's own account"),
    ({"rollout": {"spot": {"enabled": True, "node_selector": {"pool": "spot"}},
                  "pod": {"affinity": {"nodeAffinity": {}}}}},
     "spec.rollout.pod.affinity.nodeAffinity: spot.node_selector sets the rollout pods' node affinity"),
    ({"train": {"resources": {"extra": {"nvidia.com/gpu": 1}}}},
     "spec.train.resources.extra: nvidia.com/gpu has its own field"),
    ({"train": {"resources": {"extra": {"rdma/hca": "1GB"}}}}, "spec.train.resources.extra.rdma/hca"),
    ({"model": {"path": "s3://A_bucket/x"}}, "spec.model.path: s3://A_bucket: not an S3 bucket name"),
    ({"model": {"path": "hf://Qwen/Qwen2.5-7B/extra"}}, "spec.model.path: hf://ORG/NAME: a model is a whole"),
    ({"data": {"source": "hf://Qwen/Qwen2.5-7B"}}, "spec.data.source: hf://: a model is hf://ORG/NAME"),
    ({"data": {"source": "s3://bucket"}}, "spec.data.source: s3://bucket: name the data file's key"),
    ({"data": {"source": "pvc://Bad_Claim/x.jsonl"}}, "spec.data.source: pvc://Bad_Claim: not a PersistentVolumeClaim"),
    ({"model": {"path": "ftp://host/model"}}, "spec.model.path: 'ftp://' is not a source"),
    ({"model": {"path": "s3://bucket/../etc"}}, "spec.model.path: s3 key: no '.' or '..' in the path"),
])
def test_a_mistake_is_refused_naming_the_field_as_written(spec: dict[str, Any], problem: str) -> None:
    found = _problems(spec)
    assert any(p.startswith(problem) for p in found), found


def test_a_refused_volume_names_its_line() -> None:
    text = _job({"rollout": {"pod": {"volumes": [{"name": "ok", "emptyDir": {}}, {"name": "spec", "emptyDir": {}}]}}})
    with pytest.raises(SpecError) as caught:
        parse_job(text)
    [problem] = caught.value.problems
    assert problem.path == "spec.rollout.pod.volumes.1.name"
    assert problem.line is not None
    assert text.splitlines()[problem.line - 1].strip() == "- name: spec"


@pytest.mark.parametrize(("text", "file", "parsed"), [
    ("builtin:tiny-arith", False, None),
    ("/models/qwen", False, None),
    ("s3://models/qwen/7b", False, Source("s3://models/qwen/7b", "s3", "models", "qwen/7b")),
    ("s3://models", False, Source("s3://models", "s3", "models", "")),
    ("s3://data/sets/math.jsonl", True, Source("s3://data/sets/math.jsonl", "s3", "data", "sets/math.jsonl")),
    ("hf://Qwen/Qwen2.5-7B", False, Source("hf://Qwen/Qwen2.5-7B", "hf", "Qwen/Qwen2.5-7B", "")),
    ("hf://Qwen/Qwen2.5-7B@v1.0", False, Source("hf://Qwen/Qwen2.5-7B@v1.0", "hf", "Qwen/Qwen2.5-7B", "", "v1.0")),
    ("hf://datasets/org/math@abc123/train/a.jsonl", True,
     Source("hf://datasets/org/math@abc123/train/a.jsonl", "hf", "org/math", "train/a.jsonl", "abc123", True)),
    ("pvc://weights/qwen", False, Source("pvc://weights/qwen", "pvc", "weights", "qwen")),
])
def test_a_source_parses_into_where_and_what(text: str, file: bool, parsed: Source | None) -> None:
    assert parse(text, file=file) == parsed


def test_the_data_files_name_is_the_last_part_of_its_path() -> None:
    assert (parse("s3://data/sets/math.jsonl", file=True) or Source("", "s3", "", "")).name == "math.jsonl"


def _arrays(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)] if node.get("type") == "array" else []
    for key, sub in node.get("properties", {}).items():
        out += _arrays(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        out += _arrays(node["items"], f"{path}[]")
    return out


def test_the_crd_keeps_the_deep_kubernetes_shapes_as_written_and_bounds_every_list_of_the_overrides() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for role in ("controller", "rollout", "train", "reward", "history"):
        pod = spec[role]["properties"]["pod"]
        assert pod["properties"]["volumes"]["items"]["x-kubernetes-preserve-unknown-fields"] is True
        assert pod["properties"]["initContainers"]["items"]["x-kubernetes-preserve-unknown-fields"] is True
        assert pod["properties"]["env"]["items"]["properties"]["valueFrom"]["x-kubernetes-preserve-unknown-fields"]
        assert all("maxItems" in node for _, node in _arrays(pod)), [p for p, n in _arrays(pod) if "maxItems" not in n]
        assert "maxProperties" in pod["properties"]["labels"] and "maxProperties" in pod["properties"]["annotations"]


SECRET = "s3cret-value"
SECRET_REF = {"secretKeyRef": {"name": "tokens", "key": "k"}}


def _refused(spec: dict[str, Any], sets: list[str] | None = None) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_job(_job({"spec": spec}), "job.yaml", sets)
    return caught.value


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID",
                                  "AWS_SESSION_TOKEN", "WANDB_API_KEY", "OPENAI_API_KEY", "AZURE_STORAGE_KEY",
                                  "AZURE_CLIENT_SECRET", "DB_PASSWORD"])
@pytest.mark.parametrize("role", ["controller", "rollout", "train", "reward", "history"])
def test_a_literal_credential_in_a_roles_env_is_refused_naming_its_field_and_never_shown(name: str, role: str) -> None:
    env = [{"name": "PYTHONPATH", "value": "/code"}, {"name": "HF_HOME", "value": "/tmp/hf"},
           {"name": name, "value": SECRET}]
    error = _refused({role: {"pod": {"env": env}}})
    [problem] = error.problems
    assert problem.path == f"spec.{role}.pod.env.2.value" and problem.line is not None
    assert f"{name} holds a credential" in problem.reason and "valueFrom.secretKeyRef" in problem.reason
    assert SECRET not in str(error) and SECRET not in str(error.__cause__)


def test_a_literal_credential_in_an_init_containers_env_is_refused_and_never_shown() -> None:
    init = {"name": "warm", "image": "busybox:1.36", "env": [{"name": "X", "value": "1"},
                                                            {"name": "GITHUB_TOKEN", "value": SECRET}]}
    error = _refused({"train": {"pod": {"init_containers": [init]}}})
    assert [p.path for p in error.problems] == ["spec.train.pod.init_containers.0.env.1.value"]
    assert SECRET not in str(error) and SECRET not in str(error.__cause__)


def test_a_credential_set_on_the_command_line_is_refused_without_showing_it_in_the_set_item() -> None:
    error = _refused({}, [f"rollout.pod.env=[{{name: HF_TOKEN, value: {SECRET}}}]"])
    assert [str(p) for p in error.problems] == [
        "spec.rollout.pod.env.0.value: HF_TOKEN holds a credential (by its name); a literal is stored in the RLJob, "
        "its ConfigMap and the pods' StatefulSet: take it from a Secret, with valueFrom.secretKeyRef (or the "
        "Secret's keys with envFrom.secretRef) (--set rollout.pod.env=***)"]


def test_a_credential_from_a_secret_a_file_path_or_another_variable_is_accepted() -> None:
    env = [{"name": "HF_TOKEN", "valueFrom": SECRET_REF}, {"name": "HF_TOKEN_PATH", "value": "/secrets/hf"},
           {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/secrets/google/key.json"},
           {"name": "WANDB_API_KEY", "value": "$(WANDB_KEY_FROM_SECRET)"}, {"name": "OPENAI_API_KEY", "value": ""}]
    assert len(parse_job(_job({"rollout": {"pod": {"env": env}}})).spec.rollout.pod.env) == 5


@pytest.mark.parametrize(("path", "clash"), [
    ("/tmp/", "is /tmp as a container runtime reads it"),
    ("/tmp/.", "is /tmp as a container runtime reads it"),
    ("//tmp", "is /tmp as a container runtime reads it"),
    ("/var/../tmp", "is /tmp as a container runtime reads it"),
    ("/etc/rhymerl/../rhymerl//", "is /etc/rhymerl as a container runtime reads it"),
    ("/tmp/models", "is inside /tmp"),
    ("/var/lib/rhymerl/fetched", "is inside /var/lib/rhymerl"),
    ("/var", "contains /var/lib/rhymerl"),
    ("/mnt", "contains /mnt/rhymerl-cache"),  # the first of the reserved paths under it
    ("//", "contains /dev/shm"),
])
def test_a_mount_that_meets_the_operators_however_spelled_is_refused_naming_the_field(path: str, clash: str) -> None:
    found = _problems({"rollout": {"pod": {"volumes": [CLAIM], "volume_mounts": [{**MOUNT, "mountPath": path}]}}})
    assert found == [f"spec.rollout.pod.volume_mounts.0.mountPath: {path} {clash}, where the operator mounts its own "
                     "volumes; mount it elsewhere (e.g. /models or /opt/code)"]


def test_two_spellings_of_one_mount_path_are_one_path_named_twice() -> None:
    mounts = [MOUNT, {**MOUNT, "mountPath": "/models/./"}]
    found = _problems({"train": {"pod": {"volumes": [CLAIM], "volume_mounts": mounts}}})
    assert found == ["spec.train.pod.volume_mounts.1.mountPath: /models is named twice"]


def test_a_mount_beside_the_operators_is_accepted() -> None:
    for path in ("/var/lib/rhymerl-models", "/etc/rhymerlx", "/opt/code", "/mnt/models", "/var/lib/other"):
        job = parse_job(_job({"train": {"pod": {"volumes": [CLAIM], "volume_mounts": [{**MOUNT, "mountPath": path}]}}}))
        assert job.spec.train.pod.volume_mounts[0].mountPath == path


def _resolved(path: str) -> tuple[str, ...]:
    """The directories a path walks through from the root, by brute force: each part in turn."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            parts = parts[:-1]
        elif part not in ("", "."):
            parts.append(part)
    return tuple(parts)


_PART = st.sampled_from(["", ".", "..", "tmp", "var", "lib", "rhymerl", "etc", "dev", "shm", "mnt", "rhymerl-source",
                         "run", "ray", "models", "tmpx"])


@given(st.lists(_PART, max_size=8), st.sampled_from(["/", "//", "///"]))
def test_a_mount_path_reads_as_the_brute_force_walk_and_is_refused_exactly_when_it_meets_a_reserved_one(
        parts: list[str], lead: str) -> None:
    path = lead + "/".join(parts)
    walked = _resolved(path)
    assert mount_path(path) == "/" + "/".join(walked)
    meets = any(walked[:len(r)] == r or r[:len(walked)] == walked
                for r in (_resolved(p) for p in OPERATOR_MOUNT_PATHS))
    assert (reserved_clash(path) is not None) == meets


@pytest.mark.parametrize(("field", "source", "shown"), [
    ("model", f"s3://AKIAEXAMPLE:{SECRET}@models/qwen", "s3://AKIAEXAMPLE:***@models/qwen"),
    ("model", f"hf://{SECRET}@Qwen/Qwen2.5-7B", "hf://***@Qwen/Qwen2.5-7B"),
    ("data", f"s3://sets/math.jsonl?X-Amz-Signature={SECRET}", "s3://sets/math.jsonl?X-Amz-Signature=***"),
    ("data", f"pvc://u:{SECRET}@claim/math.jsonl", "pvc://u:***@claim/math.jsonl"),
])
def test_a_source_carrying_a_credential_is_refused_showing_it_masked(field: str, source: str, shown: str) -> None:
    key = "path" if field == "model" else "source"
    for error in (_refused({field: {key: source}}), _refused({}, [f"{field}.{key}={source}"])):
        [problem] = error.problems
        assert problem.path == f"spec.{field}.{key}"
        assert problem.reason.startswith(f"{shown}: no credentials in a source")
        assert SECRET not in str(error) and SECRET not in str(error.__cause__)


def test_a_scheme_that_is_not_one_is_named_only_when_it_looks_like_one() -> None:
    assert _problems({"model": {"path": "ftp://host/m"}})[0].startswith("spec.model.path: 'ftp://' is not a source")
    found = _problems({"model": {"path": f"k:{SECRET}@ftp://host/m"}})
    assert found[0].startswith("spec.model.path: that is not a source") and SECRET not in found[0]
