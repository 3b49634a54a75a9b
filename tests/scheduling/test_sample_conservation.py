"""Property: under every policy every sample completes exactly once, with all its tokens.

Migrations (intra-step, inter-step, reallocation) and asynchronous pulls move samples around;
none may be lost, duplicated, or lose generated tokens. The simulator checks token counts at
every move and the scheduler refuses a second finish, so a run that completes is the proof.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
from collections.abc import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.scheduling import (
    AsyncRollout,
    EqualSplit,
    HistoPipe,
    LongestFirst,
    Reallocate,
    Scheduler,
    SkewAware,
    SpeculationSpeedup,
    TableProfile,
)
from rhymerl.api.scheduling import MigrationSpec
from rhymerl.tools.sim import SimConfig, simulate
from rhymerl.tools.traces import Trace

AGGRESSIVE = MigrationSpec(tail_fraction=0.6, min_lambda=1.0, growth_percentile=50.0)


def _policies(workers: int) -> list[Scheduler]:
    return [
        EqualSplit(workers),
        LongestFirst(workers),
        SkewAware(workers),
        Reallocate(workers, threshold=2, cooldown_s=0.0),
        AsyncRollout(workers, staleness=1),
        AsyncRollout(workers, staleness=0, interrupt_on_update=False),
        HistoPipe(workers, groups=3, two_tier=True, migration=AGGRESSIVE),
        HistoPipe(workers, groups=2, two_tier=False, migration=MigrationSpec(tail_fraction=0.5, inter_step=True,
                                                                                min_lambda=1.0)),
        HistoPipe(workers, groups=2, staleness=0, migration=AGGRESSIVE),
        HistoPipe(workers, groups=3, migration=AGGRESSIVE, work_stealing=False),
    ]


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging: a simulator that stops making progress loops forever."""
    def stop(signum: int, frame: object) -> None:
        raise TimeoutError(f"no result within {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


prompt = st.tuples(st.sampled_from([f"p{i}" for i in range(6)]),
                   st.lists(st.one_of(st.integers(0, 40), st.integers(100, 400)), min_size=1, max_size=4))
steps = st.lists(st.lists(prompt, min_size=1, max_size=5), min_size=2, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, workers=st.integers(1, 4), alpha=st.sampled_from([1.0, 1.7]), prefill=st.sampled_from([0.0, 0.01]),
       kv=st.sampled_from([None, 300, 900]))
def test_every_sample_finishes_exactly_once_under_every_policy(
    steps: list[list[tuple[str, list[int]]]], workers: int, alpha: float, prefill: float, kv: int | None
) -> None:
    rows = [[(p, n) for p, lens in step for n in lens] for step in steps]
    trace = Trace.from_steps(rows)
    simulated = sum(len(r) for r in rows[1:])
    const = TableProfile.constant(0.01, max_batch=3, prefill_seconds_per_token=prefill)
    # a small KV cache (prompts are 10 tokens, responses up to 400) forces preemptions mid-migration
    profile = dataclasses.replace(const, kv_capacity_tokens=kv)
    cfg = SimConfig(workers=workers, profile=profile, speculation=SpeculationSpeedup(tokens_per_pass=alpha))
    for sched in _policies(workers):
        sched.profile = cfg.profile
        with _deadline(60):
            r = simulate(trace, sched, cfg, warmup_steps=1)
        assert len(r.finished) == simulated == r.samples, sched.label
        assert sched.stats.finished == simulated and sched.stats.planned == simulated
        assert sorted(r.finished) == sorted(range(len(rows[0]), len(rows[0]) + simulated))
        assert sum(s.samples for s in r.steps) == simulated
        assert sched.deferred() == []
        assert 0.0 <= r.bubble_ratio <= 1.0
        assert r.makespan >= r.lower_bound.longest_sample - 1e-9


def test_a_full_kv_cache_with_fractional_tokens_per_pass_preempts_and_every_policy_finishes() -> None:
    # 37-token prompts, 100-token responses, 150 tokens of cache, 1.3 tokens per pass: the point
    # where the cache is full falls between iterations (this used to loop forever)
    warm = [("p0", 100), ("p1", 100), ("p2", 100)]
    trace = Trace.from_steps([warm, warm, warm], input_len=37)
    profile = dataclasses.replace(TableProfile.constant(0.01, max_batch=3), kv_capacity_tokens=150)
    cfg = SimConfig(workers=1, profile=profile, speculation=SpeculationSpeedup(tokens_per_pass=1.3))
    preempted = 0
    for sched in _policies(1):
        sched.profile = profile
        with _deadline(20):
            r = simulate(trace, sched, cfg, warmup_steps=1)
        assert len(r.finished) == 6, sched.label
        assert r.peak_kv_tokens <= 150, sched.label
        preempted += r.preemptions
    assert preempted > 0
