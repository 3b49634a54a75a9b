"""`backend: ray` on a local Ray instance: the in-process run's tokens at off-policy 0, a pipelined
run at off-policy 1, and every fault the runtime recovers from, each asserting that the step
completes and that every sample is there exactly once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch
import yaml
from local_servers import redis_server
from safetensors.torch import load_file

from rhymerl.workers import dumps
from rhymerl.workers.run_folder.step_metrics import deterministic

pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "rhymerl"
QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
# 4 prompts, 2 per step, 2 epochs: steps 1-4, history drafts in steps 3-4
TINY = ["data.num_prompts=4", "algorithm.prompts_per_step=2", "algorithm.group_size=4", "algorithm.epochs=2",
        "algorithm.max_response_length=200", "algorithm.max_off_policy_steps=0"]
RAY = ["backend=ray"]


def start(out: Path, sets: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RHYMERL_CRASH")}
    return subprocess.Popen([str(SCRIPT), "run", str(QUICKSTART), "--out", str(out),
                             *(a for s in sets for a in ("--set", s))], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=clean | (env or {}), cwd=tempfile.gettempdir())


def rhymerl_scale(out: Path, rollout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "scale", str(out), "--rollout", str(rollout)], capture_output=True, text=True,
                          timeout=60)


def run(out: Path, sets: list[str], env: dict[str, str] | None = None,
        resume: bool = False) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RHYMERL_CRASH")}
    args = ["run", "--resume", str(out), *sets] if resume else \
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


def test_the_ray_backend_produces_the_in_process_tokens_losses_and_metrics_rows_at_off_policy_0(
        in_process: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY])
    assert res.returncode == 0, res.stderr
    assert samples(out) == samples(in_process)
    assert len(samples(out)) == 4 * 4 * 2
    ours, theirs = metrics(out), metrics(in_process)
    # one step loop, one fleet: the same keys, and where nothing is measured with a clock the same values
    # (tokens, rewards, losses, the ranking, the counts of the fleet)
    assert [m.keys() for m in ours] == [m.keys() for m in theirs]
    for a, b in zip(ours, theirs, strict=True):  # training statistics to float rounding (reduction order)
        a, b = deterministic(a), deterministic(b)
        assert {k: v for k, v in a.items() if not isinstance(v, float)} == \
            {k: v for k, v in b.items() if not isinstance(v, float)}
        assert {k: v for k, v in a.items() if isinstance(v, float)} == pytest.approx(
            {k: v for k, v in b.items() if isinstance(v, float)}, rel=1e-4, abs=1e-5)
    # the makespan means one thing on both: from a round's start until its last worker finished its share
    assert all(m["rollout_makespan_s"] >= max(m["rollout_busy_s"]) * 0.9 for m in ours + theirs)
    assert [m["policy_lag_max"] for m in ours] == [0, 0, 0, 0]
    # history drafts in epoch 2 (how many a pass may verify depends on measured times: not compared)
    assert all(m["spec_rate"] > 0 for m in ours[2:])  # epoch 1 drafts from siblings only (group drafts)
    assert [r.policy_version for r in dumps.read_run(out)] == [r.policy_version for r in dumps.read_run(in_process)]


PIPELINED = [*TINY, *RAY, "algorithm.max_off_policy_steps=1"]


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run at off-policy 1 (what a resumed one must equal)."""
    out = tmp_path_factory.mktemp("pipelined") / "run"
    res = run(out, PIPELINED)
    assert res.returncode == 0, res.stderr
    return out


def test_at_off_policy_1_rollout_runs_one_version_behind_and_records_it(pipelined: Path) -> None:
    assert len(samples(pipelined)) == 32
    versions = {(r.step, r.policy_version) for r in dumps.read_run(pipelined)}
    # step 2 was started before step 1 trained, step 3 before step 2 trained, ...
    assert versions == {(1, 0), (2, 0), (3, 1), (4, 2)}
    assert [m["policy_lag_max"] for m in metrics(pipelined)] == [0, 1, 1, 1]
    assert [m["policy_version"] for m in metrics(pipelined)] == [1, 2, 3, 4]


def assert_same_run(out: Path, reference: Path) -> None:
    """Tokens, rewards, policy versions and the final weights bit for bit of the uninterrupted run: a
    sample's batch-mates on the shared queue depend on when workers free a slot, but its behaviour
    log-probabilities (the importance weights at off-policy 1) do not (the engine is batch-invariant:
    workers/model/cached_attention.py)."""
    assert samples(out) == samples(reference)
    # a resumed run's workers load the restored in-flight version from the object store at once: a
    # broadcast of a version the train worker never published would hold them STAGED_WAIT_S
    assert [m["weight_fallbacks"] for m in metrics(out)] == [0] * len(metrics(out))
    assert [(r.step, r.policy_version) for r in dumps.read_run(out)] == \
        [(r.step, r.policy_version) for r in dumps.read_run(reference)]
    ours, theirs = (load_file(str(p / "checkpoints" / "step_000004" / "model.safetensors")) for p in (out, reference))
    assert ours.keys() == theirs.keys()
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []


def assert_step_2_kept_step_3s_round(out: Path) -> None:
    """Step 3's first round ran with version 1 when step 2 (version 2) was checkpointed: the
    checkpoint records it and keeps version 1's weights."""
    ckpt = out / "checkpoints" / "step_000002"
    assert json.loads((ckpt / "extra.json").read_text())["ahead_version"] == 1
    assert (ckpt / "in_flight_v1.weights").is_file()


def test_a_worker_that_dies_mid_step_is_restarted_and_its_samples_are_not_lost_or_doubled(
        in_process: Path, tmp_path: Path) -> None:
    """A reward worker dies in step 2 and a rollout worker in step 3, in one run (each step loses one)."""
    once = tmp_path / "once"
    once.mkdir()
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY], {"RHYMERL_CRASH_AT": "reward-worker:2,rollout-worker:3",
                                   "RHYMERL_CRASH_ONCE_DIR": str(once)})
    assert res.returncode == 0, res.stderr
    for crash_at in ("reward-worker-2", "rollout-worker-3"):
        assert (once / crash_at).exists(), f"the worker never reached its crash point {crash_at}"
    assert samples(out) == samples(in_process)  # position-keyed sampling: the same tokens after the re-runs
    rows = metrics(out)
    assert [m["worker_reruns"] for m in rows] == [0, 1, 1, 0]
    events = (out / "events.log").read_text()
    assert "scoring rollout worker 0's 8 samples again" in events  # the reward worker's
    # the rollout worker's re-run went on from the tokens the lost call had reported
    assert rows[2]["rollout_resumed_tokens"] > 0
    assert "go on elsewhere from the tokens they had" in events


TWO_WORKERS = ["rollout.replicas=2", "rollout.max_replicas=2"]


def _reached(holds: Path, point: str, proc: subprocess.Popen[str], timeout_s: float = 600) -> str:
    """Wait for a run to hold at `point` (RHYMERL_HOLD_AT); the pid and pod of the process holding."""
    deadline = time.monotonic() + timeout_s
    marker = holds / f"{point.replace(':', '-')}.reached"
    while not marker.exists():
        assert proc.poll() is None, f"the run ended ({proc.returncode}) before {point}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"{point}: not reached"
        time.sleep(0.1)
    return marker.read_text()


def _count_said(out: Path, count: str, proc: subprocess.Popen[str], timeout_s: float = 600) -> None:
    """Wait until the newest rollout worker count in the run's events.log is `count` ("4 of 4")."""
    deadline = time.monotonic() + timeout_s
    said = re.compile(r"rollout workers: (\d+ of \d+) wanted")
    while (found := said.findall((out / "events.log").read_text())) == [] or found[-1] != count:
        assert proc.poll() is None, f"the run ended ({proc.returncode}) at {found[-1:]}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"rollout workers: {found[-1:]}, never {count}"
        time.sleep(0.2)


def _go(holds: Path, point: str) -> None:
    (holds / f"{point.replace(':', '-')}.go").touch()


def test_a_ray_run_whose_fleet_grows_shrinks_and_loses_workers_and_its_controller_trains_what_a_fixed_fleet_does(
        tmp_path: Path) -> None:
    """2 rollout workers, 4 after step 1, 2 after step 3; one killed (SIGKILL) in step 1, one sent
    SIGTERM (a spot notice) in step 2; the controller killed in step 5 and resumed."""
    reference = tmp_path / "fixed"
    job = [*TINY, "algorithm.epochs=3", "checkpoint.every_steps=1", "rollout.replicas=2", "rollout.max_replicas=4"]
    assert run(reference, job).returncode == 0
    holds, once, out = tmp_path / "holds", tmp_path / "once", tmp_path / "run"
    holds.mkdir()
    once.mkdir()
    env = {"RHYMERL_HOLD_AT": "metrics:1,rollout-worker:2,rollout-worker:3,metrics:3", "RHYMERL_HOLD_DIR": str(holds),
           "RHYMERL_CRASH_AT": "rollout-worker:1,train:5", "RHYMERL_CRASH_ONCE_DIR": str(once)}
    proc = start(out, [*job, *RAY], env)
    _reached(holds, "metrics:1", proc)
    assert rhymerl_scale(out, 4).returncode == 0
    _go(holds, "metrics:1")
    pid = int(_reached(holds, "rollout-worker:2", proc).split()[0])  # a rollout worker in the middle of step 2
    os.kill(pid, signal.SIGTERM)  # the notice: it hands its samples back once it goes on
    time.sleep(1.0)
    _go(holds, "rollout-worker:2")
    # step 3 stays open (a worker held in it) until the SIGTERMed worker's replacement has joined the fleet,
    # however long it takes to start: a worker that joins a running round takes work in it
    _reached(holds, "rollout-worker:3", proc)
    _count_said(out, "4 of 4", proc)
    _go(holds, "rollout-worker:3")
    _reached(holds, "metrics:3", proc)
    assert rhymerl_scale(out, 2).returncode == 0
    _go(holds, "metrics:3")
    assert proc.wait(timeout=900) != 0  # the controller died at step 5
    assert (once / "rollout-worker-1").exists() and (once / "train-5").exists()
    assert run(out, [], resume=True).returncode == 0
    assert samples(out) == samples(reference)  # every sample once, with the fixed fleet's tokens
    rows = metrics(out)
    assert [m["step"] for m in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0]["worker_reruns"] == 1 and int(str(rows[0]["rollout_handed_back"])) > 0  # the SIGKILL
    assert int(str(rows[1]["rollout_handed_back"])) > 0  # the SIGTERM: its samples went on elsewhere
    assert [m["rollout_workers_wanted"] for m in rows] == [2, 4, 4, 2, 2, 2]
    assert rows[2]["rollout_workers"] == 4 and all(m["rollout_workers"] == 2 for m in rows[3:])
    events = (out / "events.log").read_text()
    assert "rollout workers: 4 of 4 wanted" in events and "rollout workers: 2 of 2 wanted" in events


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
    # each group ran on both workers: siblings' tokens crossed between them (over Ray, group drafts)
    assert sum(int(str(m["rollout_group_tokens_heard"])) for m in metrics(out)) > 0


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


@pytest.fixture(scope="module")
def deferred(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bool]]:
    """A run at off-policy 1 with outliers, killed at step 5 and resumed from its checkpoint; and for
    each checkpoint, whether it left deferred groups open."""
    out = tmp_path_factory.mktemp("deferred") / "run"
    job = ["data.num_prompts=4", "algorithm.prompts_per_step=2", "algorithm.epochs=3",
           "algorithm.max_off_policy_steps=1", *OUTLIERS, *RAY]
    res = run(out, job, {"RHYMERL_CRASH_AT": "train:5"})
    assert res.returncode != 0
    opened = [bool(json.loads(p.read_text())["open_groups"]) for p in (out / "checkpoints").glob("step_*/extra.json")]
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    return out, opened


def test_at_off_policy_1_with_outliers_moved_within_and_across_rounds_every_group_trains_once_from_one_version(
        deferred: tuple[Path, list[bool]]) -> None:
    # whether an outlier moves, and where, depends on when its worker's reports arrive: this checks
    # what must hold whatever moved (the moves themselves are forced in tests/controller/test_fleet.py)
    out, _ = deferred
    steps = groups_once(out, epochs=3, prompts=4, group_size=4)
    rows = metrics(out)
    assert sum(int(str(m["prompts"])) for m in rows) == 3 * 4 == len(steps)
    # a group deferred past its step trains one step later: one version more than the pipeline's own lag
    assert max(int(str(m["policy_lag_max"])) for m in rows) <= 2
    assert all(int(str(m["rollout_deferred"])) == 0 for m in rows[-1:])  # nothing is deferred past the last step


def test_without_its_history_worker_rollout_goes_on_without_drafts_and_says_so(
        in_process: Path, tmp_path: Path) -> None:
    once = tmp_path / "once"
    once.mkdir()
    out = tmp_path / "run"
    # a third epoch: the restarted worker (it refills from the train worker's dumps, which may be busy
    # training) need not be back within the 10 s step 4 waits for it, but is by step 5
    res = run(out, [*TINY, *RAY, "algorithm.epochs=3", "rollout.speculation.group_drafts=false"],
              {"RHYMERL_CRASH_AT": "history-worker:3", "RHYMERL_CRASH_ONCE_DIR": str(once)})
    assert res.returncode == 0, res.stderr
    assert [s for s in samples(out) if s[0] <= 4] == samples(in_process)  # drafts never change tokens
    rows = metrics(out)
    ok = [m["history_ok"] for m in rows]
    assert ok[:3] == [True, True, False] and ok[4:] == [True, True]
    assert rows[2]["spec_rate"] == 0.0 and all(m["spec_rate"] > 0 for m in rows[4:])  # refilled from the dumps
    assert "cannot serve indexes" in (out / "events.log").read_text()


def test_with_its_redis_down_the_run_is_refused_before_it_starts_ray_or_writes_anything(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, "history.store=redis", "history.redis_url=redis://127.0.0.1:1/0"])
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: history.redis_url redis://127.0.0.1:1/0: ConnectionError")
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.fixture(scope="module")
def redis_and_object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A run whose history lives in a real Redis and whose weights travel by the object store alone
    (no broadcast): two settings apart from each other, asserted on one run; and its Redis's URL."""
    out = tmp_path_factory.mktemp("redis") / "run"
    with redis_server() as url:
        res = run(out, [*TINY, *RAY, "history.store=redis", f"history.redis_url={url}",
                        "rollout.weight_sync=object-store"])
        assert res.returncode == 0, res.stderr
        yield out, url


def test_history_in_a_real_redis_drafts_as_the_memory_store_does(
        in_process: Path, redis_and_object_store: tuple[Path, str]) -> None:
    out, redis_url = redis_and_object_store
    assert samples(out) == samples(in_process)
    rows = metrics(out)
    assert all(m["history_ok"] for m in rows)
    assert all(m["spec_rate"] > 0 for m in rows[2:])  # epoch 2 drafted from the indexes Redis kept
    assert redis.Redis.from_url(redis_url).keys("*") == []  # a finished run deletes its own keys


def test_a_controller_killed_mid_run_at_off_policy_1_resumes_to_the_uninterrupted_tokens_rewards_and_weights(
        pipelined: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    mark = f"killed-{tmp_path.name}"
    res = run(out, PIPELINED, {"RHYMERL_CRASH_AT": "train:3", MARK: mark})
    assert res.returncode == -signal.SIGKILL
    assert left_behind(mark) == [], "a Ray process outlived the SIGKILLed run that started it"
    assert [m["step"] for m in metrics(out)] == [1, 2]
    assert_step_2_kept_step_3s_round(out)
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    assert_same_run(out, pipelined)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]


def test_on_sigterm_at_off_policy_1_the_controller_checkpoints_its_step_and_the_resumed_run_is_the_uninterrupted_one(
        pipelined: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*PIPELINED, "checkpoint.every_steps=4"],
              {"RHYMERL_CRASH_AT": "train:2", "RHYMERL_CRASH_SIGNAL": "SIGTERM"})
    assert res.returncode == 128 + 15, res.stderr
    assert [m["step"] for m in metrics(out)] == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000002"]
    assert_step_2_kept_step_3s_round(out)
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    assert_same_run(out, pipelined)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]


@pytest.mark.parametrize(("crash_at", "signal_name", "kept"), [("rollout:3", "SIGKILL", [1, 2]),
                                                             ("metrics:3", "SIGTERM", [1, 2, 3])])
def test_stopped_at_another_phase_the_resumed_off_policy_1_run_ends_with_the_uninterrupted_weights(
        pipelined: Path, tmp_path: Path, crash_at: str, signal_name: str, kept: list[int]) -> None:
    """With the SIGKILL at train:3 and the SIGTERM at train:2 above: three phases, both signals,
    each resumed run bit for bit the uninterrupted one (before batch invariance 2 runs in 5
    differed in their last bits)."""
    out = tmp_path / "run"
    res = run(out, [*PIPELINED, "checkpoint.every_steps=2"],
              {"RHYMERL_CRASH_AT": crash_at, "RHYMERL_CRASH_SIGNAL": signal_name})
    assert res.returncode in (-signal.SIGKILL, 128 + signal.SIGTERM), res.stderr
    assert [m["step"] for m in metrics(out)] == kept
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    assert_same_run(out, pipelined)


def test_a_train_worker_lost_mid_step_stops_the_run_as_a_members_loss_and_the_resumed_run_is_the_uninterrupted_one(
        pipelined: Path, tmp_path: Path) -> None:
    """A train pod evicted on a cluster: its worker's process dies (here as it writes step 3's dump, so
    that step's dump is on disk and its checkpoint is not). The run stops saying a member was lost (the
    controller pod exits MEMBER_LOST_EXIT_CODE there; here, one process, exit 1), and resumed it trains
    every sample once, bit for bit the uninterrupted run."""
    out = tmp_path / "run"
    res = run(out, PIPELINED, {"RHYMERL_CRASH_AT": "dump:3"})
    assert res.returncode == 1, res.stderr
    assert "TrainWorker" in res.stderr or "train worker" in res.stderr, res.stderr
    assert "rhymerl run --resume" in res.stderr
    assert [m["step"] for m in metrics(out)] == [1, 2]
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    assert_same_run(out, pipelined)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]


def test_a_rollout_worker_killed_at_off_policy_1_costs_a_rerun_and_not_one_bit_of_the_weights(
        pipelined: Path, tmp_path: Path) -> None:
    once = tmp_path / "once"
    once.mkdir()
    out = tmp_path / "run"
    res = run(out, PIPELINED, {"RHYMERL_CRASH_AT": "rollout-worker:3", "RHYMERL_CRASH_ONCE_DIR": str(once)})
    assert res.returncode == 0, res.stderr
    assert (once / "rollout-worker-3").exists(), "the worker never reached its crash point"
    assert sum(int(str(m["worker_reruns"])) for m in metrics(out)) == 1
    assert_same_run(out, pipelined)


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
    assert all(m["spec_rate"] > 0 for m in rows[2:])


def test_a_run_resumed_from_a_checkpoint_that_left_deferred_groups_open_trains_each_of_them_once(
        deferred: tuple[Path, list[bool]]) -> None:
    out, opened = deferred
    groups_once(out, epochs=3, prompts=4, group_size=4)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4, 5, 6]
    if not any(opened):
        pytest.skip("no outlier was deferred past the checkpoint this time (timing): nothing resumed open")


def test_two_train_ranks_train_what_one_does_and_their_checkpoint_resumes_on_one_rank(
        in_process: Path, tmp_path: Path) -> None:
    """Data-parallel training on two gloo ranks: the one-rank gradient, so the same losses to float
    rounding and, sampling from weights equal to rounding, the same tokens; killed at step 3, the
    run resumes from the two ranks' checkpoint on one rank (its saved spec edited: checkpoints
    hold whole weights and optimiser state, whatever the rank count) and ends where the one-rank
    run does."""
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, "train.replicas=2"], {"RHYMERL_CRASH_AT": "train:3"})
    assert res.returncode != 0
    ours, theirs = metrics(out), metrics(in_process)
    assert [m["step"] for m in ours] == [1, 2]
    assert [s for s in samples(out) if s[0] == 1] == [s for s in samples(in_process) if s[0] == 1]
    for a, b in zip(ours, theirs, strict=False):
        assert float(str(a["loss"])) == pytest.approx(float(str(b["loss"])), abs=1e-5)
    saved = yaml.safe_load((out / "spec.yaml").read_text())
    assert saved["spec"]["train"]["replicas"] == 2
    saved["spec"]["train"]["replicas"] = 1
    (out / "spec.yaml").write_text(yaml.safe_dump(saved))
    res = run(out, [], resume=True)
    assert res.returncode == 2 and "+    replicas: 1" in res.stderr and "--accept-spec-change" in res.stderr
    res = run(out, ["--accept-spec-change"], resume=True)
    assert res.returncode == 0, res.stderr
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]
    assert len(samples(out)) == 4 * 4 * 2  # every sample once
    for a, b in zip(metrics(out), theirs, strict=True):
        assert float(str(a["loss"])) == pytest.approx(float(str(b["loss"])), abs=1e-4)
        assert a["reward_mean"] == b["reward_mean"]


def test_a_rollout_worker_killed_as_a_weight_broadcast_starts_costs_a_fallback_not_a_sample(
        in_process: Path, tmp_path: Path) -> None:
    """Weights go by broadcast (rollout.weight_sync: collective, the default): tokens equal the
    in-process run's only if every version arrives bit for bit. One of two rollout workers dies as
    version 1's broadcast starts, the fleet's group still forming: the other, held until the
    group's timeout, loads the object store's copy (`weight_fallbacks`, a note), the dead one's
    samples resume elsewhere, nothing is lost."""
    out = tmp_path / "run"
    once = tmp_path / "once"
    once.mkdir()
    res = run(out, [*TINY, *RAY, "rollout.replicas=2", "rollout.max_replicas=2"],
              {"RHYMERL_CRASH_AT": "weight-receive:1", "RHYMERL_CRASH_ONCE_DIR": str(once),
               "RHYMERL_WEIGHT_SYNC_TIMEOUT_S": "10"})
    assert res.returncode == 0, res.stderr
    assert (once / "weight-receive-1").exists()  # the worker did die there
    assert samples(out) == samples(in_process)
    rows = metrics(out)
    assert sum(int(str(m["weight_fallbacks"])) for m in rows) >= 1
    assert "took the object store's" in (out / "events.log").read_text()


def test_without_a_broadcast_the_object_store_alone_carries_the_weights(
        in_process: Path, redis_and_object_store: tuple[Path, str]) -> None:
    out, _ = redis_and_object_store
    assert samples(out) == samples(in_process)
    assert all(m["weight_fallbacks"] == 0 for m in metrics(out))


MARK = "RHYMERL_TEST_MARK"  # inherited by every process a run starts, Ray's included


def marked(mark: str) -> dict[int, str]:
    """Live processes (zombies read an empty environment) carrying `mark`: pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"{MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def left_behind(mark: str, timeout_s: float = 120.0) -> list[str]:
    """The marked processes left once the run's watchdog (workers/runtime/reaper.py, which sweeps
    its Ray processes when its driver dies) has exited; the run itself has exited already."""
    deadline = time.monotonic() + timeout_s
    while any("reaper.py" in cmd for cmd in marked(mark).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(marked(mark).values())


def test_sigterm_while_ray_starts_stops_it_whole_with_no_folder_and_no_ray_process_left(tmp_path: Path) -> None:
    out = tmp_path / "run"
    mark = f"start-{tmp_path.name}"
    # the signal lands once Ray's processes run and this driver is connected, where Ray's handlers would rule
    res = run(out, [*TINY, *RAY], {"RHYMERL_CRASH_AT": "ray-start:0", "RHYMERL_CRASH_SIGNAL": "SIGTERM", MARK: mark})
    assert res.returncode == 128 + signal.SIGTERM, res.stderr
    assert not any(s in res.stderr for s in ("Traceback", "SIGTERM received", "SIGABRT")), res.stderr
    assert not out.exists()
    assert sorted(marked(mark).values()) == [], "stopped before the command returned"


def test_a_lost_raylet_is_one_line_with_the_command_that_resumes_exit_1_and_no_ray_process_left(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    mark = f"raylet-{tmp_path.name}"
    # the train worker kills its raylet as it writes step 2's dump: the node, and every worker, is gone
    res = run(out, [*TINY, *RAY], {"RHYMERL_CRASH_AT": "dump:2", "RHYMERL_CRASH_WHO": "raylet", MARK: mark})
    assert res.returncode == 1, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "Ray node: its raylet died" in errors[0] and "run stopped after step 1" in errors[0]
    assert errors[0].endswith(f"Resume with: rhymerl run --resume {out}")
    assert [m["step"] for m in metrics(out)] == [1]
    assert sorted(marked(mark).values()) == []


def _ending(name: str) -> BaseException:
    """What may end a run on Ray, by name: Ray's errors for lost workers and nodes, the fleet's
    for re-runs used up, a worker's own errors as Ray hands them over, a bug of ours."""
    import ray.exceptions

    from rhymerl.errors import UserError
    from rhymerl.workers.controller.fleet import WorkerLost

    def in_worker(cause: BaseException) -> BaseException:
        return ray.exceptions.RayTaskError("TrainWorker.step", "Traceback ...", cause).as_instanceof_cause()

    return {
        "actor died": ray.exceptions.ActorDiedError(),
        "actor unavailable": ray.exceptions.ActorUnavailableError("RpcError: Socket closed", None),
        "system error": ray.exceptions.RaySystemError("System error: the GCS is gone"),
        "re-runs used up": WorkerLost("step 3: sample 1 of prompt p7 lost its rollout worker 3 times"),
        "full disk in a worker": in_worker(OSError(28, "No space left on device")),
        "user error in a worker": in_worker(UserError("the reward function returned nan")),
        "bug": ValueError("a bug"),
    }[name]


@pytest.mark.parametrize(("name", "kind", "words"), [
    ("actor died", "MemberLost", "lost a Ray worker"),
    ("actor unavailable", "MemberLost", "lost a Ray worker"),
    ("system error", "RunFailed", "lost a Ray worker"),
    ("re-runs used up", "MemberLost", "the rollout fleet gave up"),
    ("full disk in a worker", "DiskFull", "no space left on the disk of /runs/r"),
    ("user error in a worker", "UserError", "the reward function returned nan"),
    ("bug", None, ""),
])
def test_what_ends_a_ray_run_becomes_one_line_of_its_class(name: str, kind: str | None, words: str) -> None:
    from rhymerl.workers.runtime.ray_transport import run_failure

    failure = run_failure(_ending(name), "/runs/r")
    assert (type(failure).__name__ if failure is not None else None) == kind
    if failure is not None:
        assert words in str(failure) and "\n" not in str(failure)
        assert failure.exit_code == (1 if kind in ("RunFailed", "MemberLost") else 2)
