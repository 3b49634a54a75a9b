from __future__ import annotations

import json
from pathlib import Path

import pytest

from rhymerl.api.inputs import DataSpec
from rhymerl.workers import dumps
from rhymerl.workers.reward.verifiers import RewardError, final_answer, load_user_function
from rhymerl.workers.task import arith_chain
from rhymerl.workers.task.prompts import DataError, epoch_order, load_prompts, read_jsonl


def test_builtin_prompts_are_stable_and_solvable() -> None:
    a = load_prompts(DataSpec(num_prompts=20, seed=3))
    b = load_prompts(DataSpec(num_prompts=20, seed=3))
    assert a == b and len({p.prompt_id for p in a}) == 20
    for p in a:
        assert final_answer(arith_chain.solve(p.text), p.answer) == 1.0


def test_worked_answer_by_hand() -> None:
    assert arith_chain.solve("37|a+8 b-9 c+5?") == "a+8 37=45\nb-9 45=36\nc+5 36=41\n=41"
    assert arith_chain.solve("98|a+3 b-5?").endswith("=96")


def test_response_lengths_have_a_long_tail() -> None:
    lengths = sorted(len(arith_chain.solve(p.text)) for p in load_prompts(DataSpec(num_prompts=400)))
    median, p99 = lengths[len(lengths) // 2], lengths[int(len(lengths) * 0.99)]
    assert 100 <= median <= 300 and p99 >= 2 * median and max(lengths) <= 600


def test_every_epoch_visits_every_prompt_once_in_a_seeded_order() -> None:
    orders = [epoch_order(10, seed=1, epoch=e, shuffle=True) for e in (1, 2)]
    assert all(sorted(o) == list(range(10)) for o in orders)
    assert orders[0] != orders[1]
    assert orders[0] == epoch_order(10, seed=1, epoch=1, shuffle=True)


def test_final_answer_reads_the_last_line() -> None:
    assert final_answer("a 01+1=02\n=02", "02") == 1.0
    assert final_answer("a 01+1=02\n=03", "02") == 0.0
    assert final_answer("a 01+1=02\nno answer", "02") == 0.0
    assert final_answer("", "02") == 0.0


def test_jsonl_prompt_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "1+1", "answer": "2"}) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(DataError, match=r"p.jsonl:2: no answer: needs 'answer' or veRL's 'reward_model.ground_truth'"):
        read_jsonl(path)
    path.write_text('{"prompt": "a", "answer": "b", "prompt_id": "x"}\n{"prompt": "c", "answer": "d", "prompt_id": "x"}\n')
    with pytest.raises(DataError, match="duplicate prompt_id 'x'"):
        read_jsonl(path)


def test_user_reward_functions_are_checked_when_loaded() -> None:
    assert load_user_function("os.path:join")("a", "b", "c") == "a/b/c"
    with pytest.raises(RewardError, match="cannot import"):
        load_user_function("no_such_module_xyz:f")
    with pytest.raises(RewardError, match="no callable"):
        load_user_function("os.path:nope")
    with pytest.raises(RewardError, match="must accept"):
        load_user_function("os:getcwd")


def _record(step: int, epoch: int, pid: str, k: int) -> dumps.RolloutRecord:
    return dumps.RolloutRecord(step=step, epoch=epoch, prompt_id=pid, sample_index=k, prompt_len=2,
                               prompt_ids=[1, 5], response_ids=[7, 8, 2], reward=1.0, finish_reason="stop",
                               policy_version=step - 1)


def test_dumps_round_trip_and_group_by_epoch(tmp_path: Path) -> None:
    dumps.write_step(tmp_path, 1, [_record(1, 1, "a", 0), _record(1, 1, "a", 1)])
    dumps.write_step(tmp_path, 2, [_record(2, 2, "a", 0)])
    records = dumps.read_run(tmp_path)
    assert [(r.step, r.sample_index) for r in records] == [(1, 0), (1, 1), (2, 0)]
    assert {e: len(v) for e, v in dumps.by_epoch(records).items()} == {1: 2, 2: 1}
    dumps.remove_after(tmp_path, 1)
    assert [r.step for r in dumps.read_run(tmp_path)] == [1, 1]


def test_a_bad_dump_line_is_named(tmp_path: Path) -> None:
    dumps.write_step(tmp_path, 1, [_record(1, 1, "a", 0)])
    path = dumps.dump_path(tmp_path, 1)
    path.write_text(path.read_text() + '{"step": 1}\n')
    with pytest.raises(dumps.DumpError, match=r"step_000001.jsonl:2: epoch"):
        dumps.read_run(tmp_path)
