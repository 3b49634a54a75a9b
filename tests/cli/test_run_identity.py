"""One job, one identity: a pod's run folder records its RLJob's uid, and a job created again under the
same name (its checkpoint volume kept and reused by name) starts fresh rather than going on with, or
finishing at once as, the earlier job's run; unless its annotation asks to go on with that run
(workers/runtime/controller_pod.py, workers/run_folder/identity.py). No Ray: the run folder as the controller opens it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rhymerl.api import RLJob
from rhymerl.errors import UserError
from rhymerl.workers.run_folder.identity import (
    JOB_UID_ENV,
    RESUME_ANNOTATION,
    RESUME_FROM_ENV,
    claim,
    decide,
    record,
    recorded_uid,
)
from rhymerl.workers.run_folder.run_dir import DATA_DIR_ENV, RunDir
from rhymerl.workers.runtime.controller_pod import open_run as _open_run

OLD, NEW = "uid-old", "uid-new"


class Reporter:
    def __init__(self) -> None:
        self.said: list[str] = []

    def say(self, message: str) -> None:
        self.said.append(message)


def finished_run(data: Path, uid: str | None) -> tuple[Path, RLJob]:
    """A run folder on a kept volume whose run finished: 2 steps of its one epoch, checkpointed."""
    job = RLJob.model_validate({"metadata": {"name": "alpha"}, "spec": {"algorithm": {"epochs": 1}}})
    run = RunDir(data / "run")
    run.create(job)
    for step in (1, 2):
        run.append_metrics({"step": step})
    state = run.path / "checkpoints" / "step_000002"
    state.mkdir(parents=True)
    (state / "state.json").write_text(json.dumps({"step": 2, "epoch": 2, "cursor": 0, "policy_version": 2}))
    run.close()
    record(run.path, uid)
    assert run.finished(job.spec.algorithm.epochs), "the earlier job's run is done: resuming it runs nothing"
    return run.path, job


def test_a_job_created_again_under_its_name_starts_fresh_and_sets_the_earlier_run_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, job = finished_run(tmp_path, OLD)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(JOB_UID_ENV, NEW)
    reporter = Reporter()
    run, _, resume = _open_run(job, reporter)  # type: ignore[arg-type]
    run.close()
    assert not resume and run.metrics() == [] and not run.finished(job.spec.algorithm.epochs)
    assert recorded_uid(path) == NEW
    aside = tmp_path / f"run.previous-{OLD}"
    assert [r["step"] for r in RunDir(aside).metrics()] == [1, 2] and recorded_uid(aside) == OLD
    said = reporter.said[-1]
    assert said.startswith("starting fresh alpha") and OLD in said and RESUME_ANNOTATION in said
    events = (path / "events.log").read_text()
    assert f"earlier job of this name (uid {OLD})" in events and str(aside) in events


def test_a_restarted_controller_of_the_same_job_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, job = finished_run(tmp_path, NEW)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(JOB_UID_ENV, NEW)
    reporter = Reporter()
    run, _, resume = _open_run(job, reporter)  # type: ignore[arg-type]
    run.close()
    assert resume and [r["step"] for r in run.metrics()] == [1, 2]
    assert reporter.said[-1] == f"resuming alpha in {path}" and not list(tmp_path.glob("run.previous-*"))


def test_the_annotation_naming_the_earlier_uid_goes_on_with_its_run(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path, job = finished_run(tmp_path, OLD)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(JOB_UID_ENV, NEW)
    monkeypatch.setenv(RESUME_FROM_ENV, OLD)
    reporter = Reporter()
    run, _, resume = _open_run(job, reporter)  # type: ignore[arg-type]
    run.close()
    assert resume and recorded_uid(path) == NEW and "going on with the run of the earlier job" in reporter.said[-1]


def test_an_annotation_naming_another_uid_is_refused_naming_the_annotation(tmp_path: Path) -> None:
    path, _ = finished_run(tmp_path, OLD)
    with pytest.raises(UserError, match=rf"metadata.annotations\[{RESUME_ANNOTATION}\]: uid-typo .*uid {OLD}"):
        claim(path, NEW, "uid-typo")
    assert recorded_uid(path) == OLD, "nothing moved"


def test_only_the_newest_earlier_run_is_kept_aside(tmp_path: Path) -> None:
    path, _ = finished_run(tmp_path, OLD)
    assert claim(path, "uid-2", None).fresh
    path.mkdir()
    record(path, "uid-2")
    (path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert claim(path, "uid-3", None).fresh
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.previous-uid-2"]


@pytest.mark.parametrize(("recorded", "has_run", "uid", "resume_from", "action"), [
    (OLD, True, None, None, "keep"),  # no uid known (one machine, an older pod template): nothing checked
    (None, True, NEW, None, "keep"),  # a folder from before uids were recorded: taken as this job's
    (None, False, NEW, OLD, "keep"),  # nothing to go on with: a fresh start, said
    (NEW, True, NEW, OLD, "keep"),  # already taken over: a restart resumes
    (OLD, True, NEW, None, "set_aside"),
])
def test_what_a_pod_does_with_a_run_folder(recorded: str | None, has_run: bool, uid: str | None,
                                           resume_from: str | None, action: str) -> None:
    assert decide(recorded, has_run, uid, resume_from).action == action
