"""The Ray processes a run starts die with it, however it ends.

`ray.init` starts gcs_server, the raylet and log monitor, and through the raylet the dashboard and
runtime-env agents and every worker. Ray kills the first ones when our process dies (their parent
death signal) but not what the raylet started: after a SIGKILL or an abort those linger for a
minute or two, holding memory and ports. So every process Ray starts for us carries a token in its
environment (`OWNER_ENV`, inherited from this process), and a watchdog process, tied to us by a
pipe only we hold, kills the run's processes as soon as the pipe closes: when we stop it, or when
the kernel closes it because we died. Processes are found by their token, never by name:
somebody else's Ray on this machine is left alone.

The token alone misses some: Ray's agents call setproctitle, which writes the new title over the
memory /proc/PID/environ reads, so their environment no longer shows it. Those are children of a
process that does carry it (the raylet). So the run's processes are the token's carriers and
their descendants, and because the raylet dies with us (orphaning its agents to init) the watchdog
keeps a roll of them while we live: every `LOOK_EVERY_S`, and when we ask (`Reaper.look`, after
ray.init). A pid on the roll counts only while its start time is the one recorded, so a pid the
kernel reused for somebody else's process is never killed.

Run as a script (`python -I reaper.py TOKEN PARENT_PID`) this file is the watchdog; it imports only
the standard library, so it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
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
STOPPED = b"S"  # what `Reaper.stop` writes to the watchdog before it closes the pipe
LOOK = b"L"  # what `Reaper.look` writes; the watchdog answers SEEN once the roll is updated
SEEN = b"K"
LOOK_EVERY_S = 0.5
SETTLE_AFTER_DEATH_S = 3.0
"""The same after the driver died (SIGKILL, abort): the raylet may have been forking an agent as it was
killed, and on a loaded machine the child can take seconds to show its environment (CI once found a
DashboardAgent left behind after a 0.5 s settle)."""

Roll = dict[int, int]
"""pid -> its start time (clock ticks after boot, /proc/PID/stat field 22): who is the run's."""


def _stat(pid_dir: Path) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process; None for a zombie or one gone meanwhile."""
    try:
        fields = (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[19]))


def family(token: str, roll: Roll | None = None) -> Roll:
    """The run's live processes now: the token's carriers, the pids on `roll` (if their start time
    is still the recorded one), and all their descendants; this process excepted."""
    want = f"{OWNER_ENV}={token}".encode()
    me = os.getpid()
    stats: dict[int, tuple[int, int]] = {}
    ours: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        stat = _stat(entry)
        if stat is None:
            continue
        stats[pid] = stat
        try:
            env = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(var.startswith(want) for var in env.split(b"\0")):
            ours.add(pid)
    ours |= {pid for pid, started in (roll or {}).items() if pid in stats and stats[pid][1] == started}
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    todo = list(ours)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in ours:
                ours.add(child)
                todo.append(child)
    return {pid: stats[pid][1] for pid in ours}


def sweep(token: str, roll: Roll | None = None, timeout_s: float = GONE_TIMEOUT_S,
          settle_s: float = SETTLE_S) -> list[int]:
    """SIGKILL the run's processes (`family`) until none has been left for `settle_s` (or
    `timeout_s` passed); the pids killed. Whatever still ran has had its chance to stop gracefully
    (ray.shutdown) or never will (its driver is dead); every file it wrote is written whole or not
    at all. The settling covers a raylet that, in its last moments, starts again an agent killed
    before it."""
    roll = dict(roll or {})
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        found = family(token, roll)
        roll.update(found)  # a child seen once stays the run's after its parent is killed
        if not found:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= settle_s:
                break
        else:
            quiet_since = None
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        time.sleep(0.05)
    return sorted(set(killed))


class Reaper:
    """One run's token and watchdog. `start` before Ray starts anything (the token is set in this
    process's environment, so every Ray process inherits it), `look` once Ray has started, `stop`
    after ray.shutdown."""

    def __init__(self) -> None:
        self.token = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._before: str | None = None

    def start(self) -> None:
        self._watchdog = subprocess.Popen([sys.executable, "-I", str(Path(__file__)), self.token, str(os.getpid())],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          start_new_session=True)  # Ctrl-C at the terminal must not reach it
        self._before = os.environ.get(OWNER_ENV)
        os.environ[OWNER_ENV] = self.token

    def look(self) -> None:
        """Have the watchdog put the run's processes as they are now on its roll, and wait until it
        has: what runs now is killed with us even if its parent dies first."""
        watchdog = self._watchdog
        if watchdog is None or watchdog.stdin is None or watchdog.stdout is None:
            return
        watchdog.stdin.write(LOOK)
        watchdog.stdin.flush()
        if watchdog.stdout.read(1) != SEEN:
            raise RuntimeError(f"the run's watchdog (pid {watchdog.pid}) exited: exit status {watchdog.poll()}")

    def stop(self) -> None:
        """Kill what is left of the run's Ray processes, wait until they are gone, end the watchdog."""
        if self._before is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = self._before
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is None or watchdog.stdin is None:
            return
        watchdog.stdin.write(STOPPED)  # a clean stop: it settles briefly
        watchdog.stdin.close()  # it sweeps (it has the roll), and exits
        try:
            watchdog.wait(GONE_TIMEOUT_S + SETTLE_AFTER_DEATH_S + 5.0)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()
        finally:
            if watchdog.stdout is not None:
                watchdog.stdout.close()


def _watch(token: str, parent: int) -> None:
    """Keep the roll until the pipe from `parent` closes (or `parent` is gone and this process was
    handed to another), then sweep: briefly after `Reaper.stop` said STOPPED, at length after a
    death."""
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # a signal to the run's group is for the run, not for this
    roll: Roll = {}
    said = b""
    while os.getppid() == parent:
        ready, _, _ = select.select([sys.stdin.buffer], [], [], LOOK_EVERY_S)
        data = os.read(sys.stdin.fileno(), 1 << 12) if ready else b""
        if ready and not data:
            break
        said = (said + data)[-1:]
        roll = family(token, roll)
        if LOOK in data:
            with contextlib.suppress(OSError):  # the driver is gone: the next read says so
                os.write(sys.stdout.fileno(), SEEN)
    sweep(token, roll, settle_s=SETTLE_S if said == STOPPED else SETTLE_AFTER_DEATH_S)


if __name__ == "__main__":
    _watch(sys.argv[1], int(sys.argv[2]))
