"""The controller's driver connects to its own Ray head: a head whose raylet registers late (after
ray.init's own 60 s) is waited for while it runs; a head that died ends the wait with what it logged."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rhymerl.workers.runtime import node


class _Attempts:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, **kwargs: object) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")


@pytest.fixture
def head() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _quiet(monkeypatch: pytest.MonkeyPatch, attempts: _Attempts) -> None:
    monkeypatch.setattr(node, "reachable", lambda address: True)
    monkeypatch.setattr(node.ray, "init", attempts)
    monkeypatch.setattr(node.ray, "shutdown", lambda: None)


def test_a_connection_refused_while_our_head_runs_is_tried_again_until_it_succeeds(
        monkeypatch: pytest.MonkeyPatch, head: subprocess.Popen[bytes], tmp_path: Path) -> None:
    attempts = _Attempts(failures=2)
    _quiet(monkeypatch, attempts)
    node.connect("10.0.0.1:6379", 600, head, tmp_path / "ray-head.log")
    assert attempts.calls == 3


def test_a_connection_refused_after_our_head_died_says_what_the_head_logged(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log = tmp_path / "ray-head.log"
    log.write_text("Local node IP: 10.0.0.1\nraylet failed: Address already in use\n")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    attempts = _Attempts(failures=1)
    _quiet(monkeypatch, attempts)
    monkeypatch.setattr(node, "wait_reachable", lambda *args: None)  # the head answered before it died
    with pytest.raises(node.NodeError, match="Address already in use"):
        node.connect("10.0.0.1:6379", 600, dead, log)
    assert attempts.calls == 1


def test_a_driver_without_its_own_head_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = _Attempts(failures=1)
    _quiet(monkeypatch, attempts)
    with pytest.raises(node.NodeError, match=re.escape("could not connect to the Ray head at 10.0.0.1:6379")):
        node.connect("10.0.0.1:6379", 600)
    assert attempts.calls == 1
