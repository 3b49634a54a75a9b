"""The rollout pool: the production schedulers driving real engine replicas, tokens unchanged."""

from __future__ import annotations

import random

import pytest

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.scheduling.base import SampleState, Scheduler
from rhymerl.algorithms.scheduling.baselines import Reallocate
from rhymerl.algorithms.scheduling.factory import make_scheduler
from rhymerl.algorithms.scheduling.types import Action, Move, Sample, StepPlan, Watch
from rhymerl.api.spec import SchedulingSpec
from rhymerl.workers.controller.rollout_pool import ExecutorError, PoolReport, RolloutPool, table_profile
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.engine import GenRequest, GenResult, SamplingParams, TorchEngine
from rhymerl.workers.rollout.sampling import sample_key

EOS = 2
PARAMS = SamplingParams(temperature=1.0, seed=3, max_response_length=40)


@pytest.fixture
def model(tiny_model: TinyLlama) -> TinyLlama:
    # float64: logits do not depend on batch shape or on prefill vs decode, so tokens compare exactly
    return tiny_model.double()


def _prompts(n: int = 6) -> dict[str, list[int]]:
    rng = random.Random(0)
    return {f"p{i}": [1] + [rng.randrange(3, 40) for _ in range(rng.randrange(2, 12))] for i in range(n)}


def _requests(prompts: dict[str, list[int]], epoch: int, group: int = 4) -> list[GenRequest]:
    return [GenRequest(ids, sample_key(p, epoch, k), p) for p, ids in prompts.items() for k in range(group)]


def _tokens(results: list[GenResult]) -> list[list[int]]:
    return [r.response_ids for r in results]


@pytest.mark.parametrize("policy", ["histopipe", "equal", "skew-aware", "realloc", "async"])
@pytest.mark.parametrize("replicas", [2, 3])
def test_every_policy_on_replicas_emits_exactly_the_single_engine_tokens(
        model: TinyLlama, policy: str, replicas: int) -> None:
    prompts = _prompts()
    engine = TorchEngine(model, EOS, max_batch_size=4)  # smaller than a replica's share: queues wait, stealing
    sched = make_scheduler(SchedulingSpec(policy=policy, ranking_groups=2), replicas)
    pool = RolloutPool(engine, sched, PARAMS)
    for epoch in (1, 2):  # epoch 2 is ranked by the lengths epoch 1 produced
        reqs = _requests(prompts, epoch)
        out, report = pool.run(reqs)
        assert _tokens(out) == _tokens(engine.generate(reqs, PARAMS))
        assert len(report.busy_s) == replicas and report.makespan_s >= max(report.busy_s) > 0
        assert 0.0 <= report.bubble_ratio < 1.0
    if policy in ("histopipe", "skew-aware"):
        assert sched.stats.rankings == {1: "prompt-length", 2: "history"}
    assert sched.stats.finished == 2 * len(_requests(prompts, 1))


def test_histopipe_migrates_outliers_intra_step_with_their_tokens(model: TinyLlama) -> None:
    prompts = _prompts()
    engine = TorchEngine(model, EOS, max_batch_size=8)
    spec = SchedulingSpec(ranking_groups=3, migration={"tail_fraction": 1.0})
    sched = make_scheduler(spec, 3)
    for i, p in enumerate(prompts):  # last epoch's (made-up) lengths were short: today's responses are outliers
        sched.prime(p, [2 + 3 * i] * 4)
    reqs = _requests(prompts, 1)
    out, report = RolloutPool(engine, sched, PARAMS).run(reqs)
    assert _tokens(out) == _tokens(engine.generate(reqs, PARAMS))
    assert report.migrated == sched.stats.intra_step > 0
    assert sched.stats.inter_step == 0  # the local loop has no next step to defer to
    assert sched.stats.finished == len(reqs)


class MoveAtFiveTokens(Scheduler):
    """Everything on replica 0; after the first finish, every other sample moves to replica 1 once it
    has 5 tokens (or at once if it has more)."""

    name = "move-at-five"

    def __init__(self) -> None:
        super().__init__(2)
        self.moves: list[Move] = []

    def _plan(self, step: int, samples: list[Sample], carried: list[Sample]) -> StepPlan:
        return StepPlan(step=step, queues=[[s.sid for s in samples], []])

    def _after_finish(self, st: SampleState, now: float) -> list[Action]:
        if self.stats.finished > 1:
            return []
        return [Watch(sid, 5) for sid, other in self._samples.items() if not other.done]

    def _progress(self, st: SampleState, worker: int, generated: int, now: float) -> list[Action]:
        move = self._emit(Move(st.sample.sid, worker, 1, generated))
        self.moves.append(move)
        return [move]


def test_a_forced_move_mid_generation_keeps_the_tokens_and_counts_the_sample_once(model: TinyLlama) -> None:
    reqs = _requests(_prompts(3), 1)
    engine = TorchEngine(model, EOS, max_batch_size=16)
    sched = MoveAtFiveTokens()
    out, report = RolloutPool(engine, sched, PARAMS).run(reqs)
    plain = engine.generate(reqs, PARAMS)
    assert _tokens(out) == _tokens(plain)
    assert report.migrated == len(sched.moves) > 0
    assert any(0 < m.generated < len(plain[m.sid].response_ids) for m in sched.moves)  # moved mid-generation
    assert sched.stats.finished == len(reqs) and report.busy_s[1] > 0


def test_rebalanced_samples_keep_their_tokens(model: TinyLlama) -> None:
    reqs = _requests(_prompts(), 1)
    engine = TorchEngine(model, EOS, max_batch_size=16)
    sched = Reallocate(3, threshold=6, cooldown_s=0.0)
    out, report = RolloutPool(engine, sched, PARAMS).run(reqs)
    assert _tokens(out) == _tokens(engine.generate(reqs, PARAMS))
    assert report.migrated == sched.stats.rebalanced > 0


class DeferEverything(MoveAtFiveTokens):
    def _progress(self, st: SampleState, worker: int, generated: int, now: float) -> list[Action]:
        return [self._emit(Move(st.sample.sid, worker, None, generated))]


def test_an_inter_step_move_is_refused_rather_than_losing_the_sample(model: TinyLlama) -> None:
    sched = DeferEverything()
    sched.final_step = None
    with pytest.raises(ExecutorError, match="inter-step"):
        RolloutPool(TorchEngine(model, EOS), sched, PARAMS).run(_requests(_prompts(3), 1))


def test_reports_of_one_steps_rounds_add_up() -> None:
    a = PoolReport([1.0, 0.5], 1.0, migrated=1, stolen=2, ranking="history")
    b = PoolReport([0.5, 1.0], 1.0, migrated=2, stolen=0, ranking="history")
    both = a.merged(b)
    assert both.busy_s == [1.5, 1.5] and both.makespan_s == 2.0 and both.migrated == 3 and both.stolen == 2
    assert both.bubble_ratio == pytest.approx(0.25)
    assert a.metrics()["rollout_bubble"] == 0.25


def test_the_scheduler_prices_decode_with_the_engines_measured_one_token_passes() -> None:
    cost = CostProfile((1, 16), (1, 33), ((0.001, 0.0033), (0.004, 0.05)))
    prof = table_profile(cost, max_batch=16)
    assert prof.iteration_time(1, 10) == pytest.approx(0.001)
    assert prof.iteration_time(16, 5000) == pytest.approx(0.004)
    assert prof.prefill_time(33) == pytest.approx(0.0033)
    assert prof.max_batch == 16


def test_the_pool_numbers_scheduler_steps_one_per_batch(model: TinyLlama) -> None:
    sched = make_scheduler(SchedulingSpec(), 2)
    pool = RolloutPool(TorchEngine(model, EOS), sched, SamplingParams(max_response_length=4), first_step=5)
    pool.run(_requests(_prompts(2), 1, group=2))
    pool.run(_requests(_prompts(2), 2, group=2))
    assert sorted(sched.stats.rankings) == [5, 6]
    assert sched.stats.finished == 8


def test_an_idle_replica_steals_unstarted_samples_without_changing_tokens(model: TinyLlama) -> None:
    prompts = _prompts()
    engine = TorchEngine(model, EOS, max_batch_size=2)  # long queues: most samples wait
    sched = make_scheduler(SchedulingSpec(ranking_groups=3, migration={"enabled": False}), 3)
    for i, p in enumerate(prompts):  # made-up history: groups look unequal, so replicas finish apart
        sched.prime(p, [5 + 10 * i] * 4)
    reqs = _requests(prompts, 1)
    out, report = RolloutPool(engine, sched, PARAMS).run(reqs)
    assert _tokens(out) == _tokens(engine.generate(reqs, PARAMS))
    assert report.stolen == sched.stats.stolen > 0 and report.migrated == 0
    assert sched.stats.finished == len(reqs)
