"""Workload trace CSVs: parsing other systems' files, clear errors, and exporting our own runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rhymerl.tools.traces import TraceError, read_trace, write_trace
from rhymerl.tools.traces.export import export_run
from rhymerl.workers.dumps import RolloutRecord, write_step


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_trace_with_stable_prompt_ids_can_feed_history(tmp_path: Path) -> None:
    tr = read_trace(_write(tmp_path, "step,prompt_id,input_len,output_len\n7,a,10,100\n7,a,10,120\n8,b,5,50\n9,a,10,130\n"))
    assert tr.ids == "stable"
    assert tr.step.tolist() == [1, 1, 2, 3] and tr.source_steps == [7, 8, 9]
    assert tr.epoch_length() == 2
    assert tr.output_len.tolist() == [100, 120, 50, 130]


def test_ids_that_never_recur_are_step_local_and_say_history_is_unavailable(tmp_path: Path) -> None:
    tr = read_trace(_write(tmp_path, "step,prompt_id,input_len,output_len\n1,q0,10,100\n1,q0,10,90\n2,q0x,5,50\n"))
    assert tr.ids == "step-local"
    assert tr.epoch_length() == 0
    assert "no history" in tr.id_note()


def test_a_trace_without_prompt_ids_makes_every_row_its_own_prompt(tmp_path: Path) -> None:
    tr = read_trace(_write(tmp_path, "output_len,step,input_len\n100,2,10\n90,1,12\n"))
    assert tr.ids == "none"
    assert tr.output_len.tolist() == [90, 100]  # sorted by step, columns in any order
    assert len(set(tr.prompt_id)) == 2


def test_extra_columns_blank_lines_and_comments_are_tolerated(tmp_path: Path) -> None:
    tr = read_trace(_write(tmp_path, "\ufeff# exported by another system\nstep,input_len,output_len,reward\n\n1,3,4,0.5\n"))
    assert len(tr) == 1
    assert tr.notes == ["ignored column(s): reward"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("step,input_len,output_len\n1,2,3\n1,x,3\n", ":3: input_len: 'x' is not an integer"),
        ("step,input_len,output_len\n1,2,3\n\n1,2,-4\n", ":4: output_len: -4 is negative"),
        ("step,input_len,output_len\n1,2\n", ":2: expected 3 fields"),
        ("step,input_len,output_len\n1,,3\n", ":2: input_len: empty"),
        ("step,prompt_id,input_len,output_len\n1,a,2,3\n1, ,2,3\n", ":3: prompt_id: empty"),
        ("step,prompt,input_len\n1,a,2\n", ":1: header: missing column(s) output_len"),
        ("step,step,input_len,output_len\n", ":1: header: duplicate column(s) step"),
        ("", ":1: empty trace"),
        ("step,input_len,output_len\n", ":1: no rows after the header"),
    ],
)
def test_bad_input_names_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(TraceError) as exc:
        read_trace(path)
    assert str(exc.value).startswith(str(path))
    assert message in str(exc.value)


def test_a_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent.csv")


def test_written_traces_read_back_and_leave_no_temporary_file(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "t.csv"
    assert write_trace(out, [(1, "a", 3, 4), (2, "a", 3, 5)]) == 2
    assert read_trace(out).output_len.tolist() == [4, 5]
    assert [p.name for p in out.parent.iterdir()] == ["t.csv"]
    write_trace(out, [(1, None, 3, 4)])
    assert out.read_text().splitlines()[0] == "step,input_len,output_len"
    with pytest.raises(ValueError, match="every row"):
        write_trace(out, [(1, None, 3, 4), (1, "a", 3, 4)])


def _record(step: int, pid: str, idx: int, n: int) -> RolloutRecord:
    return RolloutRecord(step=step, epoch=1, prompt_id=pid, sample_index=idx, prompt_len=3, prompt_ids=[1, 2, 3],
                         response_ids=list(range(n)), reward=0.0, finish_reason="stop", policy_version=step - 1)


def test_our_run_dumps_export_to_the_trace_format(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_step(run, 1, [_record(1, "p1", 0, 5), _record(1, "p1", 1, 7)])
    write_step(run, 2, [_record(2, "p1", 0, 6)])
    out = tmp_path / "trace.csv"
    assert export_run(run, out) == 3
    assert out.read_text() == "step,prompt_id,input_len,output_len\n1,p1,3,5\n1,p1,3,7\n2,p1,3,6\n"
    assert read_trace(out).ids == "stable"
