"""`backend: ray` on a local Ray instance: the in-process run's tokens at off-policy 0, a pipelined
run at off-policy 1, and every fault the runtime recovers from, each asserting that the step
completes and that every sample is there exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rhymerl.workers import dumps

pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "rhymerl"
QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
# 4 prompts, 2 per step, 2 epochs: steps 1-4, history drafts in steps 3-4
TINY = ["data.num_prompts=4", "algorithm.prompts_per_step=2", "algorithm.group_size=4", "algorithm.epochs=2",
        "algorithm.max_response_length=200", "algorithm.max_off_policy_steps=0"]
RAY = ["backend=ray"]


def run(out: Path, sets: list[str], env: dict[str, str] | None = None,
        resume: bool = False) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RHYMERL_CRASH")}
    args = ["run", "--resume", str(out)] if resume else \
        ["run", str(QUICKSTART), "--out", str(out), *(a for s in sets for a in ("--set", s))]
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=clean | (env or {}),
                          cwd=tempfile.gettempdir(), timeout=900)


def samples(out: Path) -> list[tuple[int, str, int, tuple[int, ...], float]]:
    recs = dumps.read_run(out)
    keys = [(r.step, r.prompt_id, r.sample_index) for r in recs]
    assert len(keys) == len(set(keys)), "a sample counted twice"
    return [(r.step, r.prompt_id, r.sample_index, tuple(r.response_ids), r.reward) for r in recs]


def metrics(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("local") / "run"
    res = run(out, TINY)
    assert res.returncode == 0, res.stderr
    return out


def test_the_ray_backend_produces_the_in_process_tokens_and_losses_at_off_policy_0(
        in_process: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY])
    assert res.returncode == 0, res.stderr
    assert samples(out) == samples(in_process)
    assert len(samples(out)) == 4 * 4 * 2
    ours, theirs = metrics(out), metrics(in_process)
    assert [m["loss"] for m in ours] == [m["loss"] for m in theirs]
    assert [m["policy_lag_max"] for m in ours] == [0, 0, 0, 0]
    # history drafts in epoch 2 (how many a pass may verify depends on measured times: not compared)
    assert all(m["spec_rate"] > 0 for m in ours[2:]) and all(m["spec_rate"] == 0 for m in ours[:2])
    assert [r.policy_version for r in dumps.read_run(out)] == [r.policy_version for r in dumps.read_run(in_process)]


def test_at_off_policy_1_rollout_runs_one_version_behind_and_records_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, "algorithm.max_off_policy_steps=1"])
    assert res.returncode == 0, res.stderr
    assert len(samples(out)) == 32
    versions = {(r.step, r.policy_version) for r in dumps.read_run(out)}
    # step 2 was started before step 1 trained, step 3 before step 2 trained, ...
    assert versions == {(1, 0), (2, 0), (3, 1), (4, 2)}
    assert [m["policy_lag_max"] for m in metrics(out)] == [0, 1, 1, 1]
    assert [m["policy_version"] for m in metrics(out)] == [1, 2, 3, 4]


@pytest.mark.parametrize(("crash_at", "step"), [("rollout-worker:3", 3), ("reward-worker:2", 2)])
def test_a_worker_that_dies_mid_step_is_restarted_and_its_samples_are_not_lost_or_doubled(
        in_process: Path, tmp_path: Path, crash_at: str, step: int) -> None:
    once = tmp_path / "once"
    once.mkdir()
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY], {"RHYMERL_CRASH_AT": crash_at, "RHYMERL_CRASH_ONCE_DIR": str(once)})
    assert res.returncode == 0, res.stderr
    assert (once / crash_at.replace(":", "-")).exists(), "the worker never reached its crash point"
    assert samples(out) == samples(in_process)  # position-keyed sampling: the same tokens after the re-run
    rows = metrics(out)
    assert [m["worker_reruns"] for m in rows] == [1 if m["step"] == step else 0 for m in rows]
    events = (out / "events.log").read_text()
    if crash_at.startswith("rollout"):
        # the re-run went on from the tokens the lost call had reported
        assert rows[step - 1]["rollout_resumed_tokens"] > 0
        assert "go on from the tokens they had" in events
    else:
        assert "scoring rollout worker 0's 8 samples again" in events


TWO_WORKERS = ["rollout.replicas=2", "rollout.max_replicas=2"]


def test_idle_rollout_workers_take_over_unfinished_samples_with_their_tokens_and_change_none(
        in_process: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, *TWO_WORKERS])
    assert res.returncode == 0, res.stderr
    assert samples(out) == samples(in_process)  # position-keyed sampling: a moved sample goes on as it would have
    rows = metrics(out)
    assert sum(int(str(m["rollout_stolen"])) for m in rows) > 0
    # what moved went on from its tokens (an idle worker took over samples already started)
    assert sum(int(str(m["rollout_resumed_tokens"])) for m in rows) > 0


def test_a_rollout_worker_that_dies_while_others_take_over_its_samples_loses_none(
        in_process: Path, tmp_path: Path) -> None:
    once = tmp_path / "once"
    once.mkdir()
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, *TWO_WORKERS],
              {"RHYMERL_CRASH_AT": "rollout-worker:1", "RHYMERL_CRASH_ONCE_DIR": str(once)})
    assert res.returncode == 0, res.stderr
    assert (once / "rollout-worker-1").exists(), "no worker reached its crash point"
    assert samples(out) == samples(in_process)
    assert [m["worker_reruns"] for m in metrics(out)] == [1, 0, 0, 0]


# responses long enough to vary in length; every running sample of a ranking group is watched once
# one of them finished, and an outlier is any that passes the longest response its group's prompts
# gave last epoch (lambda 1); no work stealing (a stolen sample is not migrated again)
OUTLIERS = ["algorithm.max_response_length=600", "algorithm.group_size=4", "scheduling.migration.tail_fraction=1.0",
            "scheduling.migration.min_lambda=1.0", "scheduling.migration.growth_percentile=0",
            "scheduling.work_stealing=false", *TWO_WORKERS]


def groups_once(out: Path, epochs: int, prompts: int, group_size: int) -> dict[tuple[int, str], set[int]]:
    """Each group's dumped responses, checked to be every (epoch, prompt, index) exactly once, and the
    steps each group was trained in."""
    recs = dumps.read_run(out)
    keys = sorted((r.epoch, r.prompt_id, r.sample_index) for r in recs)
    assert len(keys) == len(set(keys)), "a sample counted twice"
    assert len(keys) == epochs * prompts * group_size, "a sample lost"
    steps: dict[tuple[int, str], set[int]] = {}
    versions: dict[tuple[int, str], set[int]] = {}
    for r in recs:
        steps.setdefault((r.epoch, r.prompt_id), set()).add(r.step)
        versions.setdefault((r.epoch, r.prompt_id), set()).add(r.policy_version)
    assert all(len(v) == 1 for v in versions.values()), "a group from several policy versions"
    assert all(len(s) == 1 for s in steps.values()), "a group trained in pieces"
    return steps


def test_outliers_move_to_another_ray_workers_running_call_with_their_tokens_and_change_none(tmp_path: Path) -> None:
    job = ["data.num_prompts=8", "algorithm.prompts_per_step=4", "algorithm.epochs=2",
           "algorithm.max_off_policy_steps=0", *OUTLIERS]
    res = run(tmp_path / "local", job)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "run"
    res = run(out, [*job, *RAY])
    assert res.returncode == 0, res.stderr
    # position-keyed sampling: a moved sample goes on as it would have
    assert samples(out) == samples(tmp_path / "local")
    rows = metrics(out)
    assert sum(int(str(m["rollout_migrated"])) for m in rows) > 0
    assert all(m["rollout_deferred"] == 0 for m in rows)  # off-policy 0: no later round to defer to
    assert sum(int(str(m["rollout_resumed_tokens"])) for m in rows) > 0


def test_at_off_policy_1_outliers_deferred_to_the_next_round_train_there_once_with_the_weights_they_began_with(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, ["data.num_prompts=4", "algorithm.prompts_per_step=2", "algorithm.epochs=3",
                    "algorithm.max_off_policy_steps=1", *OUTLIERS, *RAY])
    assert res.returncode == 0, res.stderr
    steps = groups_once(out, epochs=3, prompts=4, group_size=4)
    rows = metrics(out)
    deferred = sum(int(str(m["rollout_deferred"])) for m in rows)
    assert deferred > 0
    # a deferred outlier's group trains in the step after its own: some step trains more than its 2 prompts
    assert any(int(str(m["prompts"])) > 2 for m in rows)
    assert sum(int(str(m["prompts"])) for m in rows) == 3 * 4 == len(steps)
    assert max(int(str(m["policy_lag_max"])) for m in rows) == 2  # one version more than the pipeline's own lag


def test_without_its_history_worker_rollout_goes_on_without_drafts_and_says_so(
        in_process: Path, tmp_path: Path) -> None:
    once = tmp_path / "once"
    once.mkdir()
    out = tmp_path / "run"
    # a third epoch: the restarted worker (it refills from the train worker's dumps, which may be busy
    # training) need not be back within the 10 s step 4 waits for it, but is by step 5
    res = run(out, [*TINY, *RAY, "algorithm.epochs=3"],
              {"RHYMERL_CRASH_AT": "history-worker:3", "RHYMERL_CRASH_ONCE_DIR": str(once)})
    assert res.returncode == 0, res.stderr
    assert [s for s in samples(out) if s[0] <= 4] == samples(in_process)  # drafts never change tokens
    rows = metrics(out)
    ok = [m["history_ok"] for m in rows]
    assert ok[:3] == [True, True, False] and ok[4:] == [True, True]
    assert rows[2]["spec_rate"] == 0.0 and all(m["spec_rate"] > 0 for m in rows[4:])  # refilled from the dumps
    assert "cannot serve indexes" in (out / "events.log").read_text()


def test_with_its_redis_down_the_run_completes_without_history_drafts(in_process: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, "history.store=redis", "history.redis_url=redis://127.0.0.1:1/0"])
    assert res.returncode == 0, res.stderr
    assert samples(out) == samples(in_process)
    assert all(m["history_ok"] is False and m["spec_rate"] == 0.0 for m in metrics(out))
    assert "redis://127.0.0.1:1/0" in (out / "events.log").read_text()


def test_history_in_a_real_redis_drafts_as_the_memory_store_does(
        in_process: Path, tmp_path: Path, redis_url: str) -> None:
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, "history.store=redis", f"history.redis_url={redis_url}"])
    assert res.returncode == 0, res.stderr
    assert samples(out) == samples(in_process)
    rows = metrics(out)
    assert all(m["history_ok"] for m in rows)
    assert all(m["spec_rate"] > 0 for m in rows[2:])  # epoch 2 drafted from the indexes Redis kept


def test_a_controller_killed_mid_run_resumes_from_its_checkpoint_to_the_same_samples(
        in_process: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY], {"RHYMERL_CRASH_AT": "train:3"})
    assert res.returncode != 0
    assert [m["step"] for m in metrics(out)] == [1, 2]
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    assert samples(out) == samples(in_process)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]


def test_on_sigterm_the_controller_finishes_its_step_checkpoints_it_and_the_resumed_run_has_the_same_samples(
        in_process: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, "checkpoint.every_steps=4"],
              {"RHYMERL_CRASH_AT": "train:2", "RHYMERL_CRASH_SIGNAL": "SIGTERM"})
    assert res.returncode == 128 + 15, res.stderr
    assert [m["step"] for m in metrics(out)] == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000002"]
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    assert samples(out) == samples(in_process)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]


def test_a_users_mistake_met_by_a_worker_is_one_plain_line_and_exit_2(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "nan_reward.py").write_text("def score(prompt, response, answer):\n    return float('nan')\n")
    res = run(tmp_path / "run", [*TINY, *RAY, "reward.function=nan_reward:score"], {"PYTHONPATH": str(code)})
    assert res.returncode == 2, res.stderr
    assert "the reward function returned nan" in res.stderr and "Traceback" not in res.stderr


def test_rollout_workers_run_vllm_with_history_drafts_and_the_transformers_trainers_weights(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, "rollout.engine=vllm", "model.implementation=transformers"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(samples(out)) == 4 * 4 * 2
    rows = metrics(out)
    # every step's tokens were sampled with the weights the train worker had (float rounding only)
    assert all(m["rollout_logprob_diff_max"] < 1e-3 for m in rows)
    assert all(m["spec_rate"] > 0 for m in rows[2:]) and all(m["spec_rate"] == 0 for m in rows[:2])


def test_a_run_resumed_from_a_checkpoint_that_left_deferred_groups_open_trains_each_of_them_once(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    job = ["data.num_prompts=4", "algorithm.prompts_per_step=2", "algorithm.epochs=3",
           "algorithm.max_off_policy_steps=1", *OUTLIERS, *RAY]
    res = run(out, job, {"RHYMERL_CRASH_AT": "train:5"})
    assert res.returncode != 0
    opened = [json.loads(p.read_text())["open_groups"] for p in (out / "checkpoints").glob("step_*/extra.json")]
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    groups_once(out, epochs=3, prompts=4, group_size=4)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4, 5, 6]
    if not any(opened):
        pytest.skip("no outlier was deferred past the checkpoint this time (timing): nothing resumed open")
