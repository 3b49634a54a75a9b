"""What a job's fetched model and data take of a node, as the rendered pods say it: the data volume of a
stateless pod (an emptyDir) has a sizeLimit and its container requests that much ephemeral storage, so the
scheduler places it and the kubelet evicts it rather than fill the node; a pvc:// source's claim is mounted
read-only, in the fetch step only, and only where that pod fetches from it."""

from __future__ import annotations

from typing import Any

from jobs import make_job

from rhymerl.operator.manifests import desired
from rhymerl.operator.manifests.storage import DATA_ALLOWANCE_GI, MODEL_ALLOWANCE_GI

EPHEMERAL = "ephemeral-storage"


def _pods(**spec: Any) -> dict[str, dict[str, Any]]:
    job = make_job({"metadata": {"name": "j", "namespace": "ns"}, "spec": spec}, base="defaults")
    return {o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]["spec"]
            for o in desired(job, None) if o["kind"] == "StatefulSet"}


def _volume(pod: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((v for v in pod["volumes"] if v["name"] == name), None)


def _role(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(pod["containers"][0])


FETCHED = {"model": {"path": "hf://Qwen/Qwen2.5-0.5B-Instruct"}, "data": {"source": "s3://prompts/math.jsonl"},
           "reward": {"replicas": 1}}


def test_a_rollout_pod_that_fetches_the_model_limits_its_data_volume_and_requests_that_much_disk() -> None:
    rollout = _pods(**FETCHED)["rollout"]
    size = f"{MODEL_ALLOWANCE_GI + DATA_ALLOWANCE_GI}Gi"
    assert _volume(rollout, "data") == {"name": "data", "emptyDir": {"sizeLimit": size}}
    resources = _role(rollout)["resources"]
    assert resources["requests"][EPHEMERAL] == size
    assert EPHEMERAL not in resources["limits"]  # /tmp (caches, Ray's logs) may use more; the node evicts on pressure


def test_a_pod_that_fetches_only_the_data_file_reserves_the_data_allowance() -> None:
    pods = _pods(**FETCHED)
    for role in ("reward", "history"):
        assert _volume(pods[role], "data") == {"name": "data", "emptyDir": {"sizeLimit": f"{DATA_ALLOWANCE_GI}Gi"}}
        assert _role(pods[role])["resources"]["requests"][EPHEMERAL] == f"{DATA_ALLOWANCE_GI}Gi"


def test_a_roles_stated_ephemeral_storage_sizes_its_data_volume_and_is_requested_and_limited() -> None:
    rollout = _pods(**{**FETCHED, "rollout": {"resources": {"extra": {EPHEMERAL: "200Gi"}}}})["rollout"]
    assert _volume(rollout, "data") == {"name": "data", "emptyDir": {"sizeLimit": "200Gi"}}
    resources = _role(rollout)["resources"]
    assert (resources["requests"][EPHEMERAL], resources["limits"][EPHEMERAL]) == ("200Gi", "200Gi")


def test_pods_that_fetch_nothing_or_keep_their_data_on_a_claim_get_no_disk_reservation() -> None:
    plain = _pods()
    assert _volume(plain["rollout"], "data") == {"name": "data", "emptyDir": {}}
    assert EPHEMERAL not in _role(plain["rollout"])["resources"]["requests"]
    fetched = _pods(**FETCHED)
    for role in ("controller", "train"):  # the data volume is the role's checkpoint claim (checkpoint.storage)
        assert _volume(fetched[role], "data") is None
        assert EPHEMERAL not in _role(fetched[role])["resources"]["requests"]


def test_a_pvc_source_is_mounted_read_only_in_the_fetch_step_only_of_the_pods_that_fetch_from_it() -> None:
    pods = _pods(model={"path": "pvc://models/qwen"}, data={"source": "s3://prompts/math.jsonl"}, reward={"replicas": 1})
    for role in ("controller", "rollout", "train"):
        pod = pods[role]
        assert _volume(pod, "fetch-source-0") == {
            "name": "fetch-source-0", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
        fetch = pod["initContainers"][0]
        mounts = [m for m in fetch["volumeMounts"] if m["name"] == "fetch-source-0"]
        assert mounts == [{"name": "fetch-source-0", "mountPath": "/mnt/rhymerl-source/models", "readOnly": True}]
        assert all(m["name"] != "fetch-source-0" for m in _role(pod)["volumeMounts"])
    for role in ("reward", "history"):  # they read the data file only: the model's claim is not theirs to attach
        assert _volume(pods[role], "fetch-source-0") is None
