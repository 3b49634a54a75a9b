"""The run's watchdog (workers/runtime/reaper.py) without Ray: a fake raylet and agent stand in for
Ray's, the agent calling setproctitle as Ray's agents do, so its environment no longer shows the
run's token. Each test forces its event (a SIGKILL, a clean stop) and waits for the outcome under a
generous deadline: the old reaper never kills the orphaned agent at all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rhymerl.workers.runtime.reaper import OWNER_ENV, Reaper, family

AGENT = """
import os, setproctitle, sys, time
setproctitle.setproctitle("fake::Agent")  # written over the memory /proc/PID/environ reads
print(os.getpid(), flush=True)
time.sleep(600)
"""
RAYLET = f"""
import subprocess, sys, time
agent = subprocess.Popen([sys.executable, "-c", {AGENT!r}], stdout=subprocess.PIPE, text=True)
print(agent.stdout.readline().strip(), flush=True)
time.sleep(600)
"""
DRIVER = f"""
import subprocess, sys, time
from rhymerl.workers.runtime.reaper import Reaper
reaper = Reaper()
reaper.start()
raylet = subprocess.Popen([sys.executable, "-c", {RAYLET!r}], stdout=subprocess.PIPE, text=True)
agent = raylet.stdout.readline().strip()
reaper.look()
print(raylet.pid, agent, flush=True)
if sys.argv[1] == "stop":
    reaper.stop()
    print("stopped", flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def wait_until(done: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    return done()


@pytest.fixture
def stranger() -> Iterator[int]:
    """Somebody else's agent on this machine, with the same title and no token: never ours to kill."""
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    proc = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    proc.stdout.readline()
    yield proc.pid
    proc.kill()
    proc.wait()


def start_driver(how: str) -> tuple[subprocess.Popen[str], int, int]:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, how], stdout=subprocess.PIPE, text=True)
    assert driver.stdout is not None
    raylet, agent = (int(p) for p in driver.stdout.readline().split())
    return driver, raylet, agent


def test_an_agent_whose_title_hid_the_token_dies_with_its_sigkilled_driver_after_its_raylet_died_first(
        stranger: int) -> None:
    driver, raylet, agent = start_driver("kill")
    try:
        assert OWNER_ENV.encode() not in Path(f"/proc/{agent}/environ").read_bytes()  # what makes this hard
        os.kill(raylet, signal.SIGKILL)  # as Ray's parent-death signal does: the agent is orphaned
        assert wait_until(lambda: not alive(raylet))
        driver.kill()
        driver.wait()
        assert wait_until(lambda: not alive(agent)), "the orphaned agent outlived its run"
        assert alive(stranger)
    finally:
        for pid in (raylet, agent):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_clean_stop_returns_once_every_process_of_the_run_is_gone(stranger: int) -> None:
    driver, raylet, agent = start_driver("stop")
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "stopped"
        assert not alive(raylet) and not alive(agent)  # gone when stop returned, not eventually
        assert alive(stranger)
    finally:
        driver.kill()
        driver.wait()


def test_a_pid_on_the_roll_is_the_runs_only_while_its_start_time_is_the_recorded_one(stranger: int) -> None:
    started = int(Path(f"/proc/{stranger}/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert family("no-such-token", {stranger: started + 1}) == {}  # a reused pid: somebody else's process
    assert family("no-such-token", {stranger: started}) == {stranger: started}


def test_the_token_finds_its_carriers_and_their_descendants_and_nothing_else() -> None:
    reaper = Reaper()
    env = os.environ | {OWNER_ENV: reaper.token}
    script = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {AGENT!r}])\ntime.sleep(600)"
    carrier = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        assert wait_until(lambda: len(family(reaper.token)) == 2)
        found = family(reaper.token)
        assert carrier.pid in found and os.getpid() not in found
        (child,) = set(found) - {carrier.pid}
        assert int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1]) == carrier.pid
    finally:
        for pid in family(reaper.token):
            os.kill(pid, signal.SIGKILL)
        carrier.wait()
