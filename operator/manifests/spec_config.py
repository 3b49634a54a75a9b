"""The spec the pods read: the job resolved and localized, its hash, and the ConfigMap holding both."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rhymerl.api.load import dump_job
from rhymerl.api.sources import CACHE_ROOT, cached_model, fetched_data, fetched_model, fetches
from rhymerl.api.spec import RLJob
from rhymerl.operator.manifests.labels import KUEUE_QUEUE_LABEL
from rhymerl.operator.manifests.objects import Manifest, Owner, child_metadata
from rhymerl.operator.manifests.roles import FETCH_DIR, SPEC_FILE, child_name

SPEC_HASH_ANNOTATION = "rhymerl.io/spec-hash"
# Fields the operator applies without restarting pods: scaling, suspend, the crash budget.
_NOT_HASHED: dict[str, Any] = {"suspend": True, "failure_policy": True, "active_deadline_seconds": True,
                               "ttl_seconds_after_finished": True,
                               "rollout": {"replicas", "min_replicas", "max_replicas", "autoscaling"}}
SPEC_YAML_KEPT = 4096  # jobs whose spec.yaml is remembered (the operator renders every job at every resync)
_spec_yamls: dict[str, str] = {}  # the localized job as JSON -> its spec.yaml


def spec_yaml(job: RLJob) -> str:
    """The resolved job as the pods read it (every default spelled out), with a fetched model or data
    source replaced by where the pods' fetch step puts it (`fetch_container`). Remembered per job: the
    YAML dump is most of a reconcile pass's CPU (about 10 ms of 20), and the operator renders every job it
    serves at every resync, where its JSON (a key 400 times cheaper to make) rarely changes."""
    resolved = localized(job)
    key = resolved.model_dump_json()
    found = _spec_yamls.get(key)
    if found is None:
        found = _spec_yamls[key] = dump_job(resolved)
        if len(_spec_yamls) > SPEC_YAML_KEPT:
            del _spec_yamls[next(iter(_spec_yamls))]  # the oldest
    return found


def localized(job: RLJob) -> RLJob:
    """`job` with model.path and data.source naming the fetched copies under FETCH_DIR (the model: on the
    cache claim, with a cache), if fetched."""
    wanted = fetches(job.spec.model.path, job.spec.data.source)
    if not wanted.any:
        return job
    cache = job.spec.model.cache
    path = fetched_model(FETCH_DIR) if wanted.model is None or cache is None else cached_model(CACHE_ROOT, wanted.model)
    model = job.spec.model if wanted.model is None else job.spec.model.model_copy(update={"path": path, "cache": None})
    data = job.spec.data if wanted.data is None else job.spec.data.model_copy(
        update={"source": fetched_data(FETCH_DIR, wanted.data)})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"model": model, "data": data})})


def spec_hash(job: RLJob) -> str:
    """16 hex digits of what the user's spec sets to other than its default (and the job's Kueue queue),
    leaving out what the operator applies without restarting pods (replica counts, suspend,
    failure_policy, the deadline and TTL). A release that adds a field, or changes how the builders render a
    pod, does not move it; one that changes a default does, for jobs the API server stored the old default
    in, so pinning (diff.pinned) compares a job's recorded spec with its current one under one release."""
    rolled = job.spec.model_dump(mode="json", exclude=_NOT_HASHED, exclude_defaults=True)
    queue = job.metadata.labels.get(KUEUE_QUEUE_LABEL)
    text = json.dumps(rolled if queue is None else {"spec": rolled, "queue": queue}, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_map(job: RLJob, owner: Owner | None) -> Manifest:
    meta = child_metadata(job, child_name(job.metadata.name, "spec"), owner)
    out = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {SPEC_FILE: spec_yaml(job)}}
    meta["annotations"] = {SPEC_HASH_ANNOTATION: spec_hash(job)}  # diff.pinned: the spec the pods started with
    return out
