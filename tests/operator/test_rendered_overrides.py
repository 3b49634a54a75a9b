"""spec.<role>.pod and the fetch step in the rendered StatefulSets (operator/manifests/pods.py, containers.py): the
overrides land where Kubernetes reads them, beside the operator's own settings and never over them; the
names the spec reserves (rhymerl/api/pod.py) are the ones the builders use; the fetched sources are
where the pods' spec points; and examples/cluster.yaml meets the chart's Redis."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_runner import CHART, REPO, run_helm
from jobs import job_dict, make_job
from pydantic import ValidationError

from rhymerl.api import RLJob, load_job
from rhymerl.api.blocks import MAX_REPLICAS
from rhymerl.api.k8s_values import dns1123_label, dns1123_subdomain, label_value, qualified_name
from rhymerl.api.load import SpecError, parse_job
from rhymerl.api.pod import (
    OPERATOR_CONTAINERS,
    OPERATOR_ENV,
    OPERATOR_ENV_PREFIXES,
    OPERATOR_LABELS,
    OPERATOR_MOUNT_PATHS,
    OPERATOR_VOLUMES,
    mount_path,
)
from rhymerl.api.roles import ROLES
from rhymerl.api.spec import MAX_JOB_NAME
from rhymerl.cli.report import error_lines
from rhymerl.operator.manifests import desired
from rhymerl.operator.manifests.access import ray_token_secret
from rhymerl.operator.manifests.roles import FETCH_DIR
from rhymerl.operator.reconcile.validate import parse as parse_stored

EXTRA = {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
POD = {"volumes": [EXTRA], "volume_mounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
       "env": [{"name": "PYTHONPATH", "value": "/models/code"}], "env_from": [{"secretRef": {"name": "s3"}}],
       "labels": {"team": "rl"}, "annotations": {"example.com/owner": "me"},
       "priority_class_name": "high", "scheduler_name": "volcano",
       "init_containers": [{"name": "warm", "image": "busybox:1.36", "command": ["true"]}],
       "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
           {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}}


_job = partial(make_job, {"metadata": {"name": "j", "namespace": "ns"}}, base="defaults")


def _pods(job: RLJob) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"].removeprefix("j-"): o["spec"]["template"] for o in desired(job, None)
            if o["kind"] == "StatefulSet"}


def test_the_overrides_appear_in_the_roles_pod_template_beside_the_operators_own() -> None:
    job = _job({"train": {"pod": {**POD, "service_account_name": "reader"}, "resources": {"extra": {"rdma/hca": 1}}}})
    template = _pods(job)["train"]
    pod, container = template["spec"], template["spec"]["containers"][0]
    assert template["metadata"]["labels"]["team"] == "rl"
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "train"
    assert template["metadata"]["annotations"]["example.com/owner"] == "me"
    assert "rhymerl.io/spec-hash" in template["metadata"]["annotations"]
    assert pod["volumes"][-1] == EXTRA and {v["name"] for v in pod["volumes"]} >= {"spec", "scratch", "ray-token"}
    assert container["volumeMounts"][-1] == {"name": "models", "mountPath": "/models", "readOnly": True}
    assert container["env"][-1] == {"name": "PYTHONPATH", "value": "/models/code"}
    assert container["envFrom"] == [{"secretRef": {"name": "s3"}}]
    assert pod["serviceAccountName"] == "reader" and pod["automountServiceAccountToken"] is True
    assert pod["priorityClassName"] == "high" and pod["schedulerName"] == "volcano"
    assert [c["name"] for c in pod["initContainers"]] == ["warm"]  # no fetch step: the model is builtin
    assert pod["affinity"] == POD["affinity"]
    assert container["resources"]["requests"]["rdma/hca"] == container["resources"]["limits"]["rdma/hca"] == "1"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    untouched = _pods(job)["rollout"]["spec"]
    assert "initContainers" not in untouched and "envFrom" not in untouched["containers"][0]
    assert untouched["automountServiceAccountToken"] is False


def test_the_spot_node_affinity_and_a_pod_anti_affinity_of_the_rollout_pods_combine() -> None:
    job = _job({"rollout": {"spot": {"enabled": True, "node_selector": {"pool": "spot"}},
                            "pod": {"affinity": POD["affinity"]}}})
    affinity = _pods(job)["rollout"]["spec"]["affinity"]
    assert set(affinity) == {"nodeAffinity", "podAntiAffinity"}


def test_the_names_the_spec_reserves_are_the_ones_the_builders_use() -> None:
    job = _job("model.path=pvc://weights/tiny", "data.source=pvc://sets/math.jsonl", "rollout.resources.gpu=1")
    for template in _pods(job).values():
        pod = template["spec"]
        containers = pod["containers"] + pod.get("initContainers", [])
        assert set(template["metadata"]["labels"]) <= OPERATOR_LABELS
        assert {v["name"] for v in pod["volumes"]} <= OPERATOR_VOLUMES
        assert {c["name"] for c in containers} <= OPERATOR_CONTAINERS
        for container in containers:
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert all(m in OPERATOR_MOUNT_PATHS or m.rsplit("/", 1)[0] in OPERATOR_MOUNT_PATHS for m in mounts)
            names = {e["name"] for e in container["env"]}
            assert all(n in OPERATOR_ENV or n.startswith(OPERATOR_ENV_PREFIXES) for n in names), names


def test_a_fetched_model_and_data_get_a_fetch_step_and_the_pods_spec_points_at_the_fetched_copies() -> None:
    job = _job("model.path=s3://models/qwen", "data.source=pvc://sets/train/math.jsonl",
               {"rollout": {"pod": {"env_from": [{"secretRef": {"name": "s3"}}]}}})
    pods = _pods(job)
    for role in ROLES:
        pod = pods[role]["spec"]
        fetch = pod["initContainers"][0]
        assert fetch["name"] == "fetch" and fetch["image"] == pod["containers"][0]["image"]
        model = ["--model", "s3://models/qwen"] if role in ("controller", "rollout", "train") else []
        assert fetch["args"] == ["fetch", "--into", FETCH_DIR, *model, "--data", "pvc://sets/train/math.jsonl"]
        assert {"name": "fetch-source-0", "mountPath": "/mnt/rhymerl-source/sets", "readOnly": True} \
            in fetch["volumeMounts"]
        assert {"name": "data", "mountPath": "/var/lib/rhymerl"} in fetch["volumeMounts"]
        assert {"name": "fetch-source-0", "persistentVolumeClaim": {"claimName": "sets", "readOnly": True}} \
            in pod["volumes"]
        assert all(m["name"] != "fetch-source-0" for m in pod["containers"][0]["volumeMounts"])  # the role: never
        assert "nvidia.com/gpu" not in fetch["resources"]["requests"]
    assert pods["rollout"]["spec"]["initContainers"][0]["envFrom"] == [{"secretRef": {"name": "s3"}}]
    config = next(o for o in desired(job, None) if o["kind"] == "ConfigMap")
    resolved = parse_job(config["data"]["spec.yaml"])
    assert resolved.spec.model.path == f"{FETCH_DIR}/model"
    assert resolved.spec.data.source == f"{FETCH_DIR}/data/math.jsonl"


def test_a_job_with_every_override_and_a_fetch_step_is_valid_kubernetes_1_29_and_1_34() -> None:
    job = _job("model.path=hf://Qwen/Qwen2.5-0.5B", "data.source=s3://sets/math.jsonl",
               {"reward": {"function": "my:fn", "pod": POD, "resources": {"extra": {"rdma/hca": 1}}},
                "train": {"pod": {**POD, "service_account_name": "reader"}}})
    for obj in desired(job, None):
        for version in ("1.29", "1.34"):
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_cluster_example_names_the_charts_redis_service_and_secret_in_the_jobs_namespace(helm: Path) -> None:
    """Installed as the example says (release rhymerl in the job's namespace, redis.enabled=true and no
    password: the operator creates the Secret the Redis pod names, operator/reconcile/redis_secret.py)."""
    job = load_job(REPO / "examples" / "cluster.yaml")
    res = run_helm(helm, "template", "rhymerl", str(CHART), "--namespace", str(job.metadata.namespace),
                   "--set", "redis.enabled=true")
    assert res.returncode == 0, res.stderr
    chart = [d for d in yaml.safe_load_all(res.stdout) if d]
    service = next(d for d in chart if d["kind"] == "Service" and d["metadata"]["name"].endswith("-redis"))
    redis = next(d for d in chart if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-redis"))
    [env] = redis["spec"]["template"]["spec"]["containers"][0]["env"]
    operator = next(d for d in chart if d["kind"] == "Deployment" and d is not redis)
    made = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    history = job.spec.history
    name, port = service["metadata"]["name"], service["spec"]["ports"][0]["port"]
    assert history.redis_url == f"redis://{name}.{service['metadata']['namespace']}.svc:{port}/0"
    assert service["metadata"]["namespace"] == redis["metadata"]["namespace"] == job.metadata.namespace
    assert history.redis_password_secret is not None
    ref = (history.redis_password_secret.name, history.redis_password_secret.key)
    assert ref == (env["valueFrom"]["secretKeyRef"]["name"], env["valueFrom"]["secretKeyRef"]["key"])
    assert ref == (made["RHYMERL_REDIS_SECRET"], made["RHYMERL_REDIS_SECRET_KEY"]), "the one the operator creates"


def test_the_cluster_examples_reward_function_is_importable_from_its_mount_on_pythonpath(
        monkeypatch: pytest.MonkeyPatch) -> None:
    job = load_job(REPO / "examples" / "cluster.yaml")
    reward = job.spec.reward
    [mount] = reward.pod.volume_mounts
    [path] = [e.value for e in reward.pod.env if e.name == "PYTHONPATH"]
    assert path == mount.mountPath and job.spec.data.source.startswith(mount.mountPath + "/")
    monkeypatch.syspath_prepend(str(REPO / "examples" / "math-grpo"))  # what the ConfigMap holds
    from rhymerl.workers.reward.verifiers import load_user_function

    assert reward.function is not None
    fn = load_user_function(reward.function)
    first = yaml.safe_load((REPO / "examples" / "math-grpo" / "math.jsonl").read_text().splitlines()[0])
    assert fn(first["prompt"], f"... so \\boxed{{{first['answer']}}}", first["answer"]) == 1.0
    assert fn(first["prompt"], "the answer is 0.5", first["answer"]) == 0.0


SECRET = "s3cret-value"
# Every way a spec could carry a credential into what the operator stores and renders.
CHANNELS: dict[str, dict[str, Any]] = {
    "a role's env": {"rollout": {"pod": {"env": [{"name": "HF_TOKEN", "value": SECRET}]}}},
    "an init container's env": {"train": {"pod": {"init_containers": [
        {"name": "warm", "image": "busybox:1.36", "env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": SECRET}]}]}}},
    "a URL in an env value": {"reward": {"pod": {"env": [{"name": "DATABASE_URL",
                                                          "value": f"postgres://app:{SECRET}@db/app"}]}}},
    "a Redis URL's user-info": {"history": {"store": "redis", "redis_url": f"redis://u:{SECRET}@r:6379/0"}},
    "a Redis URL's query": {"history": {"store": "redis", "redis_url": f"redis://r:6379/0?password={SECRET}"}},
    "a Redis URL's fragment": {"history": {"store": "redis", "redis_url": f"redis://r:6379/0#{SECRET}"}},
    "a Redis URL's path": {"history": {"store": "redis", "redis_url": f"redis://r:6379/{SECRET}"}},
    "an s3 source's user-info": {"model": {"path": f"s3://AKIAEXAMPLE:{SECRET}@models/qwen"}},
    "an hf source's token": {"model": {"path": f"hf://{SECRET}@Qwen/Qwen2.5-7B"}},
    "a presigned s3 source": {"data": {"source": f"s3://sets/math.jsonl?X-Amz-Signature={SECRET}"}},
}


def _set_items(spec: dict[str, Any], prefix: str = "") -> list[str]:
    """`--set` items that write `spec`: one per scalar, a list as YAML flow."""
    items = []
    for key, value in spec.items():
        if isinstance(value, dict):
            items += _set_items(value, f"{prefix}{key}.")
        else:
            text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
            items.append(f"{prefix}{key}={text}")
    return items


@pytest.mark.parametrize("channel", list(CHANNELS))
def test_a_credential_in_every_channel_is_refused_and_no_error_line_or_render_shows_it(channel: str) -> None:
    spec = CHANNELS[channel]
    stored = job_dict({"metadata": {"name": "j", "namespace": "ns"}, "spec": spec}, base="defaults")
    with pytest.raises(ValidationError) as refused:
        RLJob.model_validate(stored)
    assert SECRET not in str(refused.value)
    for text, sets in ((yaml.safe_dump(stored), []), (yaml.safe_dump({**stored, "spec": {}}), _set_items(spec))):
        with pytest.raises(SpecError) as caught:
            parse_job(text, "job.yaml", sets)
        lines = error_lines(caught.value)
        assert lines and not [line for line in lines if SECRET in line], lines
        assert SECRET not in str(caught.value.__cause__)
    parsed = parse_stored(stored)  # the operator: Failed/InvalidSpec with these problems, and nothing rendered
    assert parsed.job is None and parsed.problems is not None and SECRET not in parsed.problems


def test_no_rendered_user_mount_meets_an_operator_mount_in_the_same_container() -> None:
    mounts = [{"name": "models", "mountPath": p} for p in ("/models", "/opt/code/", "/var/lib/other", "/mnt/m")]
    job = _job("model.path=s3://models/qwen", "data.source=pvc://sets/math.jsonl", "train.resources.gpu=1",
               {"train": {"pod": {"volumes": [EXTRA], "volume_mounts": mounts}}})
    pod = _pods(job)["train"]["spec"]
    for container in pod["containers"] + pod["initContainers"]:
        paths = [(m["name"], mount_path(m["mountPath"])) for m in container["volumeMounts"]]
        ours = [p for n, p in paths if n != "models"]
        theirs = [p for n, p in paths if n == "models"]
        assert len(theirs) == 4 and ours
        assert not [(a, b) for a in theirs for b in ours if a == b or a.startswith(f"{b}/") or b.startswith(f"{a}/")]


def test_every_name_the_operator_derives_from_the_longest_job_name_fits_kubernetes_limits() -> None:
    job = RLJob.model_validate({"metadata": {"name": "j" * MAX_JOB_NAME, "namespace": "n" * 63}, "spec": {
        "rollout": {"replicas": MAX_REPLICAS, "max_replicas": MAX_REPLICAS}, "train": {"replicas": MAX_REPLICAS},
        "reward": {"function": "m:f", "replicas": MAX_REPLICAS}, "history": {"replicas": MAX_REPLICAS}}})
    objects = [*desired(job, None), ray_token_secret(job, None, "t")]
    for obj in objects:
        meta = obj["metadata"]
        (dns1123_label if obj["kind"] == "Service" else dns1123_subdomain)(meta["name"])
        for key, value in [*meta.get("labels", {}).items(), *obj.get("spec", {}).get("template", {}).get(
                "metadata", {}).get("labels", {}).items()]:
            qualified_name(key)
            label_value(value)
        if obj["kind"] == "StatefulSet":
            label_value(f"{meta['name']}-{'h' * 10}")  # controller-revision-hash: <name>-<hash>
            pod = f"{meta['name']}-{obj['spec']['replicas'] - 1}"
            dns1123_label(pod)  # the pod's hostname, and its statefulset.kubernetes.io/pod-name label
            label_value(pod)
            for claim in obj["spec"].get("volumeClaimTemplates", []):
                dns1123_subdomain(f"{claim['metadata']['name']}-{pod}")
