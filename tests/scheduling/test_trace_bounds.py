"""Trace CSVs from a hostile hand: read as a stream of lines into compact columns, lengths bounded,
and whatever cannot be read is one TraceError naming `file:line`."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rhymerl.cli.main import app
from rhymerl.tools.traces import TraceError, read_trace
from rhymerl.tools.traces import progress as progress_module
from rhymerl.tools.traces.io import MAX_LEN, parse_trace
from rhymerl.tools.traces.progress import reading_bar

HEADER = b"step,prompt_id,input_len,output_len\n"


def trace_file(tmp_path: Path, body: bytes, header: bytes = HEADER) -> Path:
    path = tmp_path / "t.csv"
    path.write_bytes(header + body)
    return path


@pytest.mark.parametrize(("body", "message"), [
    (b"1,a,2," + b"1" + b"0" * 30 + b"\n", "output_len: 1000000000000000000000000000000 is over the maximum 16777216"),
    (b"1,a,16777217,3\n", "input_len: 16777217 is over the maximum 16777216"),
    (b"1000000001,a,2,3\n", "step: 1000000001 is over the maximum 1000000000"),
    (b"1,a,2," + b"9" * 5000 + b"\n", "output_len: 99999999999999999999... (5000 digits) is over the maximum 16777216"),
    (b"1,a,2,1_0\n", "output_len: '1_0' is not an integer"),
    (b"1,a,2,\xd9\xa3\n", "output_len: '\u0663' is not an integer"),
    (b"1," + b"p" * 257 + b",2,3\n", "prompt_id: 257 characters; must be 1 to 256"),
    (b"1,a\x1b,2,3\n", "prompt_id: control character U+001B at position 2"),
    (b"1,a\xff,2,3\n", "not UTF-8: byte 0xff at column 4"),
    (b"1,a\x00,2,3\n", "NUL byte at column 4"),
    (b'1,a,2,3,"' + b"x" * 200_000 + b'"\n', "not CSV: a field longer than 131072 characters"),
    (b"1,a,2," + b"3" * 2_000_000 + b"\n", "line longer than 1048576 bytes"),
])
def test_oversized_values_and_unreadable_bytes_name_the_file_line_and_column(
        tmp_path: Path, body: bytes, message: str) -> None:
    header = HEADER.rstrip(b"\n") + b",text\n" if b'"' in body else HEADER
    path = trace_file(tmp_path, b"1,a,2,3" + (b",t" if b'"' in body else b"") + b"\n" + body, header)
    with pytest.raises(TraceError) as exc:
        read_trace(path)
    assert str(exc.value) == f"{path}:3: {message}"


def test_lengths_at_the_bound_and_padded_cells_are_read(tmp_path: Path) -> None:
    tr = read_trace(trace_file(tmp_path, f"1,a,{MAX_LEN},0\n 2 , a ,+3, 007\n".encode()))
    assert tr.input_len.tolist() == [MAX_LEN, 3] and tr.output_len.tolist() == [0, 7]
    assert list(tr.prompt_id) == ["a", "a"] and tr.ids == "stable"


class LinesOnly(io.BytesIO):
    """A stream that may only be read a line at a time, and that fails when read past `stop` lines."""

    def __init__(self, data: bytes, stop: int) -> None:
        super().__init__(data)
        self.lines, self.stop = 0, stop

    def read(self, size: int | None = -1) -> bytes:
        raise AssertionError("read the whole stream")

    def readline(self, size: int | None = -1) -> bytes:
        self.lines += 1
        assert self.lines <= self.stop, "read past the bad line"
        return super().readline(size)


def test_the_reader_streams_lines_and_stops_at_the_first_bad_one() -> None:
    stream = LinesOnly(HEADER + b"1,a,2,3\n1,a,2,x\n" + b"2,a,2,3\n" * 1000, stop=3)
    with pytest.raises(TraceError, match=r"^s.csv:3: output_len: 'x' is not an integer$"):
        parse_trace(stream, "s.csv")
    assert stream.lines == 3


def test_rows_are_kept_in_compact_columns_with_one_copy_of_each_prompt_id(tmp_path: Path) -> None:
    rows = 50_000
    body = "".join(f"{i // 500 + 1},prompt-{i % 100:04d},{i % 700},{i % 900}\n" for i in range(rows)).encode()
    path = trace_file(tmp_path, body)
    tracemalloc.start()
    try:
        tr = read_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(tr) == rows and tr.num_steps == 100 and tr.ids == "stable" and tr.epoch_length() == 1
    assert tr.prompt_id.names is not None and len(tr.prompt_id.names) == 100
    assert tr.prompt_id.codes.dtype == np.int64 and tr.prompt_id[rows - 1] == "prompt-0099"
    # the old reader kept the whole text and a Python object per cell: about 320 bytes a row
    assert peak < 150 * rows


def test_progress_is_reported_in_bytes_of_the_file(tmp_path: Path) -> None:
    path = trace_file(tmp_path, b"1,a,2,3\n" * 70_000)
    seen: list[tuple[int, int]] = []
    read_trace(path, progress=lambda done, size: seen.append((done, size)))
    size = path.stat().st_size
    assert seen and all(s == size for _, s in seen) and all(0 < d <= size for d, _ in seen)


def test_without_a_terminal_progress_is_a_plain_line_on_stderr(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress_module, "LINE_EVERY_S", 0.0)
    with reading_bar("big.csv") as on_read:
        assert on_read is not None
        on_read(3 << 20, 6 << 20)
    assert capsys.readouterr().err == "reading big.csv: 3 MiB (50%) in 0 s\n"


def test_bench_schedule_on_an_oversized_length_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = trace_file(tmp_path, b"1,a,2," + b"9" * 30 + b"\n")
    res = CliRunner().invoke(app, ["bench", "schedule", "--trace", str(path)])
    assert (res.exit_code, res.stderr) == (
        2, f"error: {path}:2: output_len: 999999999999999999999999999999 is over the maximum 16777216\n")


def test_trace_synth_to_an_empty_name_writes_nothing_and_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["trace", "synth", "math", "-o", ""])
    assert (res.exit_code, res.stderr) == (2, "error: cannot write .: it is a folder; give a file name\n")
