"""The rollout fleet on workers in this process: the production schedulers and the one executor
driving real engines, workers joining and leaving mid-round, every sample generated once and every
token what one engine makes. Each event is forced (a decision, a count of reports), never timed."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from in_process_fleet import InProcessFleet
from jobs import make_job

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.scheduling.base import SampleState, Scheduler
from rhymerl.algorithms.scheduling.baselines import Reallocate
from rhymerl.algorithms.scheduling.costmodel import TableProfile
from rhymerl.algorithms.scheduling.freed_drafters import DrafterPlan, WorkerView
from rhymerl.algorithms.scheduling.histopipe import HistoPipe
from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.algorithms.scheduling.types import Action, Move, RoundPlan, Sample, Watch
from rhymerl.api import RLJob
from rhymerl.workers import dumps
from rhymerl.workers.controller.fleet import RolloutFleet, pod_ordinal, table_profile
from rhymerl.workers.controller.fleet_drafters import forced_costs
from rhymerl.workers.controller.loop import fleet_metrics, run_steps
from rhymerl.workers.controller.role_apis import RolloutAPI, TrainAPI
from rhymerl.workers.controller.transport import LocalTransport
from rhymerl.workers.roles.rollout_worker import RolloutWorker
from rhymerl.workers.rollout.group_drafts import GrownTokens
from rhymerl.workers.rollout.remote_drafts import SOURCE
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.run_folder.run_dir import RunDir

# 6 prompts, 3 groups of 4 a step, up to 4 workers
FLEET = {"data": {"num_prompts": 6}, "algorithm": {"group_size": 4, "prompts_per_step": 3, "max_off_policy_steps": 0},
         "rollout": {"max_replicas": 4}, "scheduling": {"ranking_groups": 2}}


def _job(model_dir: Path, workers: int = 1, policy: str = "histopipe", length: int = 24, batch: int = 8,
         rollout: Mapping[str, Any] | None = None) -> RLJob:
    return make_job(FLEET, {"model": {"path": str(model_dir)}, "algorithm": {"max_response_length": length},
                            "rollout": {"replicas": workers, "max_batch_size": batch, **(rollout or {})},
                            "scheduling": {"policy": policy}})


def _drafting(model_dir: Path, **speculation: object) -> dict[str, Any]:
    """Greedy decoding, with the policy itself as the freed workers' draft model."""
    return {"temperature": 0, "speculation": {"method": "none", "freed_drafters": True, "draft_model": str(model_dir),
                                              **speculation}}


def _tokens(path: Path) -> list[tuple[int, str, int, tuple[int, ...]]]:
    return [(r.step, r.prompt_id, r.sample_index, tuple(r.response_ids)) for r in dumps.read_run(path)]


def _run(job: RLJob, path: Path) -> list[dict[str, object]]:
    run = RunDir(path)
    run.create(job)
    try:
        return [m.row() for m in run_steps(job, run)]
    finally:
        run.close()


@pytest.mark.parametrize(("policy", "workers"), [("histopipe", 2), ("histopipe", 3), ("equal", 3), ("skew-aware", 3),
                                                 ("realloc", 3), ("async", 3)])
def test_every_policy_on_several_workers_emits_the_tokens_of_one(model_dir: Path, tmp_path: Path, policy: str,
                                                                 workers: int) -> None:
    _run(_job(model_dir), tmp_path / "one")
    rows = _run(_job(model_dir, workers, policy), tmp_path / "many")
    assert _tokens(tmp_path / "many") == _tokens(tmp_path / "one")
    assert [r["rollout_workers"] for r in rows] == [workers] * len(rows)
    if policy in ("histopipe", "skew-aware"):
        assert [r["schedule_ranking"] for r in rows] == ["prompt-length", "prompt-length", "history", "history"]


PROMPTS = [f"ac-0-{i:05d}" for i in range(6)]


class MoveAtFiveTokens(Scheduler):
    """Everything on worker 0; after the first finish, every other sample moves to worker 1 once it
    has 5 tokens (or at once if it has more)."""

    name = "move-at-five"

    def __init__(self) -> None:
        super().__init__(2)
        self.moves: list[Move] = []

    def _plan(self, step: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        return RoundPlan(round_no=step, queues=[[s.sid for s in samples + carried], []])

    def _after_finish(self, st: SampleState, now: float) -> list[Action]:
        if self.stats.finished > 1:
            return []
        return [Watch(sid, 5) for sid, other in self._samples.items() if not other.done]

    def _progress(self, st: SampleState, worker: int, generated: int, now: float) -> list[Action]:
        move = self._emit(Move(st.sample.sid, worker, 1, generated))
        self.moves.append(move)
        return [move]


def test_a_move_mid_generation_keeps_the_samples_tokens_and_counts_it_once(model_dir: Path, tmp_path: Path) -> None:
    one, _ = InProcessFleet(_job(model_dir), tmp_path / "one").round(PROMPTS)
    sched = MoveAtFiveTokens()
    moved, rnd = InProcessFleet(_job(model_dir, 2), tmp_path / "two", scheduler=sched).round(PROMPTS)
    assert moved == one
    assert sched.moves and any(m.generated >= 5 for m in sched.moves)
    assert rnd.counts["migrated"] == sched.stats.intra_step > 0  # those not refused (finished first)
    assert sched.stats.finished == len(one) == 24


class AllOnZero(Scheduler):
    """Every sample on worker 0: worker 1 is freed from the round's start."""

    name = "all-on-zero"

    def __init__(self) -> None:
        super().__init__(2)

    def _plan(self, step: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        return RoundPlan(round_no=step, queues=[[s.sid for s in samples + carried], []])


def test_a_freed_worker_drafts_for_a_straggling_one_and_the_tokens_stay_one_workers(
        model_dir: Path, tmp_path: Path) -> None:
    one, _ = InProcessFleet(_job(model_dir, rollout={"temperature": 0}), tmp_path / "one").round(PROMPTS)
    # the policy drafting for itself, greedily: every draft it makes is the token plain decoding takes
    job = _job(model_dir, 2, rollout=_drafting(model_dir))
    f = InProcessFleet(job, tmp_path / "two", scheduler=AllOnZero())
    asked: list[tuple[list[int], list[int]]] = []

    def forced(views: Sequence[WorkerView], freed: Sequence[int], current: Mapping[int, int],
               may_merge: bool) -> DrafterPlan:
        asked.append(([v.worker for v in views], list(freed)))
        return DrafterPlan({freed[0]: views[0].worker} if freed and views else {}, None)

    f.fleet.drafters.decide = forced
    rnd = f.fleet.launch([(1, p) for p in PROMPTS], step=1, inter_step=False)
    results = [s.result for _, scored in f.fleet.collect(rnd) for s in f.t.get(scored)]
    assert {(s.sample.prompt_id, s.sample.index): tuple(s.result.response_ids)
            for c in rnd.calls if c.scored is not None for s in f.t.get(c.scored)} == one
    assert asked[0] == ([0], [1]) and rnd.drafting == 1
    drafted = [r.by_source[SOURCE] for r in results if SOURCE in r.by_source]
    assert sum(c.accepted for c in drafted) == sum(c.drafted for c in drafted) > 0
    assert fleet_metrics([rnd], 2, 2)["rollout_drafting_workers"] == 1


class SplitOverTwo(Scheduler):
    """Samples dealt alternately to workers 0 and 1: worker 2 is freed from the round's start."""

    name = "split-over-two"

    def __init__(self) -> None:
        super().__init__(3)

    def _plan(self, step: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        every = samples + carried
        return RoundPlan(round_no=step, queues=[[s.sid for s in every[0::2]], [s.sid for s in every[1::2]], []])


def test_without_consolidate_tail_no_worker_is_emptied_to_draft(model_dir: Path, tmp_path: Path) -> None:
    job = _job(model_dir, 3, rollout=_drafting(model_dir, consolidate_tail=False))
    f = InProcessFleet(job, tmp_path / "three", scheduler=SplitOverTwo())
    f.fleet.drafters.costs = lambda: forced_costs(job, f.fleet.drafters.consolidates)
    out, rnd = f.round(PROMPTS[:2])
    assert len(out) == 8 and rnd.consolidations == 0 and rnd.counts["migrated"] == 0
    assert "rollout worker 2 drafts for rollout worker 0 (step 1; freed drafters)" in f.notes


def test_a_straggling_worker_no_freed_one_drafts_for_is_emptied_onto_another_and_drafts_for_it(
        model_dir: Path, tmp_path: Path) -> None:
    one, _ = InProcessFleet(_job(model_dir, rollout={"temperature": 0}), tmp_path / "one").round(PROMPTS[:2])
    job = _job(model_dir, 3, rollout=_drafting(model_dir))
    f = InProcessFleet(job, tmp_path / "three", scheduler=SplitOverTwo())
    f.fleet.drafters.costs = lambda: forced_costs(job, f.fleet.drafters.consolidates)  # the real decisions; merges pay
    merges: list[tuple[int, int] | None] = []
    priced = f.fleet.drafters.decide

    def seen(views: Sequence[WorkerView], freed: Sequence[int], current: Mapping[int, int],
             may_merge: bool) -> DrafterPlan:
        plan = priced(views, freed, current, may_merge)
        merges.append(plan.merge)
        return plan

    f.fleet.drafters.decide = seen
    out, rnd = f.round(PROMPTS[:2])
    assert out == one and len(out) == 8  # every sample once, each with plain decoding's tokens
    # worker 2 drafts for 0 (more work left, or the lower id); 1, left without a drafter, empties onto 0
    assert next(m for m in merges if m is not None) == (1, 0)
    assert rnd.consolidations == 1 and rnd.counts["migrated"] == f.fleet.executor.done["rebalance"] == 4
    said = [n for n in f.notes if n.startswith("rollout worker")]
    assert said.index("rollout worker 1 hands its 4 samples to rollout worker 0 and drafts for it (step 1; freed "
                      "drafters)") < said.index("rollout worker 1 drafts for rollout worker 0 (step 1; freed drafters)")
    assert fleet_metrics([rnd], 3, 3)["rollout_consolidations"] == 1


@pytest.mark.parametrize(("engine", "merges"), [("torch", True), ("vllm", False)])
def test_a_vllm_fleet_pairs_freed_drafters_but_empties_no_worker_onto_another(
        engine: str, merges: bool) -> None:
    """A vLLM call verifies a drafter's drafts but takes no moved sample (rollout_engine.VLLM)."""
    job = make_job({"rollout": {"engine": engine, "replicas": 2, "max_replicas": 2, "speculation": {
        "method": "history", "freed_drafters": True, "draft_model": "builtin:tiny-arith-draft"}}})

    def never() -> Any:
        raise AssertionError("no worker starts before the fleet does")

    fleet = RolloutFleet(job, LocalTransport(), LengthHistory(), {}, [], never, lambda: 2, print, print)
    assert fleet.drafters.enabled and fleet.drafters.consolidates == merges
    assert fleet.starter.drafts_remotely and fleet.starter.releasable == merges


def test_the_default_shared_queue_emits_the_tokens_of_the_per_worker_placement_it_replaced(
        model_dir: Path, tmp_path: Path) -> None:
    paper = HistoPipe(3, groups=2, placement="per-worker")
    before, _ = InProcessFleet(_job(model_dir, 3), tmp_path / "per-worker", scheduler=paper).round(PROMPTS)
    f = InProcessFleet(_job(model_dir, 3), tmp_path / "shared")
    after, rnd = f.round(PROMPTS)
    assert isinstance(f.fleet.sched, HistoPipe) and f.fleet.sched.placement == "shared"
    assert after == before and len(after) == 24 and len(rnd.workers) == 3


def test_reallocation_hears_every_event_and_rebalances_samples_with_their_tokens(
        model_dir: Path, tmp_path: Path) -> None:
    one, _ = InProcessFleet(_job(model_dir), tmp_path / "one").round(PROMPTS)
    sched = Reallocate(3, threshold=2, cooldown_s=0.0)
    got, rnd = InProcessFleet(_job(model_dir, 3, "realloc"), tmp_path / "three", scheduler=sched).round(PROMPTS)
    assert got == one
    assert sched.stats.rebalanced == rnd.counts["migrated"] > 0
    assert sched.stats.finished == 24


def _after(n: int, before: int, then: int) -> Callable[[], int]:
    """`before` workers wanted for the first n questions, `then` from there on (forces a change at a
    point of the round, counted in the fleet's own steps, not in time)."""
    asked = itertools.count()
    return lambda: before if next(asked) < n else then


def test_a_worker_asked_to_leave_mid_round_hands_its_samples_back_with_their_tokens(
        model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one, _ = InProcessFleet(_job(model_dir, length=40), tmp_path / "one").round(PROMPTS)
    job = _job(model_dir, 3, length=40)
    pods = iter([2, 1, 0])  # the workers joining in turn run on these rollout pods (their host names)
    monkeypatch.setattr(RolloutWorker, "host", lambda self: f"{job.metadata.name}-rollout-{next(pods)}")
    f = InProcessFleet(job, tmp_path / "three", wanted=_after(30, 3, 1))
    got, rnd = f.round(PROMPTS)
    assert got == one
    assert rnd.counts["handed_back"] > 0 and f.fleet.sched.stats.evacuated > 0
    assert f.fleet.live_count() == 1 and len(f.fleet.members) == 1
    assert "rollout workers: 1 of 1 wanted" in f.notes
    # the workers on the highest ordinals left (the pods a StatefulSet removes), whatever work they held
    assert [(m.id, m.pod) for m in f.fleet.members] == [(2, 0)]
    assert f.in_use == [3, 2, 1]  # reported as each one went: the operator lowers the count at 1


def test_a_rollout_pods_ordinal_comes_from_its_host_name() -> None:
    assert pod_ordinal("alpha-rollout-12", "alpha") == 12
    assert pod_ordinal("alpha-train-1", "alpha") is None
    assert pod_ordinal("alpha-rollout-1", "alph") is None  # another job's pod
    assert pod_ordinal("build-vm", "alpha") is None  # a worker on this machine


def test_a_worker_that_joins_mid_round_takes_started_samples_at_once(model_dir: Path, tmp_path: Path) -> None:
    one, _ = InProcessFleet(_job(model_dir, length=40), tmp_path / "one").round(PROMPTS)
    # every sample runs at once on the first worker: what the newcomer takes has tokens; a pass is
    # priced in proportion to its batch, so splitting the batch pays (not this machine's measured costs)
    f = InProcessFleet(_job(model_dir, 1, length=40, batch=32), tmp_path / "grow", wanted=_after(20, 1, 2))
    f.fleet.sched.profile = TableProfile(batch_sizes=(1, 64), context_lens=(0, 100_000),
                                         seconds=((0.01, 0.01), (0.64, 0.64)), prefill_seconds_per_token=0.0,
                                         max_batch=64)
    got, rnd = f.round(PROMPTS)
    assert got == one
    assert rnd.counts["stolen"] > 0 and len(rnd.workers) == 2
    busy = {call.member.id: summary.resumed_tokens for call, summary in rnd.summaries}
    assert busy[max(busy)] > 0  # the newcomer went on from tokens the first worker had made


def test_rounds_are_numbered_on_from_the_rounds_before(model_dir: Path, tmp_path: Path) -> None:
    f = InProcessFleet(_job(model_dir, 2), tmp_path / "run")
    f.fleet.start(0, f.t.get(f.t.call(f.train, TrainAPI.weights)), f.fleet.history, rounds_before=7)  # resumed: 7 rounds before
    f.round(PROMPTS[:3])
    f.round(PROMPTS[3:])
    assert sorted(f.fleet.sched.stats.rankings) == [8, 9]


def test_the_scheduler_prices_decode_with_the_engines_measured_one_token_passes() -> None:
    cost = CostProfile((1, 16), (1, 33), ((0.001, 0.0033), (0.004, 0.05)))
    prof = table_profile(cost, max_batch=16)
    assert prof.iteration_time(1, 10) == pytest.approx(0.001)
    assert prof.iteration_time(16, 5000) == pytest.approx(0.004)
    assert prof.prefill_time(33) == pytest.approx(0.0033)
    assert prof.max_batch == 16


class DeferAtFiveTokens(MoveAtFiveTokens):
    """The same watches, but every watched sample is deferred to the next round with its tokens."""

    def _progress(self, st: SampleState, worker: int, generated: int, now: float) -> list[Action]:
        move = self._emit(Move(st.sample.sid, worker, None, generated))
        self.moves.append(move)
        return [move]


def test_a_sample_deferred_to_the_next_round_goes_on_there_with_the_weights_it_began_with(
        model_dir: Path, tmp_path: Path) -> None:
    first, second = PROMPTS[:3], PROMPTS[3:]
    reference = InProcessFleet(_job(model_dir), tmp_path / "one")
    old_tokens, _ = reference.round(first)
    sched = DeferAtFiveTokens()
    f = InProcessFleet(_job(model_dir, 2), tmp_path / "two", scheduler=sched)
    rnd1 = f.fleet.launch([(1, p) for p in first], step=1, inter_step=True)
    done1 = {s.sample: tuple(s.result.response_ids) for _, scored in f.fleet.collect(rnd1) for s in f.t.get(scored)}
    deferred = {f.fleet.book.key(m.sid) for m in sched.moves} - set(done1)
    assert deferred and rnd1.counts["deferred"] == len(deferred) == sched.stats.inter_step
    # new weights before the next round: the deferred samples must not use them
    weights = {k: v + 0.5 for k, v in f.t.get(f.t.call(f.train, TrainAPI.weights)).items()}
    f.fleet.publish(1, weights)
    rnd2 = f.fleet.launch([(1, p) for p in second], step=2, inter_step=False)
    summaries = f.fleet.collect(rnd2)
    done2 = {s.sample: tuple(s.result.response_ids) for _, scored in summaries for s in f.t.get(scored)}
    versions = {s.sample: summary.policy_version for summary, _ in summaries for s in summary.samples}
    assert deferred <= done2.keys()
    assert {versions[s] for s in deferred} == {0} and {v for s, v in versions.items() if s not in deferred} == {1}
    assert {s: done2[s] for s in deferred} == {s: old_tokens[(s.prompt_id, s.index)] for s in deferred}
    assert sum(sc.resumed_tokens for _, sc in rnd2.summaries) >= 5 * len(deferred)


def test_a_resumed_fleet_starts_each_group_with_the_policy_version_it_is_given(model_dir: Path, tmp_path: Path) -> None:
    reference = InProcessFleet(_job(model_dir), tmp_path / "one")
    old_tokens, _ = reference.round(PROMPTS[:2])
    f = InProcessFleet(_job(model_dir, 2), tmp_path / "two")
    old = f.t.get(f.t.call(f.train, TrainAPI.weights))
    f.fleet.start(5, {k: v + 0.5 for k, v in old.items()}, f.fleet.history, older={4: old})  # a checkpoint of version 5, 4 in flight
    rnd = f.fleet.launch([(1, p) for p in PROMPTS[:3]], step=6, inter_step=False,
                         versions={(1, p): 4 for p in PROMPTS[:2]})
    summaries = f.fleet.collect(rnd)
    versions = {s.sample.prompt_id: summary.policy_version for summary, _ in summaries for s in summary.samples}
    tokens = {(s.sample.prompt_id, s.sample.index): tuple(s.result.response_ids) for _, sc in summaries
              for s in f.t.get(sc)}
    assert versions == {PROMPTS[0]: 4, PROMPTS[1]: 4, PROMPTS[2]: 5}
    assert {k: v for k, v in tokens.items() if k[0] != PROMPTS[2]} == old_tokens
    f.fleet.publish(6, old)
    assert set(f.fleet.weights) == {6}  # nothing in use holds 4 or 5 any more


def test_siblings_on_other_workers_reach_each_others_group_and_the_tokens_stay_one_workers(
        model_dir: Path, tmp_path: Path) -> None:
    one, _ = InProcessFleet(_job(model_dir, length=40), tmp_path / "one").round(PROMPTS)
    f = InProcessFleet(_job(model_dir, 2, length=40), tmp_path / "two")  # the shared queue deals each group over both
    relayed: list[tuple[int, list[GrownTokens]]] = []
    tell = f.t.tell

    def spy(handle: object, method: object, *args: object) -> None:
        if method is RolloutAPI.hear:
            call_id, blocks = args
            assert isinstance(call_id, int) and isinstance(blocks, list)
            relayed.append((call_id, blocks))
        tell(handle, method, *args)

    f.t.tell = spy  # type: ignore[method-assign]
    got, rnd = f.round(PROMPTS)
    assert got == one
    calls = {c.id: c for c in rnd.calls}
    assert relayed and {call_id for call_id, _ in relayed} == set(calls)  # both calls heard the other
    for call_id, blocks in relayed:
        own = {(s.epoch, s.prompt_id) for s in calls[call_id].samples}
        mine = {sample_key(s.prompt_id, s.epoch, s.index) for s in calls[call_id].samples}
        # a block of another call's samples, sharing a group with this one
        assert all(b.groups & own and mine.isdisjoint(b.sample_ids.tolist()) for b in blocks)
    # every token a worker heard is one its sibling generated elsewhere, each once
    heard = [m.handle.obj.metrics.registry.get_sample_value("rhymerl_rollout_group_tokens_heard_total")
             for m in f.fleet.members]
    assert all(n is not None and n > 0 for n in heard)
    assert sum(n or 0 for n in heard) <= sum(len(t) for t in got.values())


def test_with_the_relay_off_each_workers_groups_hold_only_its_own_samples(model_dir: Path, tmp_path: Path) -> None:
    f = InProcessFleet(_job(model_dir, 2, length=40, rollout={"speculation": {"group_relay": False}}), tmp_path / "two")
    told: list[object] = []
    tell = f.t.tell
    f.t.tell = lambda handle, method, *args: (told.append(method), tell(handle, method, *args))[1]  # type: ignore[method-assign]
    _, rnd = f.round(PROMPTS)
    assert len(rnd.workers) == 2 and RolloutAPI.hear not in told
    assert all(not m.handle.obj.metrics.registry.get_sample_value("rhymerl_rollout_group_tokens_heard_total")
               for m in f.fleet.members)
