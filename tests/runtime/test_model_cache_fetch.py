"""A model cache (spec.model.cache) fetches each source once, with pods as processes: two real processes
fetch the same pvc:// source into the same cache at once; the source is read exactly once and both end
with the same folder. The one holding the lock killed mid-fetch leaves no marker, and the one waiting
fetches the whole model after it. Every ordering is forced at a seam (the reading of a source file, the
"waiting" line), never by timing; the processes are forked, so the patched seam is theirs alone."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest

from rhymerl.api.sources import MARKER, cache_key, parse
from rhymerl.workers.runtime import fetch as fetching
from rhymerl.workers.runtime.fetch import FetchError, fetch_all, fetched_source
from rhymerl.workers.runtime.fetch_deadline import Limits

SOURCE = "pvc://weights/tiny"
FILES = {"config.json": b"{}", "model.safetensors": b"w" * 4096, "tokenizer.json": b"[]"}
BOUND_S = 30.0  # how long a test waits for an event that is due; never reached when the code is right
CTX = multiprocessing.get_context("fork")


@pytest.fixture
def claims(tmp_path: Path) -> Path:
    folder = tmp_path / "claims" / "weights" / "tiny"
    folder.mkdir(parents=True)
    for name, content in FILES.items():
        (folder / name).write_bytes(content)
    return tmp_path / "claims"


def _key() -> str:
    source = parse(SOURCE, file=False)
    assert source is not None
    return cache_key(source)


def _pod(name: str, tmp: Path, claims: Path, events: Any, gate: Event | None) -> None:
    """One pod's fetch step; each source file it opens is an event, and with a `gate` it stops inside its
    first read until the gate opens (the seam a test kills it at)."""
    plain = fetching._file_chunks

    def counted(path: Path) -> Iterator[bytes]:
        events.put(("read", name, path.name))
        if gate is not None:
            events.put(("holding", name, ""))
            gate.wait()
        yield from plain(path)

    fetching._file_chunks = counted
    try:
        said = fetch_all(tmp / f"volume-{name}", SOURCE, None, claims, Limits(deadline_s=BOUND_S),
                         model_cache=tmp / "cache", tell=lambda line: events.put(("waiting", name, line)))
    except Exception as exc:  # said to the test, which fails at once rather than wait for an event
        events.put(("failed", name, repr(exc)))
        raise
    events.put(("done", name, said[0]))


class Heard:
    """The pods' events in the order they came, each one kept."""

    def __init__(self) -> None:
        self.queue: Any = CTX.Queue()
        self.seen: list[tuple[str, str, str]] = []

    def next(self, kind: str, name: str) -> tuple[str, str, str]:
        """The next event `kind` of pod `name`, those before it kept in `seen`."""
        while True:
            event = self.queue.get(timeout=BOUND_S)
            self.seen.append(event)
            assert event[0] != "failed", event
            if event[:2] == (kind, name):
                return event  # type: ignore[no-any-return]

    def reads(self, name: str) -> list[str]:
        """Every file pod `name` read, once both pods are done."""
        while True:
            try:
                self.seen.append(self.queue.get(timeout=0.1))
            except queue.Empty:
                return sorted(file for kind, pod, file in self.seen if (kind, pod) == ("read", name))


def test_two_pods_fetching_the_same_source_read_it_once_and_end_with_the_same_folder(
        tmp_path: Path, claims: Path) -> None:
    heard, gate = Heard(), CTX.Event()
    first = CTX.Process(target=_pod, args=("a", tmp_path, claims, heard.queue, gate))
    first.start()
    heard.next("holding", "a")  # a holds the lock, inside its first read
    second = CTX.Process(target=_pod, args=("b", tmp_path, claims, heard.queue, None))
    second.start()
    waiting = heard.next("waiting", "b")
    assert f"{SOURCE}: waiting for another pod fetching it into" in waiting[2]
    gate.set()
    done = {name: line for _, name, line in (heard.next("done", "a"), heard.next("done", "b"))}
    first.join(BOUND_S)
    second.join(BOUND_S)
    folder = tmp_path / "cache" / _key()
    assert done == {"a": f"model {SOURCE}: fetched into {folder}", "b": f"model {SOURCE}: already in {folder}"}
    assert (heard.reads("a"), heard.reads("b")) == (sorted(FILES), [])
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name != MARKER} == FILES
    assert fetched_source(folder) == SOURCE
    assert not (tmp_path / "cache" / f"{_key()}.partial").exists()


def test_a_pod_killed_mid_fetch_leaves_no_marker_and_the_waiting_pod_fetches_the_whole_model(
        tmp_path: Path, claims: Path) -> None:
    heard, never = Heard(), CTX.Event()
    first = CTX.Process(target=_pod, args=("a", tmp_path, claims, heard.queue, never))
    first.start()
    heard.next("holding", "a")
    second = CTX.Process(target=_pod, args=("b", tmp_path, claims, heard.queue, None))
    second.start()
    heard.next("waiting", "b")
    folder = tmp_path / "cache" / _key()
    assert first.pid is not None
    os.kill(first.pid, signal.SIGKILL)
    first.join(BOUND_S)
    assert fetched_source(folder) is None  # nothing looks fetched that is not
    assert heard.next("done", "b")[2] == f"model {SOURCE}: fetched into {folder}"
    second.join(BOUND_S)
    assert heard.reads("b") == sorted(FILES)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name != MARKER} == FILES
    assert not (tmp_path / "cache" / f"{_key()}.partial").exists()


def test_a_cached_source_is_never_read_again_and_a_folder_without_its_marker_is_fetched_again(
        tmp_path: Path, claims: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    plain = fetching._file_chunks

    def counted(path: Path) -> Iterator[bytes]:
        reads.append(path.name)
        yield from plain(path)

    monkeypatch.setattr(fetching, "_file_chunks", counted)
    cache = tmp_path / "cache"
    folder = cache / _key()
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"half")  # a copy made some other way, or cut short: no marker
    assert fetch_all(tmp_path / "v1", SOURCE, None, claims, model_cache=cache) == [
        f"model {SOURCE}: fetched into {folder}"]
    assert sorted(reads) == sorted(FILES)
    assert (folder / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    reads.clear()
    assert fetch_all(tmp_path / "v2", SOURCE, None, claims, model_cache=cache) == [
        f"model {SOURCE}: already in {folder}"]
    assert reads == []
    assert not (tmp_path / "v2" / "model").exists()  # nothing copied into the pod's own volume


def test_a_lock_held_past_the_deadline_is_one_fetch_error_naming_the_source_and_the_lock(
        tmp_path: Path, claims: Path) -> None:
    import fcntl

    cache = tmp_path / "cache"
    cache.mkdir()
    lock = cache / f"{_key()}.lock"
    said: list[str] = []
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file description: the fetch's flock is refused
        with pytest.raises(FetchError, match=r"not fetched within the 0.2 s deadline .*the lock .* still held"):
            fetch_all(tmp_path / "v", SOURCE, None, claims, Limits(deadline_s=0.2), model_cache=cache,
                      tell=said.append)
    assert len(said) == 1 and "waiting for another pod" in said[0]
    assert fetched_source(cache / _key()) is None
