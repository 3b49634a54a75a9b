"""A pod's fetch step (`rhymerl fetch`): the job's model and data, named as s3://, hf:// or pvc://
sources (rhymerl.api.sources), copied once into the pod's data volume before the role starts.

Once: a fetched folder holds a marker with its source; a second start (a restarted pod on its volume
claim) finds the marker and fetches nothing. A fetch writes into `<target>.partial` and renames it
into place only when complete; a fetch that fails removes it, and a pod killed mid-fetch leaves one
that the next start removes, so no folder looks fetched that is not.

With a model cache (--model-cache: the job's spec.model.cache claim, mounted read-write) the model goes
to `<cache>/<cache_key>` instead, once for every pod and job on the claim: the first pod fetches under
an exclusive lock (workers/runtime/fetch_cache.py) and the others wait for it, saying so, within the
deadline, then find its marker. The lock's holder looks for the marker again before it fetches.

Fail fast, one line: a fetch step that hangs keeps the pod in Init with no reason, so every network
operation has a deadline (workers/runtime/fetch_deadline.py). Command-line options, else environment
variables (in a pod, the role's `env`):

- FETCH_CONNECT_TIMEOUT_S (--connect-timeout, default 10): to open a connection;
- FETCH_READ_TIMEOUT_S (--read-timeout, default 60): for the first byte of an answer, and between bytes;
- FETCH_DEADLINE_S (--deadline, default 7200): the whole command, whatever the libraries do.

S3 retries a failed request 3 times (backoff 0.5 s doubling), the hub its own 5 times (1-8 s). A
failure is a FetchError: the source, its cause and the endpoint on one line, credentials masked.

S3 through obstore (endpoint and credentials from the standard AWS environment: AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, web identity, a container
credentials URI, or AWS_SKIP_SIGNATURE=true for a public bucket). With none of these, obstore would ask
the instance metadata service (169.254.169.254), which off EC2 hangs or is refused, and on a shared node
hands the pod the node's role: so it is asked only on request (--s3-instance-credentials,
FETCH_S3_INSTANCE_CREDENTIALS=true; AWS_METADATA_ENDPOINT moves it), else the fetch fails at once
saying which credentials to give. The Hugging Face hub through huggingface_hub (HF_TOKEN, HF_ENDPOINT),
a pvc:// claim by copying from where the fetch step mounts it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from rhymerl.api.credentials import masked
from rhymerl.api.sources import (
    MARKER,
    PVC_ROOT,
    Source,
    cache_lock,
    cached_model,
    fetched_data,
    fetched_model,
    parse,
)
from rhymerl.errors import UserError, disk_full, is_disk_full, user_paths, writable_folder
from rhymerl.workers.runtime.fetch_cache import LockTimeout, exclusive
from rhymerl.workers.runtime.fetch_deadline import INSTANCE_ENV, Deadline, Limits, Stopped
from rhymerl.workers.runtime.fetch_errors import hub_cause, s3_cause

if TYPE_CHECKING:  # obstore's option types exist for type checkers only
    from obstore.store import ClientConfig, RetryConfig, S3Config

S3_RETRIES = 3
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                  "AWS_CONTAINER_CREDENTIALS_FULL_URI")
_CHUNK = 8 * 1024 * 1024


class FetchError(UserError):
    pass


def one_line(text: str) -> str:
    """`text` on one line, every URL in it masked (rhymerl.api.credentials)."""
    return re.sub(r"\S+://\S+", lambda found: masked(found.group()), " ".join(text.split()))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def fetch_all(into: Path, model: str | None, data: str | None, pvc_root: Path = Path(PVC_ROOT),
              limits: Limits | None = None, model_cache: Path | None = None,
              tell: Callable[[str], None] = _stderr) -> list[str]:
    """Fetch the given sources under `into` (model: `into/model`, or `<model_cache>/<key>` with a cache;
    data: `into/data/<file>`), all within one deadline (`limits`, else Limits.from_env()); one line per
    source saying what was done. `tell` hears at once what is waited for."""
    deadline = Deadline(limits or Limits.from_env())
    writable_folder(into)
    said = []
    if model is not None:
        source = _parsed(model, file=False, what="--model")
        if model_cache is None:
            folder = Path(fetched_model(str(into)))
            done = fetch(source, folder, pvc_root, deadline=deadline)
        else:
            done, folder = fetch_cached(source, model_cache, pvc_root, deadline, tell)
        said.append(f"model {model}: {'fetched into' if done else 'already in'} {folder}")
    if data is not None:
        source = _parsed(data, file=True, what="--data")
        target = Path(fetched_data(str(into), source))
        done = fetch(source, target.parent, pvc_root, file_name=target.name, deadline=deadline)
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


def fetch(source: Source, folder: Path, pvc_root: Path = Path(PVC_ROOT), file_name: str | None = None,
          deadline: Deadline | None = None) -> bool:
    """Make `folder` hold `source` (a model folder; with `file_name`, one data file in it) before the
    deadline; False if its marker says it already does. On any failure `<folder>.partial` is removed."""
    if fetched_source(folder) == source.text:
        return False
    clock = deadline or Deadline(Limits.from_env())
    partial = folder.with_name(folder.name + ".partial")
    _remove(partial)
    try:
        with user_paths("write into", partial):
            partial.mkdir(parents=True)
        clock.run(lambda: _fill(source, partial, pvc_root, file_name, clock))
        (partial / MARKER).write_text(json.dumps({"source": source.text}) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    except BaseException as exc:
        with clock.stop():
            _remove(partial)
        if isinstance(exc, Stopped):
            raise FetchError(one_line(f"{source.text}: not fetched within the {clock.limits.deadline_s:g} s "
                                      "deadline (--deadline, FETCH_DEADLINE_S)")) from None
        if isinstance(exc, OSError) and not isinstance(exc, UserError):
            raise _local_failure(source, folder, exc) from None
        raise
    return True


def fetch_cached(source: Source, cache: Path, pvc_root: Path, deadline: Deadline,
                 tell: Callable[[str], None] = _stderr) -> tuple[bool, Path]:
    """Make the cache mounted at `cache` hold `source` (fetch_cache.py), and say where: False if it did."""
    folder = Path(cached_model(str(cache), source))
    if fetched_source(folder) == source.text:
        return False, folder
    with user_paths("create the model cache", cache):
        writable_folder(cache).mkdir(parents=True, exist_ok=True)
    lock = Path(cache_lock(str(cache), source))
    waiting = one_line(f"{source.text}: waiting for another pod fetching it into {folder} (lock {lock})")
    try:
        with exclusive(lock, deadline, lambda: tell(waiting)):
            return fetch(source, folder, pvc_root, deadline=deadline), folder
    except LockTimeout as exc:
        raise FetchError(one_line(f"{source.text}: not fetched within the {deadline.limits.deadline_s:g} s deadline "
                                  f"(--deadline, FETCH_DEADLINE_S): {exc}")) from None


def _local_failure(source: Source, folder: Path, exc: OSError) -> UserError:
    """A failure to write what was fetched: a full disk, or the file and the system's reason."""
    if is_disk_full(exc):
        return disk_full(folder.parent, f"{source.text} into {folder}")
    where = f"{exc.filename}: " if exc.filename is not None else ""
    return FetchError(one_line(f"{source.text}: cannot write into {folder}: {where}{exc.strerror or exc}"))


def _is_local(exc: BaseException) -> bool:
    """Whether a library's OSError is about a local file (it names one, or the disk is full)."""
    return isinstance(exc, UserError) or (isinstance(exc, OSError) and exc.filename is not None) or is_disk_full(exc)


def _remove(partial: Path) -> None:
    for _ in range(3):  # a file another thread was closing may make one pass fail
        shutil.rmtree(partial, ignore_errors=True)
        if not partial.exists():
            return


def _fill(source: Source, partial: Path, pvc_root: Path, file_name: str | None, deadline: Deadline) -> None:
    if source.scheme == "s3":
        _from_s3(source, partial, file_name, deadline)
    elif source.scheme == "hf":
        _from_hub(source, partial, file_name, deadline)
    else:
        _from_claim(source, partial, pvc_root, file_name, deadline)


def _inside(root: Path, relative: str) -> Path:
    """`root/relative`, refusing a key or file name that would land outside `root`."""
    parts = PurePosixPath(relative).parts
    if not parts or any(p in ("..", "/") for p in parts):
        raise FetchError(f"refusing to write {relative!r} outside {root}")
    return root.joinpath(*parts)


def _write(target: Path, chunks: Iterable[Any], deadline: Deadline) -> None:
    """`chunks` (bytes-like) into `target`, each creation and write under the deadline's lock: chunks are
    waited for outside it, so a stopped fetch writes nothing more."""
    with deadline.writing():
        target.parent.mkdir(parents=True, exist_ok=True)
        out = target.open("wb")
    with out:
        for chunk in chunks:
            with deadline.writing():
                out.write(memoryview(chunk))


def has_s3_credentials(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment names S3 credentials, or asks for unsigned (anonymous) requests."""
    env = os.environ if environ is None else environ
    unsigned = env.get("AWS_SKIP_SIGNATURE", "").strip().lower() in ("1", "true", "yes")
    return unsigned or any(env.get(name) for name in CREDENTIAL_ENV)


def _s3_store(bucket: str, limits: Limits | None = None, left_s: float | None = None) -> Any:
    """A store for `bucket` with the fetch's timeouts; the per-request timeout outlasts the deadline
    (`left_s`), which is what ends a slow download."""
    try:
        from obstore.store import S3Store
    except ImportError:
        raise FetchError("s3:// sources need obstore (pip install obstore); the worker images have it") from None
    from datetime import timedelta

    limits = limits or Limits()
    left = limits.deadline_s if left_s is None else left_s
    client: ClientConfig = {"connect_timeout": timedelta(seconds=limits.connect_s),
                            "read_timeout": timedelta(seconds=limits.read_s),
                            "timeout": timedelta(seconds=left + limits.read_s)}
    config: S3Config = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:  # an S3-compatible store (MinIO, Ceph...): path-style requests, http if it says so
        config = {"endpoint": endpoint, "virtual_hosted_style_request": False}
        client["allow_http"] = endpoint.startswith("http://")
    retry: RetryConfig = {"max_retries": S3_RETRIES, "retry_timeout": timedelta(seconds=min(left, 180.0)),
                          "backoff": {"init_backoff": timedelta(seconds=0.5), "max_backoff": timedelta(seconds=8),
                                      "base": 2}}
    return S3Store(bucket, config=config, client_options=client, retry_config=retry)


def _from_s3(source: Source, into: Path, file_name: str | None, deadline: Deadline) -> None:
    from obstore.exceptions import BaseError

    if not (has_s3_credentials() or deadline.limits.instance_credentials):
        raise FetchError(f"{source.text}: no S3 credentials in the environment: give AWS_ACCESS_KEY_ID and "
                         "AWS_SECRET_ACCESS_KEY (or a web identity), AWS_SKIP_SIGNATURE=true for a public bucket, or "
                         f"--s3-instance-credentials ({INSTANCE_ENV}=true) for the node's instance role")
    try:
        store = _s3_store(source.where, deadline.limits, deadline.left())
        if file_name is not None:
            _write(_inside(into, file_name), _s3_chunks(store, source.path), deadline)
            return
        prefix = f"{source.path}/" if source.path else ""
        count = 0
        for key in _s3_keys(store, prefix):
            _write(_inside(into, key[len(prefix):]), _s3_chunks(store, key), deadline)
            count += 1
    except (BaseError, OSError) as exc:  # obstore's errors; its not-found ones are FileNotFoundErrors
        if _is_local(exc):
            raise
        raise FetchError(one_line(f"{source.text}: {s3_cause(exc, deadline.limits)}")) from None
    if count == 0:
        raise FetchError(f"{source.text}: no objects under this prefix")


def _s3_keys(store: Any, prefix: str) -> Iterator[str]:
    import obstore

    for batch in obstore.list(store, prefix=prefix or None):
        for meta in batch:
            key = str(meta["path"])
            if not key.endswith("/"):  # a "folder" marker some stores keep: no file
                yield key


def _s3_chunks(store: Any, key: str) -> Iterator[Any]:
    """One object in chunks (a model's shards are GBs: never whole in memory)."""
    import obstore

    yield from obstore.get(store, key).stream(min_chunk_size=_CHUNK)


# huggingface_hub's downloads, named here so that a test can check what they are called with
def _snapshot_download(**kwargs: Any) -> str:
    from huggingface_hub import snapshot_download

    return str(snapshot_download(**kwargs))


def _hub_file_download(**kwargs: Any) -> str:
    from huggingface_hub import hf_hub_download

    return str(hf_hub_download(**kwargs))


def _from_hub(source: Source, into: Path, file_name: str | None, deadline: Deadline) -> None:
    import httpx2
    from huggingface_hub.errors import EntryNotFoundError

    try:
        with _bounded_hub(deadline):
            if file_name is None:
                _snapshot_download(repo_id=source.where, revision=source.revision, local_dir=str(into))
            else:
                got = Path(_hub_file_download(repo_id=source.where, filename=source.path, repo_type="dataset",
                                              revision=source.revision, local_dir=str(into)))
    except (OSError, httpx2.HTTPError, EntryNotFoundError) as exc:  # the hub's HTTP, network and not-found errors
        if _is_local(exc):
            raise
        raise FetchError(one_line(f"{source.text}: {hub_cause(exc, deadline.limits)}")) from None
    with deadline.writing():
        shutil.rmtree(into / ".cache", ignore_errors=True)  # huggingface_hub's download bookkeeping
        if file_name is not None:
            _keep_only(got, _inside(into, file_name), into)


def _keep_only(got: Path, target: Path, into: Path) -> None:
    """The downloaded file `got` moved to `target`, and the folders that held it removed."""
    got.replace(target)
    leftover = got.parent
    while leftover != into and leftover.is_dir() and not any(leftover.iterdir()):
        leftover.rmdir()
        leftover = leftover.parent


@contextmanager
def _bounded_hub(deadline: Deadline) -> Iterator[None]:
    """huggingface_hub's shared HTTP client, for the fetch, with the fetch's timeouts on every request
    (the library passes `timeout=None` to some, which httpx reads as none) and no request once the
    deadline has passed; the library's default client again afterwards. Its warnings (a line per retry)
    are off meanwhile: the fetch's failure is one line."""
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    def bound(request: Any) -> None:
        deadline.check()
        limits, left = deadline.limits, deadline.left()
        read = min(limits.read_s, left)
        request.extensions["timeout"] = {"connect": min(limits.connect_s, left), "read": read, "write": read,
                                         "pool": read}

    def client() -> Any:
        made = default_client_factory()
        made.event_hooks = {**made.event_hooks, "request": [*made.event_hooks["request"], bound]}
        return made

    log = logging.getLogger("huggingface_hub")
    level = log.level
    log.setLevel(logging.ERROR)
    set_client_factory(client)
    try:
        yield
    finally:
        set_client_factory(default_client_factory)
        log.setLevel(level)


def _from_claim(source: Source, into: Path, pvc_root: Path, file_name: str | None, deadline: Deadline) -> None:
    origin = pvc_root / source.where / source.path if source.path else pvc_root / source.where
    if file_name is not None:
        if not origin.is_file():
            raise FetchError(f"{source.text}: no such file (the claim is mounted at {pvc_root / source.where})")
        _write(_inside(into, file_name), _file_chunks(origin), deadline)
        return
    if not origin.is_dir():
        raise FetchError(f"{source.text}: no such folder (the claim is mounted at {pvc_root / source.where})")
    for path in sorted(origin.rglob("*")):
        if path.is_file():
            _write(into / path.relative_to(origin), _file_chunks(path), deadline)


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as given:
        while chunk := given.read(_CHUNK):
            yield chunk
