"""Where a job's model and data come from (`model.path`, `data.source`), and where a pod reads them.

A path (or `builtin:`) is read where it is: on this machine, or in a pod, on a volume the job mounts
(`spec.<role>.pod.volumes`). The other forms are fetched once into the pod's data volume by the pod's
fetch step (`rhymerl fetch`, workers/runtime/fetch.py) before the role starts:

- `s3://BUCKET/PREFIX`: every object under PREFIX/ (a model folder), or one object (a data file);
  endpoint and credentials from the standard AWS environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...).
- `hf://ORG/NAME[@REVISION]`: a Hugging Face model repository; for data,
  `hf://datasets/ORG/NAME[@REVISION]/PATH/IN/REPO.jsonl`, one file of a dataset repository.
- `pvc://CLAIM/PATH`: a folder or file on a PersistentVolumeClaim of the job's namespace, copied (the
  claim is mounted read-only in the fetch step only, so the roles never hold it).

With a model cache (`spec.model.cache`), the model is fetched once onto that claim instead, into a folder
named by its source (`cache_key`), which every pod of every job naming the same source and claim reads.

Pure: parsing, and the fetched location (`localized`); no I/O.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass
from typing import Literal

from rhymerl.api.credentials import SCHEME, masked, url_credential
from rhymerl.api.k8s_values import DNS1123_SUBDOMAIN

Scheme = Literal["s3", "hf", "pvc"]
SCHEMES: tuple[Scheme, ...] = ("s3", "hf", "pvc")
MARKER = ".rhymerl-source"  # in a fetched folder: the source it holds (a second start skips the fetch)
PVC_ROOT = "/mnt/rhymerl-source"  # where the fetch step mounts a pvc:// source's claim
CACHE_ROOT = "/mnt/rhymerl-cache"  # where a job's model cache claim is mounted (spec.model.cache)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_REPO_PART = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,95}$")
_REVISION = re.compile(r"^[-A-Za-z0-9_./]{1,255}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Source:
    """One fetched source: `where` is the bucket, repository or claim, `path` the key prefix, file or
    sub-path in it ('' for all of it)."""

    text: str
    scheme: Scheme
    where: str
    path: str
    revision: str | None = None
    dataset: bool = False

    @property
    def name(self) -> str:
        """The last part of the path (a data file's name); the repository's name without one."""
        return posixpath.basename(self.path) or posixpath.basename(self.where)


def _clean_path(path: str, what: str) -> str:
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"{what}: no '.' or '..' in the path")
    return "/".join(parts)


def parse(text: str, file: bool) -> Source | None:
    """The fetched source `text` names, None for a path or `builtin:` (read in place). `file`: a data
    source, one file; else a model, a folder."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return None
    if scheme not in SCHEMES:
        named = f"'{scheme}://'" if SCHEME.match(scheme) else "that"
        raise ValueError(f"{named} is not a source: s3://BUCKET/KEY, hf://ORG/NAME or pvc://CLAIM/PATH, or a path")
    credential = url_credential(text)
    if credential is not None:
        raise ValueError(f"{masked(text)}: no credentials in a source ({credential}): the spec is stored in the RLJob "
                         "and its ConfigMap; give the pods a Secret instead (spec.<role>.pod.envFrom with "
                         "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or HF_TOKEN)")
    where, _, path = rest.partition("/")
    if scheme == "s3":
        if not _BUCKET.match(where):
            raise ValueError(f"s3://{where}: not an S3 bucket name (3-63 lowercase letters, digits, '.' and '-')")
        key = _clean_path(path, "s3 key")
        if file and not key:
            raise ValueError(f"s3://{where}: name the data file's key, s3://{where}/KEY")
        return Source(text, "s3", where, key)
    if scheme == "pvc":
        if len(where) > 253 or not DNS1123_SUBDOMAIN.match(where):
            raise ValueError(f"pvc://{where}: not a PersistentVolumeClaim name (a DNS-1123 subdomain)")
        sub = _clean_path(path, "pvc path")
        if file and not sub:
            raise ValueError(f"pvc://{where}: name the data file, pvc://{where}/PATH")
        return Source(text, "pvc", where, sub)
    return _hub(text, rest, file)


def _hub(text: str, rest: str, file: bool) -> Source:
    dataset = rest.startswith("datasets/")
    if file != dataset:
        raise ValueError("hf://: a model is hf://ORG/NAME[@REVISION]; a data file is "
                         "hf://datasets/ORG/NAME[@REVISION]/FILE.jsonl")
    parts = rest.removeprefix("datasets/").split("/")
    if len(parts) < 2:
        raise ValueError("hf://: name the repository as ORG/NAME")
    org, name = parts[0], parts[1]
    name, _, revision = name.partition("@")
    for part in (org, name):
        if not _REPO_PART.match(part) or ".." in part:
            raise ValueError(f"hf://: '{part}' is not a Hugging Face organisation or repository name")
    if revision and not _REVISION.match(revision):
        raise ValueError(f"hf://: '{revision}' is not a revision (a branch, tag or commit)")
    inside = _clean_path("/".join(parts[2:]), "hf file")
    if dataset and not inside:
        raise ValueError("hf://datasets/ORG/NAME: name the data file, hf://datasets/ORG/NAME/FILE.jsonl")
    if not dataset and inside:
        raise ValueError("hf://ORG/NAME: a model is a whole repository; no path after it")
    return Source(text, "hf", f"{org}/{name}", inside, revision or None, dataset)


def model_source(text: str) -> str:
    """model.path's check: a path, builtin:, or a model folder to fetch."""
    parse(text, file=False)
    return text


def data_source(text: str) -> str:
    """data.source's check: a path, builtin:, or a data file to fetch."""
    parse(text, file=True)
    return text


def fetched_model(root: str) -> str:
    return posixpath.join(root, "model")


def fetched_data(root: str, source: Source) -> str:
    return posixpath.join(root, "data", source.name)


def cache_key(source: Source) -> str:
    """The folder of `source` in a model cache: the same source text, the same folder, in every job sharing
    the claim. The scheme and name make it readable (`ls` on the claim); a hash of the whole text
    (revision included) makes it unique."""
    digest = hashlib.sha256(source.text.encode()).hexdigest()[:16]
    readable = _UNSAFE.sub("-", source.name).strip("-.")[:48]
    return f"{source.scheme}-{readable}-{digest}" if readable else f"{source.scheme}-{digest}"


def cached_model(root: str, source: Source) -> str:
    """Where a model cache mounted at `root` holds `source`."""
    return posixpath.join(root, cache_key(source))


def cache_lock(root: str, source: Source) -> str:
    """The lock file beside `source`'s folder in the cache: its holder is the one pod fetching it."""
    return posixpath.join(root, f"{cache_key(source)}.lock")


def is_fetched(text: str) -> bool:
    """Whether a model path names a source to fetch (not a path or `builtin:`); raises on a bad source."""
    return parse(text, file=False) is not None


@dataclass(frozen=True)
class Fetches:
    """The fetched sources of one job (None: read in place) and where a pod reads them under `root`."""

    model: Source | None
    data: Source | None

    @property
    def any(self) -> bool:
        return self.model is not None or self.data is not None


def fetches(model_path: str, data_source_text: str) -> Fetches:
    return Fetches(parse(model_path, file=False), parse(data_source_text, file=True))
