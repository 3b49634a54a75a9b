"""The Ray processes a run starts die with it, however it ends.

`ray.init` starts gcs_server, the raylet and log monitor, and through the raylet the dashboard and
runtime-env agents and every worker. Ray kills the first ones when our process dies (their parent
death signal) but not what the raylet started: after a SIGKILL or an abort those linger for a
minute or two, holding memory and ports. So every process Ray starts for us carries a token in its
environment (`OWNER_ENV`, inherited from this process), and a watchdog process, tied to us by a
pipe only we hold, kills every process that carries the token as soon as the pipe closes: when we
stop it, or when the kernel closes it because we died. On a normal exit `Reaper.stop` also does the
same sweep itself, so the processes are gone before it returns. Processes are found by their token,
never by name: somebody else's Ray on this machine is left alone.

Run as a script (`python -I reaper.py TOKEN PARENT_PID`) this file is the watchdog; it imports only
the standard library, so it starts in milliseconds.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

OWNER_ENV = "RHYMERL_RAY_OWNER"
GONE_TIMEOUT_S = 30.0  # a killed process is reaped by its parent or init; this long is a stuck kernel
SETTLE_S = 0.5  # no process of the run seen for this long: none is left to start another
STOPPED = b"stopped"  # what `Reaper.stop` writes to the watchdog before it closes the pipe
SETTLE_AFTER_DEATH_S = 3.0
"""The same after the driver died (SIGKILL, abort): the raylet may have been forking an agent as it was
killed, and on a loaded machine the child can take seconds to show its environment (CI once found a
DashboardAgent left behind after a 0.5 s settle)."""


def carrying(token_prefix: str) -> list[int]:
    """Live processes (not zombies: their environment reads empty) whose OWNER_ENV starts with
    `token_prefix` (a whole token, or a driver's pid and "-"), this process excepted."""
    want = f"{OWNER_ENV}={token_prefix}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(var.startswith(want) for var in env.split(b"\0")):
            found.append(int(entry.name))
    return found


def sweep(token: str, timeout_s: float = GONE_TIMEOUT_S, settle_s: float = SETTLE_S) -> list[int]:
    """SIGKILL every process carrying `token` until none has been left for `settle_s` (or `timeout_s`
    passed); the pids killed. Whatever still ran has had its chance to stop gracefully
    (ray.shutdown) or never will (its driver is dead); every file it wrote is written whole or not at
    all. The settling covers a raylet that, in its last moments, starts again an agent killed before
    it."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        pids = carrying(token)
        if not pids:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= settle_s:
                break
        else:
            quiet_since = None
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        time.sleep(0.05)
    return sorted(set(killed))


class Reaper:
    """One run's token and watchdog. `start` before Ray starts anything (the token is set in this
    process's environment, so every Ray process inherits it), `stop` after ray.shutdown."""

    def __init__(self) -> None:
        self.token = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._before: str | None = None

    def start(self) -> None:
        self._watchdog = subprocess.Popen([sys.executable, "-I", str(Path(__file__)), self.token, str(os.getpid())],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          start_new_session=True)  # Ctrl-C at the terminal must not reach it
        self._before = os.environ.get(OWNER_ENV)
        os.environ[OWNER_ENV] = self.token

    def stop(self) -> None:
        """Kill what is left of the run's Ray processes, wait until they are gone, end the watchdog."""
        if self._before is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = self._before
        sweep(self.token)
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.stdin is not None:
            watchdog.stdin.write(STOPPED)  # a clean stop: its sweep settles as briefly as ours
            watchdog.stdin.close()  # its sweep finds nothing left, and it exits
            try:
                watchdog.wait(GONE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait()


def _watch(token: str, parent: int) -> None:
    """Until the pipe from `parent` closes (or `parent` is gone and this process was handed to
    another), then sweep: briefly after `Reaper.stop` said STOPPED, at length after a death."""
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # a signal to the run's group is for the run, not for this
    said = b""
    while os.getppid() == parent:
        ready, _, _ = select.select([sys.stdin.buffer], [], [], 1.0)
        if ready:
            data = os.read(sys.stdin.fileno(), 1 << 12)
            if not data:
                break
            said += data
    sweep(token, settle_s=SETTLE_S if said.endswith(STOPPED) else SETTLE_AFTER_DEATH_S)


if __name__ == "__main__":
    _watch(sys.argv[1], int(sys.argv[2]))
