"""One job, one identity: which RLJob (its metadata.uid) a pod's run folder belongs to.

A job's checkpoint volumes outlive it by default (checkpoint.storage.keepOnDelete) and a StatefulSet
reuses a claim by name, so a job deleted and created again under the same name would find the old
job's run folder and silently continue it (or report it finished at once). So a run folder records
the uid of the job that made it (JOB_UID_FILE), and a pod of another uid moves the folder aside and
starts fresh, unless the job's annotation RESUME_ANNOTATION names the uid it records: then it goes on
with that run, which becomes the new job's. The operator hands each pod the uid and the annotation
(JOB_UID_ENV, RESUME_FROM_ENV); without a uid (one machine, a pod template older than this) nothing
is checked. One folder set aside is kept per volume, the newest, so a job re-created every night does
not fill its volume.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rhymerl.errors import UserError
from rhymerl.workers import atomic

JOB_UID_ENV = "RHYMERL_JOB_UID"
RESUME_FROM_ENV = "RHYMERL_RESUME_FROM_UID"
RESUME_ANNOTATION = "rhymerl.io/resume-from-uid"
JOB_UID_FILE = "job-uid"
ASIDE = ".previous-"  # <run folder>.previous-<uid>: a run of an earlier job of the same name


@dataclass(frozen=True)
class Decision:
    """`keep`: go on in the folder as it is (resuming whatever run it holds); `set_aside`: move it away
    and start fresh. `note`: what to tell the user (events.log, status), if anything."""

    action: Literal["keep", "set_aside"]
    note: str | None = None


def decide(recorded: str | None, has_run: bool, uid: str | None, resume_from: str | None) -> Decision:
    """What a pod of job `uid` does with a run folder that records job uid `recorded` (None: none) and
    holds a run or not; `resume_from`: the job's RESUME_ANNOTATION. Pure."""
    if not uid:
        return Decision("keep")
    if not has_run:
        asked = f"{RESUME_ANNOTATION} names job uid {resume_from}, but this volume holds no run: starting fresh"
        return Decision("keep", asked if resume_from else None)
    if recorded == uid:
        return Decision("keep")
    if recorded is None:
        return Decision("keep", f"this run folder records no job uid (made before rhymerl recorded one): "
                                f"taken as job uid {uid}'s")
    if resume_from == recorded:
        return Decision("keep", f"going on with the run of the earlier job uid {recorded} ({RESUME_ANNOTATION}); "
                                f"it is job uid {uid}'s from now on")
    if resume_from:
        raise UserError(f"metadata.annotations[{RESUME_ANNOTATION}]: {resume_from} is not the job whose run this "
                        f"volume holds (uid {recorded}): name that uid to go on with it, or remove the annotation "
                        "to start fresh")
    return Decision("set_aside", f"this volume held the run of an earlier job of this name (uid {recorded}); "
                                 f"starting fresh (annotate the job {RESUME_ANNOTATION}: {recorded} to go on with "
                                 "that run instead)")


@dataclass(frozen=True)
class Claim:
    note: str | None  # for events.log and the status
    fresh: bool  # an earlier job's run was moved aside


def recorded_uid(path: Path) -> str | None:
    try:
        return (path / JOB_UID_FILE).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def claim(path: Path, uid: str | None, resume_from: str | None) -> Claim:
    """Make run folder `path` job `uid`'s (see `decide`): an earlier job's is moved aside."""
    recorded = recorded_uid(path)
    has_run = path.is_dir() and any(p.name != JOB_UID_FILE for p in path.iterdir())
    decision = decide(recorded, has_run, uid, resume_from or None)
    if decision.action == "keep":
        return Claim(decision.note, False)
    aside = path.with_name(f"{path.name}{ASIDE}{recorded}")
    for older in path.parent.glob(f"{path.name}{ASIDE}*"):
        shutil.rmtree(older, ignore_errors=True)
    path.rename(aside)
    return Claim(f"{decision.note}; its folder is now {aside}", True)


def record(path: Path, uid: str | None) -> None:
    """Record that run folder `path` (which exists) is job `uid`'s; nothing without a uid."""
    if uid and recorded_uid(path) != uid:
        atomic.write_text(path / JOB_UID_FILE, f"{uid}\n")
