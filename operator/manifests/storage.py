"""How much of a node's disk a stateless pod's fetched copy of the model and data takes. Pure.

Rollout, reward and history pods fetch into an emptyDir (the controller and train pods into their
checkpoint claim). Without a sizeLimit and a request the scheduler places them on nodes with no room
and a big model fills the node's disk, which evicts every pod on it. The data volume gets a sizeLimit
and the role's container requests as much `ephemeral-storage`: the role's own
`resources.extra.ephemeral-storage` when it states one (then requested and limited alike, as every
extra resource), else an allowance for what the pod fetches. The allowance is requested, not limited:
the rest of the pod (`/tmp`: caches, Ray's logs) is not counted against it.

A job with a model cache (`spec.model.cache`) keeps the model on that claim, mounted read-write in the
fetch step (which fetches onto it once, under a lock: workers/runtime/fetch.py) and read-only in the
role's container; the node's disk then holds no model, so the allowance leaves it out.
"""

from __future__ import annotations

from typing import Any

from rhymerl.api.placement import Resources
from rhymerl.api.sources import CACHE_ROOT, Fetches

EPHEMERAL_STORAGE = "ephemeral-storage"
MODEL_ALLOWANCE_GI = 20  # a fetched model: about an 8B-parameter model in bfloat16 (Qwen2.5-7B is 15 GiB)
DATA_ALLOWANCE_GI = 2  # a fetched data file
MODEL_CACHE_VOLUME = "model-cache"


def fetched_size(wanted: Fetches, resources: Resources, model_cached: bool = False) -> str | None:
    """The data volume's size of a stateless pod that fetches `wanted` (None: nothing lands on it), the
    model left out when it is on the cache claim."""
    local = Fetches(None if model_cached else wanted.model, wanted.data)
    if not local.any:
        return None
    stated = resources.extra.get(EPHEMERAL_STORAGE)
    if stated is not None:
        return str(stated)
    return f"{(MODEL_ALLOWANCE_GI if local.model is not None else 0) + DATA_ALLOWANCE_GI}Gi"


def model_cache_volume(claim: str) -> dict[str, Any]:
    """The cache claim, writable at the pod level: the fetch step writes it, the role mounts it read-only."""
    return {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}}


def model_cache_mount(read_only: bool) -> dict[str, Any]:
    return {"name": MODEL_CACHE_VOLUME, "mountPath": CACHE_ROOT, **({"readOnly": True} if read_only else {})}


def data_volume(size: str | None) -> dict[str, Any]:
    return {"name": "data", "emptyDir": {} if size is None else {"sizeLimit": size}}


def with_disk_request(container: dict[str, Any], size: str | None) -> dict[str, Any]:
    """`container` requesting `size` of ephemeral storage, unless its resources already name some."""
    requests = container["resources"]["requests"]
    if size is None or EPHEMERAL_STORAGE in requests:
        return container
    return {**container, "resources": {**container["resources"], "requests": {**requests, EPHEMERAL_STORAGE: size}}}
