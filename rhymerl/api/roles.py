"""The roles of a job's processes: one StatefulSet each in a cluster (the operator), one kind of
worker each in the distributed runtime (`rhymerl worker --role`)."""

from __future__ import annotations

from typing import Literal

Role = Literal["controller", "rollout", "train", "reward", "history"]
ROLES: tuple[Role, ...] = ("controller", "rollout", "train", "reward", "history")
