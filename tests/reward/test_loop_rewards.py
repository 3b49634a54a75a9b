"""The step loop with a user reward function that fails: the run goes on, records why, or stops clearly."""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable
from pathlib import Path

import pytest
from jobs import make_job

from rhymerl.api import RLJob
from rhymerl.workers import dumps
from rhymerl.workers.controller.loop import run_steps
from rhymerl.workers.reward.verifiers import RewardError
from rhymerl.workers.run_folder.run_dir import RunDir

WriteModule = Callable[[str], str]  # the reward_module fixture (conftest.py)
# each step 2 prompts x 4 samples, one epoch, nothing drafted
RUN = ("algorithm.group_size=4", "algorithm.epochs=1", "rollout.speculation.method=none")

# fails on responses of odd length, scores the others 1.0
ODD_LENGTHS_FAIL = """
def score(prompt, response, answer):
    if len(response) % 2:
        raise ValueError(f"odd length {len(response)}")
    return 1.0
"""


def _start(job: RLJob, path: Path) -> RunDir:
    run = RunDir(path)
    run.create(job)
    return run


def test_samples_whose_reward_call_failed_are_recorded_and_the_run_goes_on(
        model_dir: Path, tmp_path: Path, reward_module: WriteModule) -> None:
    ref = reward_module(ODD_LENGTHS_FAIL)
    job = make_job(f"model.path={model_dir}", *RUN, {"reward": {"function": ref, "failure_reward": -1.0,
                                                                  "max_failed_fraction": 1.0}})
    run = _start(job, tmp_path / "run")
    rows = list(run_steps(job, run))
    records = dumps.read_run(run.path)
    assert len(rows) == 2 and len(records) == 16
    failed = [r for r in records if r.reward_error is not None]
    assert 0 < len(failed) < len(records)
    for r in records:
        assert (r.reward_error is None) == (r.reward == 1.0)
        assert r.reward_error is None or r.reward_error.startswith("raised ValueError: odd length")
    assert sum(row.reward_failures for row in rows) == len(failed)
    assert multiprocessing.active_children() == []


def test_too_many_failures_stop_the_run_naming_the_function_and_the_dump(
        model_dir: Path, tmp_path: Path, reward_module: WriteModule) -> None:
    ref = reward_module("def score(prompt, response, answer):\n    raise ValueError('nope')\n")
    job = make_job(f"model.path={model_dir}", *RUN, f"reward.function={ref}")
    run = _start(job, tmp_path / "run")
    dump = dumps.dump_path(run.path, 1)
    with pytest.raises(RewardError) as err:
        list(run_steps(job, run))
    assert str(err.value) == (
        f"spec.reward.function '{ref}' failed on 8 of 8 samples in step 1, more than "
        f"spec.reward.max_failed_fraction (0.5); first: raised ValueError: nope; "
        f"the reward_error of every sample is in {dump}")
    assert [r.reward_error for r in dumps.read_file(dump)] == ["raised ValueError: nope"] * 8
    assert multiprocessing.active_children() == []


def test_a_consumer_that_stops_early_closes_the_reward_workers(
        model_dir: Path, tmp_path: Path, reward_module: WriteModule) -> None:
    ref = reward_module(ODD_LENGTHS_FAIL)
    job = make_job(f"model.path={model_dir}", *RUN, f"reward.function={ref}", "reward.max_failed_fraction=1.0")
    steps = run_steps(job, _start(job, tmp_path / "run"))
    assert len(list(itertools.islice(steps, 1))) == 1
    assert len(multiprocessing.active_children()) == job.spec.reward.workers
    steps.close()
    assert multiprocessing.active_children() == []


EXTRAS_SCORE = """
def score(prompt, response, answer, data_source=None, extra_info=None):
    if not prompt.startswith("<|im_start|>user\\n") or answer != "1":
        raise ValueError(f"prompt {prompt!r}, answer {answer!r}")
    return extra_info["index"] + (0.5 if data_source == "src" else 0.0)
"""
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_a_reward_function_gets_each_rows_data_source_and_extra_info_in_a_run(
        model_dir: Path, tmp_path: Path, reward_module: WriteModule) -> None:
    import json

    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": CHATML}))
    data = tmp_path / "verl.jsonl"
    data.write_text("".join(json.dumps({"data_source": "src", "prompt": [{"role": "user", "content": f"{i}+1?"}],
                                        "reward_model": {"ground_truth": "1"}, "extra_info": {"index": i}}) + "\n"
                            for i in range(4)))
    job = make_job(f"model.path={model_dir}", *RUN, f"reward.function={reward_module(EXTRAS_SCORE)}",
                   f"data.source={data}")
    run = _start(job, tmp_path / "run")
    list(run_steps(job, run))
    records = dumps.read_run(run.path)
    assert len(records) == 16
    assert all(r.reward_error is None for r in records)
    assert sorted((r.prompt_id, r.reward) for r in records) == sorted(
        (str(i), i + 0.5) for i in range(4) for _ in range(4))
