"""Rollout scheduling: HistoPipe (RhymeRL §6) and the baselines it is measured against.

Pure decision logic, no I/O and no clock: the simulator (rhymerl.tools.sim) and the real
controller drive the same scheduler objects with events. See docs/scheduling.md.
"""

from .base import Scheduler, SchedulerStats, SchedulingError
from .baselines import AsyncRollout, EqualSplit, LongestFirst, Reallocate, SkewAware
from .costmodel import (
    NO_SPECULATION,
    IterationProfile,
    RooflineProfile,
    SpeculationSpeedup,
    TableProfile,
    group_decode_time,
    knee_batch,
    token_cost,
    worker_decode_time,
)
from .factory import POLICIES, make_scheduler
from .histopipe import HistoPipe
from .history import LengthHistory
from .types import Action, Move, Pipeline, Rebalance, RoundPlan, Sample, SampleId, Watch

__all__ = [
    "NO_SPECULATION",
    "POLICIES",
    "Action",
    "AsyncRollout",
    "EqualSplit",
    "HistoPipe",
    "IterationProfile",
    "LengthHistory",
    "LongestFirst",
    "Move",
    "Pipeline",
    "Reallocate",
    "Rebalance",
    "RooflineProfile",
    "RoundPlan",
    "Sample",
    "SampleId",
    "Scheduler",
    "SchedulerStats",
    "SchedulingError",
    "SkewAware",
    "SpeculationSpeedup",
    "TableProfile",
    "Watch",
    "group_decode_time",
    "knee_batch",
    "make_scheduler",
    "token_cost",
    "worker_decode_time",
]
