"""Runs on a real Redis: each run keeps to its own keys (two runs of one job never meet), a Redis that
is down or refuses the run stops `rhymerl run` before it writes anything, and one that dies mid-run
costs the local backend its drafts, never a token or the run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis
from jobs import make_job
from local_servers import free_port, redis_server

from rhymerl.api import RLJob
from rhymerl.api.history_keys import REDIS_PASSWORD_ENV, run_key_prefix
from rhymerl.cli.local_run import run_local
from rhymerl.operator.reconcile.history import delete_history
from rhymerl.workers import dumps
from rhymerl.workers.controller.loop import run_steps
from rhymerl.workers.dumps import RolloutRecord
from rhymerl.workers.history.redis_store import HistoryStoreError, ping
from rhymerl.workers.history.run_history import RUN_ID_FILE, RunHistory, history_run_id
from rhymerl.workers.run_folder.run_dir import RunDir

SECRET = "s3cret-pw"


# the job of every test here, on the Redis each gives it (its keys: rhymerl:team:twin:<run>:...)
TWIN = {"metadata": {"name": "twin", "namespace": "team"}, "history": {"store": "redis"}}


def records(epoch: int) -> list[RolloutRecord]:
    return [RolloutRecord(step=epoch, epoch=epoch, prompt_id=p, sample_index=k, prompt_len=1, prompt_ids=[1],
                          response_ids=[5, 6, 7, k], reward=1.0, finish_reason="stop", policy_version=0)
            for p in ("p0", "p1") for k in range(2)]


def keys(url: str) -> list[str]:
    client = redis.Redis.from_url(url)
    try:
        return sorted(k.decode() for k in client.keys("*"))
    finally:
        client.close()


@pytest.mark.parametrize("url", [f"redis://u:{SECRET}@127.0.0.1:PORT/0", f"redis://127.0.0.1:PORT/0?password={SECRET}",
                                 f"redis://127.0.0.1:PORT/{SECRET}", f"redis://{SECRET}@127.0.0.1:PORT/0#{SECRET}"])
def test_a_redis_that_cannot_be_reached_is_named_without_a_credential_the_url_carries(url: str) -> None:
    with pytest.raises(HistoryStoreError) as info:
        ping(url.replace("PORT", str(free_port())), timeout_s=0.5)
    assert str(info.value).startswith("history.redis_url ") and SECRET not in str(info.value)


def test_two_runs_of_one_job_on_one_redis_keep_to_their_own_keys(redis_url: str) -> None:
    job = make_job(TWIN, f"history.redis_url={redis_url}")
    a = RunHistory.for_job(job, "runa")
    a.record(records(1))
    b = RunHistory.for_job(job, "runb")  # its start clears its own keys, not the first run's
    b.record(records(1))  # the same prompts and epoch: one shared prefix made this "epoch 1 indexed twice"
    assert sorted(a.drafting.indexes_before(2, ["p0", "p1"])) == ["p0", "p1"]
    mine, theirs = run_key_prefix("team", "twin", "runa"), run_key_prefix("team", "twin", "runb")
    assert {k.removeprefix(mine).removeprefix(theirs) for k in keys(redis_url)} == {
        "index:p0", "index:p1", "responses:p0:1", "responses:p1:1"}
    assert len(keys(redis_url)) == 8
    b.close()  # a run that ends deletes its keys, and only them
    assert keys(redis_url) and all(k.startswith(mine) for k in keys(redis_url))
    resumed = RunHistory.for_job(job, "runa")  # a resume of run a starts empty and refills from its dumps
    assert keys(redis_url) == []
    resumed.record(records(1))
    other = make_job(TWIN, f"history.redis_url={redis_url}", "metadata.name=twin-2")
    RunHistory.for_job(other, "runa").record(records(1))  # another job, same run id
    assert asyncio.run(delete_history(redis_url, "team", "twin")) == 4  # the finalizer: every run of the job
    assert keys(redis_url) and all(k.startswith("rhymerl:team:twin-2:runa:") for k in keys(redis_url))


def test_a_run_keeps_its_id_in_its_folder_across_resumes_and_another_run_gets_another(tmp_path: Path) -> None:
    job = make_job(TWIN, "history.redis_url=redis://r:6379/0")
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    run_id = history_run_id(job, first)
    assert run_id is not None and history_run_id(job, first) == run_id
    assert history_run_id(job, second) not in (None, run_id)
    (first / RUN_ID_FILE).write_text("torn:*\n")  # not an id: a new one, never a key pattern
    assert history_run_id(job, first) not in (None, "torn:*")
    memory = job.model_copy(deep=True)
    memory.spec.history.store = "memory"
    third = tmp_path / "third"
    third.mkdir()
    assert history_run_id(memory, third) is None and list(third.iterdir()) == []


def test_a_redis_that_is_down_stops_rhymerl_run_before_it_writes_anything(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    out = tmp_path / "run"
    with pytest.raises(HistoryStoreError) as info:
        run_local(make_job(TWIN, f"history.redis_url={url}"), out)
    assert str(info.value).startswith(f"history.redis_url {url}: ConnectionError")
    assert "\n" not in str(info.value) and not out.exists()


def test_a_redis_that_wants_a_password_is_told_where_to_put_it_and_takes_it_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with redis_server(SECRET) as url:
        monkeypatch.delenv(REDIS_PASSWORD_ENV, raising=False)
        with pytest.raises(HistoryStoreError, match=f"asks for a password: set {REDIS_PASSWORD_ENV}"):
            run_local(make_job(TWIN, f"history.redis_url={url}"), tmp_path / "a")
        monkeypatch.setenv(REDIS_PASSWORD_ENV, "wrong")
        with pytest.raises(HistoryStoreError, match=f"refused the password in {REDIS_PASSWORD_ENV}"):
            run_local(make_job(TWIN, f"history.redis_url={url}"), tmp_path / "b")
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
        monkeypatch.setenv(REDIS_PASSWORD_ENV, SECRET)
        history = RunHistory.for_job(make_job(TWIN, f"history.redis_url={url}"), "runa")
        history.record(records(1))
        assert sorted(history.drafting.indexes_before(2, ["p0", "p1"])) == ["p0", "p1"]
        history.close()


def _steps(job: RLJob, path: Path, after: int | None = None, then: object = None) -> list[dict[str, object]]:
    run = RunDir(path)
    run.create(job)
    rows = []
    try:
        for m in run_steps(job, run):
            rows.append(m.row())
            if m.step == after and callable(then):
                then()
    finally:
        run.close()
    return rows


def test_a_run_deletes_only_its_keys_and_one_whose_redis_dies_mid_run_makes_the_same_tokens_and_says_so_once(
        model_dir: Path, tmp_path: Path) -> None:
    with redis_server() as url:
        other = run_key_prefix("team", "twin", "other") + "index:p0"
        redis.Redis.from_url(url).set(other, b"x")
        kept = _steps(make_job(TWIN, f"history.redis_url={url}", f"model.path={model_dir}"), tmp_path / "kept")
        assert [r["history_ok"] for r in kept] == [True] * 4
        assert keys(url) == [other]  # the finished run deleted its own keys, and no other run's
        lost = _steps(make_job(TWIN, f"history.redis_url={url}", f"model.path={model_dir}"), tmp_path / "lost",
                      after=2, then=lambda: redis.Redis.from_url(url).shutdown(nosave=True))
    want, got = dumps.read_run(tmp_path / "kept"), dumps.read_run(tmp_path / "lost")
    assert [(r.response_ids, r.reward) for r in got] == [(r.response_ids, r.reward) for r in want]
    assert [r["history_ok"] for r in lost] == [True, True, False, False]
    assert [r["spec_rate"] for r in lost[2:]] == [0.0, 0.0]
    notes = [n for n in (tmp_path / "lost" / "events.log").read_text().splitlines() if "history worker" in n]
    assert len(notes) == 1 and "step 3: the history worker cannot serve indexes (ConnectionError" in notes[0]
