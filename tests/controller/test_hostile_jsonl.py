"""Prompt files and rollout dumps from a hostile hand: every bad line is one DataError or DumpError
naming `file:line`, never a traceback, and a prompt_id is a bounded string or a 64-bit integer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rhymerl.cli.main import app
from rhymerl.workers import dumps
from rhymerl.workers.task.prompts import DataError, read_jsonl

DEEP = "[" * 100_000 + "]" * 100_000


def prompts_file(tmp_path: Path, *lines: bytes) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "1+1", "answer": "2"}\n' + b"\n".join(lines) + b"\n")
    return path


def with_id(raw: str) -> bytes:
    return ('{"prompt": "a", "answer": "b", "prompt_id": ' + raw + "}").encode()


@pytest.mark.parametrize(("raw", "kind"), [('{"a": 1}', "an object"), ("null", "null"), ("[1]", "an array"),
                                           ("1.5", "a fraction"), ("true", "true/false")])
def test_a_prompt_id_that_is_neither_string_nor_integer_names_the_line_and_field(
        tmp_path: Path, raw: str, kind: str) -> None:
    path = prompts_file(tmp_path, with_id(raw))
    with pytest.raises(DataError) as exc:
        read_jsonl(path)
    assert str(exc.value) == f"{path}:2: prompt_id: must be a string or an integer, not {kind}"


def test_an_integer_prompt_id_is_its_decimal_string_up_to_64_bits(tmp_path: Path) -> None:
    path = prompts_file(tmp_path, with_id(str(2**63 - 1)), with_id("-7"))
    assert [p.prompt_id for p in read_jsonl(path)] == ["line-1", "9223372036854775807", "-7"]
    path = prompts_file(tmp_path, with_id(str(2**63)))
    with pytest.raises(DataError, match=r"p.jsonl:2: prompt_id: an integer id must fit in 64 bits"):
        read_jsonl(path)


@pytest.mark.parametrize(("raw", "message"), [
    ('"' + "x" * 257 + '"', "prompt_id: 257 characters; must be 1 to 256"),
    ('""', "prompt_id: 0 characters; must be 1 to 256"),
    ('"a\\u001bb"', "prompt_id: control character U+001B at position 2"),
    ("9" * 5000, "prompt_id: an integer id must fit in 64 bits (-2**63 to 2**63-1)"),
])
def test_a_prompt_id_too_long_empty_with_a_control_character_or_of_5000_digits_is_refused(
        tmp_path: Path, raw: str, message: str) -> None:
    path = prompts_file(tmp_path, with_id(raw))
    with pytest.raises(DataError) as exc:
        read_jsonl(path)
    assert str(exc.value) == f"{path}:2: {message}"


@pytest.mark.parametrize(("line", "message"), [
    (DEEP.encode(), "JSON nested too deeply"),
    (b'{"prompt": "a\x00", "answer": "b"}', "NUL byte at column 14"),
    (b'{"prompt": "\xe9", "answer": "b"}', "not UTF-8: byte 0xe9 at column 13"),
])
def test_deep_nesting_nul_and_non_utf8_bytes_in_a_prompt_file_name_the_line(
        tmp_path: Path, line: bytes, message: str) -> None:
    path = prompts_file(tmp_path, line)
    with pytest.raises(DataError) as exc:
        read_jsonl(path)
    assert str(exc.value) == f"{path}:2: {message}"


def record(step: int) -> dumps.RolloutRecord:
    return dumps.RolloutRecord(step=step, epoch=1, prompt_id="a", sample_index=0, prompt_len=2, prompt_ids=[1, 5],
                               response_ids=[7, 8, 2], reward=1.0, finish_reason="stop", policy_version=0)


def bad_dump(run: Path, line: bytes) -> Path:
    path = dumps.write_step(run, 1, [record(1)])
    path.write_bytes(path.read_bytes() + line + b"\n")
    return path


@pytest.mark.parametrize(("line", "message"), [
    (b'{"step": 1, "prompt_id": "\xff"}', "not UTF-8: byte 0xff at column 27"),
    (b'{"step": 1\x00}', "NUL byte at column 11"),
    (DEEP.encode(), "(line): Invalid JSON: recursion limit exceeded at line 1 column 202"),
    (json.dumps({**record(1).model_dump(), "step": 2**63}).encode(), "step: Input should be less than or equal to "
                                                                     "9223372036854775807"),
])
def test_a_dump_line_with_bad_bytes_deep_nesting_or_a_huge_number_names_file_and_line(
        tmp_path: Path, line: bytes, message: str) -> None:
    path = bad_dump(tmp_path, line)
    with pytest.raises(dumps.DumpError) as exc:
        dumps.read_run(tmp_path)
    assert str(exc.value) == f"{path}:2: {message}"


def test_trace_export_of_a_dump_with_a_bad_byte_is_one_line_and_exit_2_with_nothing_written(tmp_path: Path) -> None:
    path = bad_dump(tmp_path / "run", b'{"step": \xff}')
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(app, ["trace", "export", str(tmp_path / "run"), "-o", str(out)])
    assert (res.exit_code, res.stderr) == (2, f"error: {path}:2: not UTF-8: byte 0xff at column 10\n")
    assert not out.exists()


def test_trace_export_to_an_empty_name_is_one_line_and_exit_2(tmp_path: Path) -> None:
    dumps.write_step(tmp_path / "run", 1, [record(1)])
    res = CliRunner().invoke(app, ["trace", "export", str(tmp_path / "run"), "-o", ""])
    assert (res.exit_code, res.stderr) == (2, "error: cannot write .: it is a folder; give a file name\n")
