"""`rhymerl run` end to end with a user reward function that raises on some samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "rhymerl"
TINY = ["--set", "data.num_prompts=4", "--set", "algorithm.prompts_per_step=2", "--set", "algorithm.group_size=4",
        "--set", "algorithm.epochs=1", "--set", "algorithm.max_response_length=96"]

# fails on responses whose characters sum to an odd number, scores the others 1.0
USER_REWARD = """
def score(prompt, response, answer):
    if sum(map(ord, response)) % 2:
        raise ValueError("odd checksum")
    return 1.0
"""


def _rhymerl(user_code: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-P", "-m", "rhymerl.cli.main"]
    env = {**os.environ, "PYTHONPATH": str(user_code)}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=tempfile.gettempdir(), env=env,
                          timeout=600)


def _run_with_reward(tmp_path: Path, module: str, code: str,
                     *sets: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`rhymerl run` of the tiny quickstart scored by `module:score` (holding `code`), with more
    `--set` items; returns the process and the run folder."""
    user_code = tmp_path / "user_code"
    user_code.mkdir()
    (user_code / f"{module}.py").write_text(code)
    run = tmp_path / "run"
    sets_args = [arg for item in (f"reward.function={module}:score", *sets) for arg in ("--set", item)]
    res = _rhymerl(user_code, "run", str(REPO / "examples" / "quickstart.yaml"), "--out", str(run), *TINY,
                   *sets_args)
    return res, run


def test_a_run_whose_reward_function_raises_on_some_samples_completes_and_records_them(tmp_path: Path) -> None:
    res, run = _run_with_reward(tmp_path, "my_reward", USER_REWARD, "reward.failure_reward=-1",
                                "reward.max_failed_fraction=1")
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for path in sorted((run / "rollouts").glob("step_*.jsonl"))
               for line in path.read_text().splitlines()]
    failed = [r for r in records if r["reward_error"] is not None]
    assert 0 < len(failed) < len(records) == 16
    assert all(r["reward_error"] == "raised ValueError: odd checksum" and r["reward"] == -1.0 for r in failed)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(row["reward_failures"] for row in rows) == len(failed)


def test_a_run_whose_reward_function_always_raises_stops_with_one_line_saying_where_to_look(
        tmp_path: Path) -> None:
    res, run = _run_with_reward(tmp_path, "broken_reward",
                                "def score(prompt, response, answer):\n    raise ValueError('bad')\n")
    assert res.returncode == 2, res.stderr
    assert "spec.reward.function 'broken_reward:score' failed on 8 of 8 samples in step 1" in res.stderr
    assert "first: raised ValueError: bad" in res.stderr
    assert str(run / "rollouts" / "step_000001.jsonl") in res.stderr
    assert (run / "rollouts" / "step_000001.jsonl").is_file()


def test_a_misspelt_reward_module_fails_before_any_rollout(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = _rhymerl(tmp_path, "run", str(REPO / "examples" / "quickstart.yaml"), "--out", str(run), *TINY,
                   "--set", "reward.function=no_such_reward_module:score")
    assert res.returncode == 2, res.stderr
    assert "spec.reward.function 'no_such_reward_module:score': cannot import module" in res.stderr
    assert not (run / "rollouts").exists()


NAN_REWARD = """
def score(prompt, response, answer):
    return float("nan") if sum(map(ord, response)) % 3 == 0 else 1.0
"""


def test_a_nan_reward_stops_the_run_naming_the_prompt_sample_and_value_before_any_update(tmp_path: Path) -> None:
    res, run = _run_with_reward(tmp_path, "nan_reward", NAN_REWARD)
    assert res.returncode == 2, res.stderr
    assert "step 1: prompt " in res.stderr and " sample " in res.stderr and "returned nan" in res.stderr
    assert "Traceback" not in res.stderr
    assert not run.exists(), "a run stopped before its first step leaves no folder"


def test_with_skip_a_nan_reward_is_a_recorded_failure_and_every_file_stays_valid_json(tmp_path: Path) -> None:
    res, run = _run_with_reward(tmp_path, "nan_reward", NAN_REWARD, "algorithm.on_nonfinite=skip",
                                "reward.max_failed_fraction=1")
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for path in sorted((run / "rollouts").glob("step_*.jsonl"))
               for line in path.read_text().splitlines()]
    failed = [r for r in records if r["reward_error"] == "returned nan"]
    assert failed and all(r["reward"] == 0.0 for r in failed)

    def strict(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    rows = [json.loads(line, parse_constant=strict) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(row["loss"], float) for row in rows if "loss" in row)


def test_validate_refuses_a_reward_module_that_fails_to_import_and_notes_one_not_on_this_machine(
        tmp_path: Path) -> None:
    import yaml

    user_code = tmp_path / "user_code"
    user_code.mkdir()
    (user_code / "broken_reward.py").write_text("import not_installed_dependency\n\ndef score(p, r, a):\n    return 1.0\n")
    jobs = []
    for module in ("broken_reward", "cluster_only_reward"):
        doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
        doc["spec"]["reward"] = {"function": f"{module}:score"}
        jobs.append(tmp_path / f"{module}.yaml")
        jobs[-1].write_text(yaml.safe_dump(doc))
    res = _rhymerl(user_code, "validate", *map(str, jobs))
    assert res.returncode == 2, res.stderr
    assert "broken_reward" in res.stderr and "not_installed_dependency" in res.stderr and "Traceback" not in res.stderr
    assert "cluster_only_reward.yaml: valid RLJob" in res.stdout
    assert "module 'cluster_only_reward' is not importable here" in res.stdout
