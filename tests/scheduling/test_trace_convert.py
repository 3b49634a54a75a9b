"""`rhymerl trace convert` (veRL-style and multi-turn agent logs) and the trace CSV's `turns` column."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rhymerl.cli.trace import trace_app
from rhymerl.tools.traces import TraceError, read_trace, write_trace
from rhymerl.tools.traces.convert import convert
from rhymerl.tools.traces.io import turns_text

TOKENIZER = Path(__file__).resolve().parents[2] / "rhymerl" / "assets" / "tiny-arith"  # a character tokenizer


def _jsonl(path: Path, *objects: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))
    return path


def test_a_verl_log_of_texts_is_counted_by_the_named_tokenizer_and_grouped_by_identical_inputs(tmp_path: Path) -> None:
    logs = tmp_path / "rollout"
    _jsonl(logs / "3.jsonl", {"input": "1+2=", "output": "3", "score": 1.0, "step": 3},
           {"input": "1+2=", "output": "12", "score": 0.0, "step": 3}, {"input": "9+9=", "output": "18", "step": 3})
    _jsonl(logs / "10.jsonl", {"input": "1+2=", "output": "3"})  # step from the file name; the input recurs
    assert convert("verl", [logs], tmp_path / "t.csv", TOKENIZER) == 4
    tr = read_trace(tmp_path / "t.csv")
    assert tr.source_steps == [3, 10] and tr.ids == "stable"
    assert list(tr.prompt_id) == ["p0", "p0", "p1", "p0"]
    assert tr.input_len.tolist() == [5, 5, 5, 5]  # BOS + 4 characters
    assert tr.output_len.tolist() == [1, 2, 2, 1]


def test_a_verl_log_of_texts_without_a_tokenizer_is_refused_naming_the_missing_field(tmp_path: Path) -> None:
    log = _jsonl(tmp_path / "1.jsonl", {"input": "1+2=", "output": "3", "step": 1})
    with pytest.raises(TraceError, match=re.escape(f"{log}:1: prompt_length: missing; this log holds texts")):
        convert("verl", [log], tmp_path / "t.csv")
    assert not (tmp_path / "t.csv").exists()


def test_verl_token_counts_and_packed_step_lists_are_read_as_they_are(tmp_path: Path) -> None:
    counted = _jsonl(tmp_path / "a" / "1.jsonl", {"input": "q", "prompt_length": 7, "response_length": 40},
                     {"input": "q", "prompt_length": 7, "response_length": 9})
    assert convert("verl", [counted], tmp_path / "a.csv") == 2
    assert read_trace(tmp_path / "a.csv").output_len.tolist() == [40, 9]
    packed = _jsonl(tmp_path / "b.jsonl", {"step": 2, "response_lengths": [10, 20, 30, 40], "prompt_lengths": [5, 5, 6, 6],
                                           "group_size": 2},
                    {"step": 1, "response_lengths": [1, 2], "prompt_lengths": [3, 3], "group_size": 2})
    convert("verl", [packed], tmp_path / "b.csv")
    tr = read_trace(tmp_path / "b.csv")
    assert tr.step.tolist() == [1, 1, 2, 2, 2, 2] and tr.output_len.tolist() == [1, 2, 10, 20, 30, 40]
    assert list(tr.prompt_id) == ["p2", "p2", "p0", "p0", "p1", "p1"] and tr.ids == "step-local"
    bad = _jsonl(tmp_path / "c.jsonl", {"step": 1, "response_lengths": [1, 2], "prompt_lengths": [3]})
    with pytest.raises(TraceError, match=re.escape(f"{bad}:1: prompt_lengths: 1 lengths for 2 response_lengths")):
        convert("verl", [bad], tmp_path / "c.csv")


def test_an_agent_log_becomes_a_trace_with_turns_and_tool_seconds(tmp_path: Path) -> None:
    log = _jsonl(tmp_path / "agent.jsonl",
                 {"step": 1, "prompt_id": "q1", "input_len": 300,
                  "turns": [{"tokens": 120, "tool_s": 1.5}, {"tokens": 80, "tool_s": 0.25}, {"tokens": 40}]},
                 {"step": 1, "prompt_id": "q1", "input_len": 300, "turns": [{"tokens": 500, "tool_s": 3.0}]})
    assert convert("agent", [log], tmp_path / "t.csv") == 2
    assert (tmp_path / "t.csv").read_text().splitlines()[1:] == ["1,q1,300,240,120:1.5 80:0.25 40", "1,q1,300,500,"]
    tr = read_trace(tmp_path / "t.csv")
    assert tr.turns is not None and tr.output_len.tolist() == [240, 500]
    assert tr.turns.of_row(0) == ([120, 80, 40], [1.5, 0.25, 0.0]) and tr.turns.of_row(1) == ([500], [0.0])


@pytest.mark.parametrize(("line", "message"), [
    ({"step": 1, "input_len": 3, "turns": []}, "turns: expected a non-empty list"),
    ({"step": 1, "input_len": 3, "turns": [{"tokens": 2}, {"tokens": 1}]}, "turns[0]: tool_s: missing"),
    ({"step": 1, "input_len": 3, "turns": [{"tokens": 2, "tool_s": -1}, {"tokens": 1}]},
     "turns[0]: tool_s: -1 must be a number in 0..86400"),
    ({"step": 1, "input_len": 3, "turns": [{"tokens": 0, "tool_s": 1}, {"tokens": 1}]},
     "turns[0]: tokens: 0 must lie in 1..16777216"),
    ({"input_len": 3, "turns": [{"tokens": 1}]}, "step: missing, and the file name is not a step number"),
])
def test_a_bad_agent_line_is_refused_naming_file_line_and_field(tmp_path: Path, line: object, message: str) -> None:
    good = {"step": 1, "input_len": 3, "turns": [{"tokens": 1}]}
    log = _jsonl(tmp_path / "agent.jsonl", good, line)
    with pytest.raises(TraceError, match=re.escape(f"{log}:2: {message}")):
        convert("agent", [log], tmp_path / "t.csv")


def test_the_convert_command_exits_2_and_writes_nothing_on_a_bad_log(tmp_path: Path) -> None:
    log = tmp_path / "agent.jsonl"
    log.write_text('{"step": 1, "input_len": 3, "turns": [{"tokens": 1}]}\n{"step": 1,\n')
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(trace_app, ["convert", "--from", "agent", str(log), "-o", str(out)])
    assert res.exit_code == 2 and f"{log}:2: not JSON" in res.output and not out.exists()
    res = CliRunner().invoke(trace_app, ["convert", "--from", "vllm", str(log), "-o", str(out)])
    assert res.exit_code == 2 and "--from: 'vllm' is not a log class; choose one of verl, agent" in res.output


def test_the_turns_column_round_trips_and_bad_cells_name_their_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_trace(path, [(1, "a", 5, 7), (1, "a", 5, 2)], turns=[turns_text([3, 4], [2.5, 0.0]), ""])
    tr = read_trace(path)
    assert tr.turns is not None and tr.turns.of_row(0) == ([3, 4], [2.5, 0.0]) and tr.turns.of_row(1) == ([2], [0.0])
    for cell, message in [("3:1 3", "turns: the turns' tokens sum to 6, output_len is 7"),
                          ("3 4", "turns (turn 1): '3' lacks ':SECONDS'"),
                          ("3:1 4:2", "turns: the last turn '4:2' has a tool call"),
                          ("3:x 4", "turns (turn 1): tool seconds 'x' must be a number")]:
        path.write_text(f"step,prompt_id,input_len,output_len,turns\n1,a,5,7,{cell}\n")
        with pytest.raises(TraceError, match=re.escape(f"{path}:2: {message}")):
            read_trace(path)
