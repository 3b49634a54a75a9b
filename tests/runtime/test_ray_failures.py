"""What ends a Ray run says so in one line with the right exit code, and leaves no Ray process: a
user's mistake met by a worker, Redis down, SIGTERM while Ray starts, a lost raylet; and vLLM
rollout workers on Ray, one drafting for the other once freed."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from ray_runs import MARK, RAY, TINY, TWO_WORKERS, go, marked, metrics, reached, run, said, samples, start

pytestmark = pytest.mark.slow


def test_with_its_redis_down_the_run_is_refused_before_it_starts_ray_or_writes_anything(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, "history.store=redis", "history.redis_url=redis://127.0.0.1:1/0"])
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: history.redis_url redis://127.0.0.1:1/0: ConnectionError")
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_users_mistake_met_by_a_worker_is_one_plain_line_and_exit_2(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "nan_reward.py").write_text("def score(prompt, response, answer):\n    return float('nan')\n")
    res = run(tmp_path / "run", [*TINY, *RAY, "reward.function=nan_reward:score"], {"PYTHONPATH": str(code)})
    assert res.returncode == 2, res.stderr
    assert "the reward function returned nan" in res.stderr and "Traceback" not in res.stderr


def test_vllm_rollout_workers_verify_history_and_a_freed_workers_drafts_with_the_transformers_trainers_weights(
        tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    out, holds = tmp_path / "run", tmp_path / "holds"
    holds.mkdir()
    proc = start(out, [*TINY, *RAY, *TWO_WORKERS, "rollout.engine=vllm", "model.implementation=transformers",
                       "rollout.speculation.freed_drafters=true"],
                 {"RHYMERL_FORCE": "freed-drafters", "RHYMERL_HOLD_AT": "rollout-worker:2", "RHYMERL_HOLD_DIR": str(holds)})
    # a worker held mid-call in step 2 keeps its samples while the other's call ends: freed, it drafts for it
    reached(holds, "rollout-worker:2", proc)
    said(out, "(step 2; freed drafters)", proc)
    go(holds, "rollout-worker:2")
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    assert len(samples(out)) == 4 * 4 * 2
    rows = metrics(out)
    # every step's tokens were sampled with the weights the train worker had (float rounding only)
    assert all(m["rollout_logprob_diff_max"] < 1e-3 for m in rows)
    # step 2 is the first epoch's: no history yet, so the held call's drafts came from the freed worker's
    # draft model, over a Ray link into our proposer inside vLLM; from step 3 on, history drafts too
    sources = rows[1]["spec_sources"]
    assert isinstance(sources, dict) and sources["freed-drafter"]["share"] > 0 and rows[1]["rollout_drafting_workers"]
    assert all(m["spec_rate"] > 0 for m in rows[2:])


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
    from rhymerl.workers.runtime.ray_backend import run_failure

    failure = run_failure(_ending(name), "/runs/r")
    assert (type(failure).__name__ if failure is not None else None) == kind
    if failure is not None:
        assert words in str(failure) and "\n" not in str(failure)
        assert failure.exit_code == (1 if kind in ("RunFailed", "MemberLost") else 2)
