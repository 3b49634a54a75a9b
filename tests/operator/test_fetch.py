"""The pods' fetch step (workers/runtime/fetch.py, `rhymerl fetch`): a model folder and a data file from a
local S3-compatible server (s3rver, which scripts/setup.sh --dev installs) and from a claim's folder, into
a temporary folder standing for the pod's data volume; fetched once; and the fetched folder is the model
the job loads. The Hugging Face path is checked for its arguments only: no hub access here."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rhymerl.api.inputs import ModelSpec
from rhymerl.api.sources import MARKER, fetched_data, fetched_model, parse
from rhymerl.workers.model.registry import load_policy
from rhymerl.workers.runtime import fetch as fetching
from rhymerl.workers.runtime.fetch import FetchError, fetch_all, fetched_source

REPO = Path(__file__).resolve().parents[2]
S3RVER = REPO / ".tools" / "s3rver" / "node_modules" / ".bin" / "s3rver"
TINY = REPO / "rhymerl" / "assets" / "tiny-arith"
KEYS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER", "AWS_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An S3 endpoint with bucket `models` holding the embedded model under tiny-arith/ and a data file."""
    if not S3RVER.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{S3RVER} is missing: `bash scripts/setup.sh --dev` installs it")
        pytest.skip(f"{S3RVER} is missing: `bash scripts/setup.sh --dev` installs it")
    server = subprocess.Popen([str(S3RVER), "-d", str(tmp_path_factory.mktemp("s3")), "-p", "0", "-a", "127.0.0.1",
                               "--configure-bucket", "models", "--silent"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        said = ""
        while "listening on" not in said and server.poll() is None:  # s3rver says where once it listens
            said = server.stdout.readline()
        assert "listening on" in said, f"s3rver exited: {said}"
        port = said.rsplit(":", 1)[1].strip()
        endpoint = f"http://127.0.0.1:{port}"
        with pytest.MonkeyPatch.context() as env:
            for key, value in {**KEYS, "AWS_ENDPOINT_URL": endpoint}.items():
                env.setenv(key, value)
            import obstore

            store = fetching._s3_store("models")
            for path in sorted(TINY.iterdir()):
                obstore.put(store, f"tiny-arith/{path.name}", path.read_bytes())
            obstore.put(store, "data/math.jsonl", b'{"prompt": "1+1=", "answer": "2"}\n')
        yield endpoint
    finally:
        server.terminate()
        server.wait()


@pytest.fixture
def aws(s3: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for key, value in {**KEYS, "AWS_ENDPOINT_URL": s3}.items():
        monkeypatch.setenv(key, value)
    return s3


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_model_folder_from_s3_lands_whole_with_its_marker_and_loads_as_the_embedded_model(
        aws: str, tmp_path: Path) -> None:
    said = fetch_all(tmp_path, "s3://models/tiny-arith", "s3://models/data/math.jsonl")
    model = Path(fetched_model(str(tmp_path)))
    assert said == [f"model s3://models/tiny-arith: fetched into {model}",
                    f"data s3://models/data/math.jsonl: fetched into {tmp_path}/data/math.jsonl"]
    fetched = _tree(model)
    assert fetched.pop(MARKER) == b'{"source": "s3://models/tiny-arith"}\n'
    assert fetched == _tree(TINY)
    assert Path(fetched_data(str(tmp_path), parse("s3://models/data/math.jsonl", file=True) or _never())
                ).read_text() == '{"prompt": "1+1=", "answer": "2"}\n'
    # what the job's pods then do with it: the resolved spec names the fetched folder (builders.localized)
    ours, _ = load_policy(ModelSpec(path=str(model)))
    builtin, _ = load_policy(ModelSpec())
    assert ours.state_dict().keys() == builtin.state_dict().keys()
    assert all(torch.equal(ours.state_dict()[k], builtin.state_dict()[k]) for k in builtin.state_dict())


def _never() -> Any:
    raise AssertionError("a fetched source parses")


def test_a_second_start_fetches_nothing_and_another_source_replaces_the_folder(aws: str, tmp_path: Path) -> None:
    fetch_all(tmp_path, "s3://models/tiny-arith", None)
    model = Path(fetched_model(str(tmp_path)))
    (model / "config.json").write_text("{}")  # were it fetched again, this would be overwritten
    assert fetch_all(tmp_path, "s3://models/tiny-arith", None) == [f"model s3://models/tiny-arith: already in {model}"]
    assert (model / "config.json").read_text() == "{}"
    fetch_all(tmp_path, "s3://models/tiny-arith/", None)  # another source text: fetched anew, folder replaced
    assert (model / "config.json").read_bytes() == (TINY / "config.json").read_bytes()
    assert fetched_source(model) == "s3://models/tiny-arith/"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no .partial left


def test_a_missing_prefix_or_object_is_a_fetch_error_naming_the_source(aws: str, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"s3://models/nothing-here: no objects under this prefix"):
        fetch_all(tmp_path, "s3://models/nothing-here", None)
    with pytest.raises(FetchError, match=r"^s3://models/data/none.jsonl: NoSuchKey: The specified key does not "
                                         r"exist. \(http://127.0.0.1:\d+\)$"):
        fetch_all(tmp_path, None, "s3://models/data/none.jsonl")
    assert fetched_source(Path(fetched_model(str(tmp_path)))) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no .partial left


def test_an_unknown_bucket_is_one_line_from_rhymerl_fetch_with_exit_2_and_nothing_left(aws: str, tmp_path: Path) -> None:
    for args in (["--model", "s3://no-such-bucket/tiny-arith"], ["--data", "s3://no-such-bucket/math.jsonl"]):
        res = subprocess.run([str(Path(sys.executable).with_name("rhymerl")), "fetch", "--into", str(tmp_path), *args],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONSAFEPATH": "1"})
        assert res.returncode == 2, res.stderr
        assert res.stderr.splitlines() == [f"error: {args[1]}: NoSuchBucket: The specified bucket does not exist ({aws})"]
        assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_claims_folder_and_file_are_copied_from_where_the_fetch_step_mounts_the_claim(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    (claims / "weights" / "tiny").mkdir(parents=True)
    for path in TINY.iterdir():
        (claims / "weights" / "tiny" / path.name).write_bytes(path.read_bytes())
    (claims / "weights" / "sets").mkdir()
    (claims / "weights" / "sets" / "train.jsonl").write_text("{}\n")
    volume = tmp_path / "volume"
    fetching_all = fetching.fetch_all(volume, "pvc://weights/tiny", "pvc://weights/sets/train.jsonl", claims)
    assert len(fetching_all) == 2
    model = _tree(volume / "model")
    assert model.pop(MARKER) == b'{"source": "pvc://weights/tiny"}\n'
    assert model == _tree(TINY)
    assert (volume / "data" / "train.jsonl").read_text() == "{}\n"
    assert fetched_source(volume / "data") == "pvc://weights/sets/train.jsonl"
    with pytest.raises(FetchError, match=r"pvc://weights/gone: no such folder"):
        fetching.fetch_all(tmp_path / "other", "pvc://weights/gone", None, claims)


def test_the_hub_path_calls_huggingface_hub_with_the_repository_revision_and_volume_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def snapshot(**kwargs: Any) -> str:
        calls.append(kwargs)
        (Path(kwargs["local_dir"]) / "config.json").write_text("{}")
        (Path(kwargs["local_dir"]) / ".cache").mkdir()
        return str(kwargs["local_dir"])

    def one_file(**kwargs: Any) -> str:
        calls.append(kwargs)
        got = Path(kwargs["local_dir"]) / kwargs["filename"]
        got.parent.mkdir(parents=True)
        got.write_text("{}\n")
        return str(got)

    monkeypatch.setattr(fetching, "_snapshot_download", snapshot)
    monkeypatch.setattr(fetching, "_hub_file_download", one_file)
    fetch_all(tmp_path, "hf://Qwen/Qwen2.5-0.5B@main", "hf://datasets/org/math@v1/splits/train.jsonl")
    assert calls == [
        {"repo_id": "Qwen/Qwen2.5-0.5B", "revision": "main", "local_dir": str(tmp_path / "model.partial")},
        {"repo_id": "org/math", "filename": "splits/train.jsonl", "repo_type": "dataset", "revision": "v1",
         "local_dir": str(tmp_path / "data.partial")},
    ]
    assert sorted(_tree(tmp_path / "model")) == [MARKER, "config.json"]
    assert sorted(_tree(tmp_path / "data")) == [MARKER, "train.jsonl"]


def test_rhymerl_fetch_refuses_a_path_and_a_bad_source_with_exit_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rhymerl.cli.main import app

    runner = CliRunner()
    for args, said in ((["--model", "/models/x"], "--model: /models/x is a path"),
                       (["--data", "hf://Qwen/x"], "--data: hf://: a model is hf://ORG/NAME"),
                       ([], "give --model, --data or both")):
        result = runner.invoke(app, ["fetch", "--into", str(tmp_path), *args])
        assert result.exit_code == 2, result.output
        assert said in result.output
