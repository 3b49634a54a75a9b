"""Checkpoint folders that are complete or ignored, and verified before they are trusted.

A checkpoint is written into a hidden temporary folder, every file flushed to the disk, then a
`manifest.json` listing each file's size and SHA-256 is written last, and only then is the folder
renamed to `step_NNNNNN`. So a folder with that name and a manifest was written whole; anything
else in `checkpoints/` (a temporary folder left by a SIGKILL or a full disk) is debris that the
next run removes. Reading verifies every checksum first: a checkpoint damaged after it was written
(a truncated file, a bad disk, a hand edit) is reported and set aside, and the caller falls back
to the next older one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from rhymerl.workers import faults
from rhymerl.workers.atomic import fsync_path

MANIFEST = "manifest.json"
FORMAT = "rhymerl.checkpoint/v1"
NAME = re.compile(r"^step_(\d{6,})$")
DAMAGED_SUFFIX = ".damaged"


class CheckpointDamaged(Exception):
    """A checkpoint folder whose files do not match its manifest; the message says how."""


class NoManifest(CheckpointDamaged):
    """A checkpoint written before manifests existed (rhymerl 0.1): whole, but not checkable."""


def step_of(folder: Path) -> int | None:
    m = NAME.match(folder.name)
    return int(m.group(1)) if m else None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def folder(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def write(root: Path, step: int, fill: Callable[[Path], None]) -> Path:
    """Create `root/step_NNNNNN` whole: `fill(folder)` writes the files into a temporary folder,
    which gets its manifest and is renamed into place. Returns the final folder."""
    final = folder(root, step)
    tmp = root / f".step_{step:06d}.{os.getpid()}.tmp"
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        fill(tmp)
        faults.point("checkpoint-files", step)
        files = {}
        for path in sorted(p for p in tmp.iterdir() if p.is_file()):
            fsync_path(path)
            files[path.name] = {"bytes": path.stat().st_size, "sha256": sha256(path)}
        manifest = tmp / MANIFEST
        manifest.write_text(json.dumps({"format": FORMAT, "step": step, "files": files}, indent=1) + "\n")
        fsync_path(manifest)
        fsync_path(tmp)
        faults.point("checkpoint-manifest", step)
        if final.exists():  # the same step written again (a resumed run redoing it): replace it whole
            old = root / f".step_{step:06d}.{os.getpid()}.old.tmp"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
        fsync_path(root)
        faults.point("checkpoint-renamed", step)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def verify(folder: Path) -> None:
    """Raise CheckpointDamaged unless every file listed in the manifest is there, whole."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(files, dict) or not files:
            raise ValueError("unknown format")
    except FileNotFoundError:
        raise NoManifest(f"{folder}: no {MANIFEST}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointDamaged(f"{folder}/{MANIFEST}: unreadable ({exc})") from None
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointDamaged(f"{path}: missing")
        if path.stat().st_size != entry.get("bytes"):
            raise CheckpointDamaged(f"{path}: {path.stat().st_size} bytes, the manifest says {entry.get('bytes')}")
        if sha256(path) != entry.get("sha256"):
            raise CheckpointDamaged(f"{path}: checksum does not match the manifest")


def complete(root: Path) -> list[Path]:
    """Checkpoint folders by step, oldest first (named `step_N`: renamed into place whole)."""
    if not root.is_dir():
        return []
    found = [(step_of(p), p) for p in root.iterdir() if p.is_dir()]
    return [p for s, p in sorted((s, p) for s, p in found if s is not None)]


def remove_debris(root: Path) -> list[Path]:
    """Delete what interrupted writes left in `root` (only call while holding the run lock)."""
    removed = []
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".") and p.name.endswith(".tmp"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def set_aside(folder: Path, suffix: str = DAMAGED_SUFFIX) -> Path:
    """Rename a checkpoint out of the way (kept for inspection, never loaded again): damaged, or as
    the caller's `suffix` says."""
    target = folder.with_name(folder.name + suffix)
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}{suffix}.{n}")
    folder.rename(target)
    return target


def prune(root: Path, keep_last: int) -> None:
    for old in complete(root)[:-keep_last]:
        shutil.rmtree(old)
