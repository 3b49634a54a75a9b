"""Real local servers for tests: a free loopback port and a real redis-server (Debian's package,
installed by scripts/setup.sh --dev)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(password: str | None = None) -> Iterator[str]:
    """A real redis-server on a free loopback port (installed by scripts/setup.sh --dev); yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh --dev installs it)")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*args, *(["--requirepass", password] if password else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
