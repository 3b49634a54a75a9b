"""`rhymerl fetch` fails fast (workers/runtime/fetch.py, fetch_deadline.py): against loopback servers that
accept a connection and never answer, or answer a byte at a time forever, against a closed port and
without credentials, the command ends within its deadline (plus slack for the interpreter) with one
`error:` line naming the source and the cause, exit 2, no traceback and no `.partial` folder.

Each run is the real command in a child process, with an environment made here: no credentials or
endpoints of the machine's leak in. Deadlines are seconds; the tests assert what is said, not how long
it took."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rhymerl.workers.runtime import fetch as fetching
from rhymerl.workers.runtime.fetch import FetchError, fetch_all
from rhymerl.workers.runtime.fetch_deadline import Limits

RHYMERL = str(Path(sys.executable).with_name("rhymerl"))
FAST = ["--connect-timeout", "1", "--read-timeout", "1"]
SLACK_S = 60  # a run that has not ended this long after its deadline hangs
ONE_MB = 1 << 20


@dataclass
class Server:
    url: str
    connections: list[socket.socket] = field(default_factory=list)


@contextlib.contextmanager
def loopback(answer: bool) -> Iterator[Server]:
    """A server that accepts every connection and then either never answers (`answer` False) or answers
    each request with the headers of a 1 MB body and sends it one byte every 0.2 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    server = Server(f"http://127.0.0.1:{listener.getsockname()[1]}")
    done = threading.Event()

    def trickle(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: application/json\r\n"
                         b'ETag: "e"\r\nLast-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n' % ONE_MB)
            while not done.wait(0.2):
                conn.sendall(b" ")

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            server.connections.append(conn)
            if answer:
                threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        done.set()
        thread.join()
        listener.close()
        for conn in server.connections:
            conn.close()


@contextlib.contextmanager
def hub_answering_404(error_code: str) -> Iterator[str]:
    """A Hugging Face hub that answers every request 404 with the hub's error code header."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", error_code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

        def log_message(self, *_: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def fetch_command(tmp_path: Path, args: list[str], env: dict[str, str], deadline_s: float) -> tuple[int, str]:
    """`rhymerl fetch --into tmp_path/volume ARGS` in a child with only `env` (and PATH, HOME): its exit
    code and its stderr, which must be free of tracebacks; nothing of stdout."""
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"),
            "PYTHONSAFEPATH": "1"}
    res = subprocess.run([RHYMERL, "fetch", "--into", str(tmp_path / "volume"), *args], env={**base, **env},
                         capture_output=True, text=True, timeout=deadline_s + SLACK_S)
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    assert res.stdout == ""
    return res.returncode, res.stderr


def nothing_partial(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.partial"))


S3 = {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_REGION": "us-east-1"}


def test_an_s3_fetch_from_a_server_that_never_answers_fails_with_one_line_naming_the_source(tmp_path: Path) -> None:
    with loopback(answer=False) as server:
        code, said = fetch_command(tmp_path, ["--model", "s3://models/tiny", *FAST, "--deadline", "60"],
                                   {**S3, "AWS_ENDPOINT_URL": server.url}, 60)
    assert code == 2
    assert said.splitlines() == [f"error: s3://models/tiny: timed out (connect timeout 1 s, read timeout 1 s) "
                                 f"({server.url}, after 3 retries)"]
    assert nothing_partial(tmp_path) == []


def test_an_s3_download_trickling_past_the_deadline_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    with loopback(answer=True) as server:
        code, said = fetch_command(tmp_path, ["--data", "s3://models/train.jsonl", "--read-timeout", "30",
                                              "--deadline", "2"], {**S3, "AWS_ENDPOINT_URL": server.url}, 2)
        assert server.connections  # it was downloading
    assert code == 2
    assert said.splitlines() == ["error: s3://models/train.jsonl: not fetched within the 2 s deadline "
                                 "(--deadline, FETCH_DEADLINE_S)"]
    assert nothing_partial(tmp_path) == []


def test_a_closed_port_is_one_line_with_the_endpoint_its_credentials_masked(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    code, said = fetch_command(tmp_path, ["--model", "s3://models/tiny", *FAST],
                               {**S3, "AWS_ENDPOINT_URL": f"http://user:hunter2@127.0.0.1:{port}"}, 60)
    assert code == 2
    assert said.splitlines() == [f"error: s3://models/tiny: Connection refused (http://user:***@127.0.0.1:{port}, "
                                 "after 3 retries)"]
    assert nothing_partial(tmp_path) == []


def test_without_credentials_s3_fails_at_once_and_never_asks_the_metadata_service(tmp_path: Path) -> None:
    with loopback(answer=False) as metadata:
        code, said = fetch_command(tmp_path, ["--model", "s3://models/tiny", *FAST],
                                   {"AWS_METADATA_ENDPOINT": metadata.url}, 60)
        asked = len(metadata.connections)
    assert code == 2
    assert said.splitlines() == [
        "error: s3://models/tiny: no S3 credentials in the environment: give AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (or a web identity), AWS_SKIP_SIGNATURE=true for a public bucket, or "
        "--s3-instance-credentials (FETCH_S3_INSTANCE_CREDENTIALS=true) for the node's instance role"]
    assert asked == 0
    assert nothing_partial(tmp_path) == []


def test_instance_credentials_asked_for_are_fetched_within_the_deadline(tmp_path: Path) -> None:
    with loopback(answer=False) as metadata:
        code, said = fetch_command(tmp_path, ["--model", "s3://models/tiny", "--read-timeout", "30", "--deadline", "2"],
                                   {"AWS_METADATA_ENDPOINT": metadata.url, "FETCH_S3_INSTANCE_CREDENTIALS": "true"}, 2)
        asked = len(metadata.connections)
    assert code == 2
    assert said.splitlines() == ["error: s3://models/tiny: not fetched within the 2 s deadline "
                                 "(--deadline, FETCH_DEADLINE_S)"]
    assert asked >= 1
    assert nothing_partial(tmp_path) == []


def test_a_hub_that_never_answers_fails_with_one_line_naming_the_source(tmp_path: Path) -> None:
    with loopback(answer=False) as hub:
        code, said = fetch_command(tmp_path, ["--model", "hf://org/model", *FAST, "--deadline", "60"],
                                   {"HF_ENDPOINT": hub.url}, 60)
    assert code == 2
    assert said.splitlines() == [f"error: hf://org/model: timed out (connect timeout 1 s, read timeout 1 s) "
                                 f"({hub.url})"]
    assert nothing_partial(tmp_path) == []


def test_a_hub_download_retrying_on_a_silent_server_ends_at_the_deadline_without_retry_chatter(
        tmp_path: Path) -> None:
    with loopback(answer=False) as hub:
        # 1 s read timeouts and huggingface_hub's 1 s backoff: its second try comes about 2 s in, far
        # inside the deadline even on a loaded machine
        code, said = fetch_command(tmp_path, ["--data", "hf://datasets/org/math/train.jsonl", *FAST,
                                              "--deadline", "8"], {"HF_ENDPOINT": hub.url}, 8)
        tries = len(hub.connections)
    assert code == 2
    assert said.splitlines() == ["error: hf://datasets/org/math/train.jsonl: not fetched within the 8 s deadline "
                                 "(--deadline, FETCH_DEADLINE_S)"]
    assert tries >= 2  # huggingface_hub retried, and said nothing of it
    assert nothing_partial(tmp_path) == []


def test_a_hub_answering_a_byte_at_a_time_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    with loopback(answer=True) as hub:
        code, said = fetch_command(tmp_path, ["--model", "hf://org/model", *FAST, "--deadline", "2"],
                                   {"HF_ENDPOINT": hub.url}, 2)
    assert code == 2
    assert said.splitlines() == ["error: hf://org/model: not fetched within the 2 s deadline "
                                 "(--deadline, FETCH_DEADLINE_S)"]
    assert nothing_partial(tmp_path) == []


@pytest.mark.parametrize(("source", "error_code", "meaning"), [
    ("--model=hf://org/gone", "RepoNotFound", "no such repository, or a private one that HF_TOKEN does not open"),
    ("--data=hf://datasets/org/math/gone.jsonl", "EntryNotFound", "no such file in the repository"),
])
def test_a_hub_404_is_one_line_saying_what_is_missing(tmp_path: Path, source: str, error_code: str,
                                                      meaning: str) -> None:
    with hub_answering_404(error_code) as hub:
        code, said = fetch_command(tmp_path, [source, *FAST], {"HF_ENDPOINT": hub}, 60)
    assert code == 2
    assert said.splitlines() == [f"error: {source.partition('=')[2]}: HTTP 404: {meaning} ({hub})"]
    assert nothing_partial(tmp_path) == []


def test_into_naming_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "volume").write_text("")
    code, said = fetch_command(tmp_path, ["--model", "s3://models/tiny"], S3, 60)
    assert code == 2
    assert said.splitlines() == [f"error: cannot write into {tmp_path / 'volume'}: it is a file, not a folder"]


@pytest.mark.parametrize(("args", "env", "said"), [
    (["--deadline", "0"], {}, "error: --deadline=0.0: not a positive number of seconds"),
    ([], {"FETCH_READ_TIMEOUT_S": "soon"}, "error: FETCH_READ_TIMEOUT_S=soon: not a positive number of seconds"),
    ([], {"FETCH_S3_INSTANCE_CREDENTIALS": "maybe"}, "error: FETCH_S3_INSTANCE_CREDENTIALS='maybe': not true or false"),
])
def test_a_limit_that_is_no_number_of_seconds_is_refused_by_name(tmp_path: Path, args: list[str],
                                                                 env: dict[str, str], said: str) -> None:
    code, stderr = fetch_command(tmp_path, ["--model", "s3://models/tiny", *args], env, 60)
    assert (code, stderr.splitlines()) == (2, [said])


def test_the_deadline_holds_when_the_library_never_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    released = threading.Event()

    def hangs(**kwargs: object) -> str:
        (Path(str(kwargs["local_dir"])) / "config.json").write_text("{}")
        released.wait()
        (Path(str(kwargs["local_dir"])) / "late.json").write_text("{}")  # what a stopped fetch must not leave
        return str(kwargs["local_dir"])

    monkeypatch.setattr(fetching, "_snapshot_download", hangs)
    try:
        with pytest.raises(FetchError, match=r"^hf://org/model: not fetched within the 0.5 s deadline"):
            fetch_all(tmp_path, "hf://org/model", None, limits=Limits(deadline_s=0.5))
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    finally:
        released.set()
    time.sleep(0.2)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
