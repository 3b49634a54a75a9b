"""spec.<role>.pod (rhymerl/api/pod.py) and the model/data sources (rhymerl/api/sources.py): Kubernetes'
shapes accepted as written, mistakes refused naming the field as the user wrote it (path and line), and
overrides that would undo the operator's own pod refused."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from rhymerl.api.crd import crd
from rhymerl.api.load import SpecError, parse_job
from rhymerl.api.sources import Source, parse


def _job(spec: dict[str, Any]) -> str:
    return yaml.safe_dump({"apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "j"},
                           "spec": spec}, sort_keys=False)


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
