"""A finished simulation's measurements, read off the simulator's books (`RunBooks`, which
engine.Simulator implements)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.costmodel import IterationProfile
from rhymerl.tools.traces.model import Trace

from .admission import Admission
from .config import SimConfig
from .metrics import LowerBound, SimResult, StepRecord, lower_bound, window_bubbles
from .state import SimSeq
from .timing import DecodeModel


class RunBooks(Protocol):
    """What a finished run recorded."""

    trace: Trace
    sched: Scheduler
    cfg: SimConfig
    profile: IterationProfile
    first_step: int
    last_step: int
    bound_batch: int
    seqs: dict[int, SimSeq]
    finished: dict[int, tuple[float, int, int]]
    completed: dict[int, float]
    migrations: list[tuple[float, int, int, int]]
    moves_of: dict[int, int]
    decode: DecodeModel
    admission: Admission


def collect_result(books: RunBooks, total: int) -> SimResult:
    """What a finished simulation measured: makespan, bubbles, per-step windows and bounds, moves."""
    segments = books.admission.segments
    makespan = max((t for t, _, _ in books.finished.values()), default=0.0)
    busy = sum(e - s for _, s, e, _ in segments)
    n = books.cfg.workers
    step_ids = range(books.first_step, books.last_step + 1)
    counts = {s: 0 for s in step_ids}
    for _, _, st in books.finished.values():
        counts[st] += 1
    windows = [(books.admission.step_start.get(s, 0.0), books.completed.get(s, 0.0)) for s in step_ids]
    bubbles = window_bubbles(segments, n, windows)
    rows = np.array(sorted(books.seqs), dtype=np.int64)
    step_lb = _step_bounds(books, rows, step_ids)
    turns = books.trace.turns
    steps = [
        StepRecord(step=s, samples=counts[s], start=lo, end=hi, bubble_ratio=b, migrations=books.moves_of.get(s, 0),
                   work_bound=step_lb[s].work_per_worker, longest_sample=step_lb[s].longest_sample)
        for s, (lo, hi), b in zip(step_ids, windows, bubbles, strict=True)
    ]
    stats = books.sched.stats
    return SimResult(
        policy=books.sched.label,
        workers=n,
        steps=steps,
        samples=total,
        makespan=makespan,
        busy=busy,
        bubble_ratio=min(1.0, max(0.0, 1.0 - busy / (n * makespan))) if makespan > 0 else 0.0,
        samples_per_s=total / makespan if makespan > 0 else 0.0,
        intra_step=stats.intra_step,
        inter_step=stats.inter_step,
        rebalanced=stats.rebalanced,
        migrated_samples=len(stats.migrated_samples),
        recompute_tokens=books.admission.recompute_tokens,
        mean_batch=books.decode.seq_iterations / books.decode.iterations if books.decode.iterations else 0.0,
        peak_kv_tokens=int(books.decode.peak_kv),
        lower_bound=lower_bound(
            books.trace.input_len[rows], books.trace.output_len[rows], n, books.bound_batch, books.profile,
            books.cfg.speculation, turns.take(rows) if turns is not None else None,
        ),
        segments=segments,
        migrations=books.migrations,
        finished=books.finished,
        rankings=dict(stats.rankings),
        stolen=stats.stolen,
        preemptions=books.admission.preemptions,
    )


def _step_bounds(books: RunBooks, rows: NDArray[np.int64], step_ids: range) -> dict[int, LowerBound]:
    """Each step's lower bound, over its trace rows (`rows`: every simulated row, sorted)."""
    n = books.cfg.workers
    step_of = np.array([books.seqs[i].origin for i in rows.tolist()], dtype=np.int64)
    by_step = rows[np.argsort(step_of, kind="stable")]  # each step's rows together, in row order
    bounds = np.searchsorted(np.sort(step_of), [step_ids.start, *(s + 1 for s in step_ids)])
    step_lb = {}
    turns = books.trace.turns
    for i, s in enumerate(step_ids):
        r = by_step[bounds[i]:bounds[i + 1]]
        step_lb[s] = lower_bound(
            books.trace.input_len[r], books.trace.output_len[r], n, books.bound_batch, books.profile, books.cfg.speculation,
            turns.take(r) if turns is not None else None,
        )
    return step_lb
