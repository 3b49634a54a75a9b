"""`backend: ray` on a local Ray instance produces the in-process run: its tokens, losses and metrics
rows at off-policy 0, with history in a real Redis, weights through the object store alone, and
two data-parallel train ranks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from local_servers import redis_server
from ray_runs import RAY, TINY, metrics, run, samples

from rhymerl.workers import dumps
from rhymerl.workers.run_folder.step_metrics import deterministic

pytestmark = pytest.mark.slow


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


def test_without_a_broadcast_the_object_store_alone_carries_the_weights(
        in_process: Path, redis_and_object_store: tuple[Path, str]) -> None:
    out, _ = redis_and_object_store
    assert samples(out) == samples(in_process)
    assert all(m["weight_fallbacks"] == 0 for m in metrics(out))


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
