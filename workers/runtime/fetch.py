"""A pod's fetch step (`rhymerl fetch`): the job's model and data, named as s3://, hf:// or pvc://
sources (rhymerl.api.sources), copied once into the pod's data volume before the role starts.

Once: a fetched folder holds a marker with its source; a second start (a restarted pod on its volume
claim) finds the marker and fetches nothing. A fetch writes into `<target>.partial` and renames it
into place only when complete, so a pod killed mid-fetch leaves no folder that looks fetched.

S3 through obstore (endpoint and credentials from the standard AWS environment: AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, web identity), the Hugging Face hub through
huggingface_hub (HF_TOKEN, HF_ENDPOINT), a pvc:// claim by copying from where the fetch step mounts it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from rhymerl.api.sources import MARKER, PVC_ROOT, Source, fetched_data, fetched_model, parse
from rhymerl.errors import UserError


class FetchError(UserError):
    pass


def fetch_all(into: Path, model: str | None, data: str | None, pvc_root: Path = Path(PVC_ROOT)) -> list[str]:
    """Fetch the given sources under `into` (model: `into/model`, data: `into/data/<file>`); one line per
    source saying what was done."""
    said = []
    if model is not None:
        source = _parsed(model, file=False, what="--model")
        done = fetch(source, Path(fetched_model(str(into))), pvc_root)
        said.append(f"model {model}: {'fetched into' if done else 'already in'} {fetched_model(str(into))}")
    if data is not None:
        source = _parsed(data, file=True, what="--data")
        target = Path(fetched_data(str(into), source))
        done = fetch(source, target.parent, pvc_root, file_name=target.name)
        said.append(f"data {data}: {'fetched into' if done else 'already in'} {target}")
    return said


def _parsed(text: str, file: bool, what: str) -> Source:
    try:
        source = parse(text, file=file)
    except ValueError as exc:
        raise FetchError(f"{what}: {exc}") from None
    if source is None:
        raise FetchError(f"{what}: {text} is a path, read where it is: nothing to fetch")
    return source


def fetched_source(folder: Path) -> str | None:
    """The source a fetched folder holds, from its marker; None if it holds none (or no folder)."""
    try:
        recorded: Any = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return recorded.get("source") if isinstance(recorded, dict) else None


def fetch(source: Source, folder: Path, pvc_root: Path = Path(PVC_ROOT), file_name: str | None = None) -> bool:
    """Make `folder` hold `source` (a model folder; with `file_name`, one data file in it); False if its
    marker says it already does."""
    if fetched_source(folder) == source.text:
        return False
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if source.scheme == "s3":
        _from_s3(source, partial, file_name)
    elif source.scheme == "hf":
        _from_hub(source, partial, file_name)
    else:
        _from_claim(source, partial, pvc_root, file_name)
    (partial / MARKER).write_text(json.dumps({"source": source.text}) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return True


def _inside(root: Path, relative: str) -> Path:
    """`root/relative`, refusing a key or file name that would land outside `root`."""
    parts = PurePosixPath(relative).parts
    if not parts or any(p in ("..", "/") for p in parts):
        raise FetchError(f"refusing to write {relative!r} outside {root}")
    return root.joinpath(*parts)


def _s3_store(bucket: str) -> Any:
    try:
        from obstore.store import S3Store
    except ImportError:
        raise FetchError("s3:// sources need obstore (pip install obstore); the worker images have it") from None
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    options: dict[str, Any] = {}
    if endpoint:  # an S3-compatible store (MinIO, Ceph...): path-style requests, http if it says so
        options = {"endpoint": endpoint, "virtual_hosted_style_request": False,
                   "client_options": {"allow_http": endpoint.startswith("http://")}}
    return S3Store(bucket, **options)


def _from_s3(source: Source, into: Path, file_name: str | None) -> None:
    import obstore

    store = _s3_store(source.where)
    try:
        if file_name is not None:
            _download(store, source.path, _inside(into, file_name))
            return
        prefix = f"{source.path}/" if source.path else ""
        count = 0
        for batch in obstore.list(store, prefix=prefix or None):
            for meta in batch:
                key = str(meta["path"])
                if key.endswith("/"):  # a "folder" marker some stores keep: no file
                    continue
                target = _inside(into, key[len(prefix):])
                target.parent.mkdir(parents=True, exist_ok=True)
                _download(store, key, target)
                count += 1
    except FileNotFoundError:
        raise FetchError(f"{source.text}: no such object") from None
    except OSError as exc:  # obstore's errors are OSError subclasses (credentials, network, access)
        raise FetchError(f"{source.text}: {exc}") from None
    if count == 0:
        raise FetchError(f"{source.text}: no objects under this prefix")


_CHUNK = 8 * 1024 * 1024


def _download(store: Any, key: str, target: Path) -> None:
    """One object to `target` in chunks (a model's shards are GBs: never whole in memory)."""
    import obstore

    with target.open("wb") as out:
        for chunk in obstore.get(store, key).stream(min_chunk_size=_CHUNK):
            out.write(memoryview(chunk))


# huggingface_hub's downloads, named here so that a test can check what they are called with
def _snapshot_download(**kwargs: Any) -> str:
    from huggingface_hub import snapshot_download

    return str(snapshot_download(**kwargs))


def _hub_file_download(**kwargs: Any) -> str:
    from huggingface_hub import hf_hub_download

    return str(hf_hub_download(**kwargs))


def _from_hub(source: Source, into: Path, file_name: str | None) -> None:
    try:
        if file_name is None:
            _snapshot_download(repo_id=source.where, revision=source.revision, local_dir=str(into))
            shutil.rmtree(into / ".cache", ignore_errors=True)  # huggingface_hub's download bookkeeping
            return
        got = Path(_hub_file_download(repo_id=source.where, filename=source.path, repo_type="dataset",
                                      revision=source.revision, local_dir=str(into)))
    except OSError as exc:  # huggingface_hub's HTTP and not-found errors are OSErrors
        raise FetchError(f"{source.text}: {exc}") from None
    got.replace(_inside(into, file_name))
    shutil.rmtree(into / ".cache", ignore_errors=True)
    leftover = got.parent
    while leftover != into and leftover.is_dir() and not any(leftover.iterdir()):
        leftover.rmdir()
        leftover = leftover.parent


def _from_claim(source: Source, into: Path, pvc_root: Path, file_name: str | None) -> None:
    origin = pvc_root / source.where / source.path if source.path else pvc_root / source.where
    if file_name is not None:
        if not origin.is_file():
            raise FetchError(f"{source.text}: no such file (the claim is mounted at {pvc_root / source.where})")
        shutil.copyfile(origin, _inside(into, file_name))
        return
    if not origin.is_dir():
        raise FetchError(f"{source.text}: no such folder (the claim is mounted at {pvc_root / source.where})")
    shutil.copytree(origin, into, dirs_exist_ok=True)
