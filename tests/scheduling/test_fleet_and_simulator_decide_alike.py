"""The rollout fleet and the simulator take their decisions once (issue 43): the same round, driven
through the fleet on workers in this process and through the simulator on a trace of the lengths the
fleet's workers generated, makes the same decisions in the same order. Each is recorded where the
two drivers call the one shared code: the freed-drafter decision at both call sites, the executor's
consolidations, and the scheduler's answers to an idle worker (steals) and to a leaving one."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from in_process_fleet import InProcessFleet

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.costmodel import IterationProfile, TableProfile
from rhymerl.algorithms.scheduling.executor import Executor
from rhymerl.algorithms.scheduling.freed_drafters import DraftCosts, DrafterPlan, decide
from rhymerl.algorithms.scheduling.types import Move, RoundPlan, Sample, SampleId
from rhymerl.api import RLJob, parse_job
from rhymerl.tools.sim import SimConfig, Simulator
from rhymerl.tools.sim import drafters as sim_drafters
from rhymerl.tools.traces import Trace
from rhymerl.workers.controller import fleet_drafters
from rhymerl.workers.controller.fleet_drafters import forced_costs

PROMPTS = [f"ac-0-{i:05d}" for i in range(6)]
GROUP = 4
LENGTH = 40
BATCH = 8

Decision = tuple[str, tuple[tuple[int, ...], ...]]
"""A kind of decision and what it decided: pairs (drafter, verifier), or moves (sample, source, destination)."""


def _job(model_dir: Path, workers: int, speculation: str = "") -> RLJob:
    return parse_job(f"""
apiVersion: rhymerl.io/v1alpha1
kind: RLJob
spec:
  model: {{path: {model_dir}}}
  data: {{num_prompts: 6, min_ops: 1, median_ops: 2, max_ops: 3}}
  algorithm: {{group_size: {GROUP}, prompts_per_step: 3, max_response_length: {LENGTH}, epochs: 2, lr: 0.01,
              max_off_policy_steps: 0}}
  rollout: {{replicas: {workers}, max_replicas: 4, max_batch_size: {BATCH}{speculation}}}
""")


class Placed(Scheduler):
    """Each worker's share of the round by the samples' places in it; an idle worker steals every
    sample not started yet (a rule whose answer only shrinks as the round goes on, so that asking
    after every report, as the fleet does, and once when a worker runs dry, as the simulator does,
    is the same decision)."""

    name = "placed"

    def __init__(self, queues: list[list[int]], steals: bool = False) -> None:
        super().__init__(len(queues))
        self.queues = queues
        self.steals = steals

    def _plan(self, step: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        return RoundPlan(round_no=step, queues=[[samples[i].sid for i in q] for q in self.queues])

    def _steal(self, worker: int, round_no: int,
               unfinished: Mapping[int, Sequence[tuple[SampleId, int]]]) -> list[Move]:
        return [Move(sid=sid, src=src, dst=worker, generated=0) for src, held in sorted(unfinished.items())
                for sid, tokens in held if tokens == 0 and self.steals]


class Decisions:
    """What one driver decided, in order: the freed-drafter pairs each time they change, each merge
    and each steal or evacuation the executor asked for (a sample by its id, the same in both drivers:
    its place in the round)."""

    def __init__(self) -> None:
        self.log: list[Decision] = []
        self.pairs: dict[int, int] = {}
        self.priced: tuple[IterationProfile, DraftCosts] | None = None

    def decide(self, shared: Callable[..., DrafterPlan]) -> Callable[..., DrafterPlan]:
        """The shared decision, recording what it answers (and the prices it was asked on)."""
        def recorded(*args: Any, **kwargs: Any) -> DrafterPlan:
            plan = shared(*args, **kwargs)
            self.priced = (args[3], args[4])
            if plan.pairs != self.pairs:
                self.pairs = plan.pairs
                self.log.append(("pairs", tuple(sorted(plan.pairs.items()))))
            return plan
        return recorded

    def moves(self, kind: str, moves: Sequence[Move], tokens: bool = False) -> None:
        """Moves by sample, source and destination (`tokens`: and the tokens they carry)."""
        if moves:
            assert all(m.dst is not None for m in moves)  # nothing here is deferred to a later round
            self.log.append((kind, tuple(sorted((m.sid, m.src, m.dst or 0, *((m.generated,) if tokens else ()))
                                                for m in moves))))


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> Callable[[], Decisions]:
    """Start recording a driver's decisions at the shared code both call (returns the new record)."""
    current: list[Decisions] = [Decisions()]  # before `start`: kept nowhere
    consolidate, on_idle, on_leave = Executor.consolidate, Scheduler.on_idle, Scheduler.on_leave

    def consolidated(self: Executor, moves: Sequence[Move]) -> None:
        current[-1].moves("merge", moves)  # not their tokens: the fleet merges once the calls reported
        consolidate(self, moves)

    def stolen(self: Scheduler, *args: Any) -> list[Move]:
        moves = on_idle(self, *args)
        current[-1].moves("steal", moves)
        return moves

    def evacuated(self: Scheduler, *args: Any) -> list[Move]:
        moves = on_leave(self, *args)
        current[-1].moves("evacuate", moves, tokens=True)
        return moves

    monkeypatch.setattr(Executor, "consolidate", consolidated)
    monkeypatch.setattr(Scheduler, "on_idle", stolen)
    monkeypatch.setattr(Scheduler, "on_leave", evacuated)

    def start() -> Decisions:
        current.append(Decisions())
        monkeypatch.setattr(fleet_drafters, "decide", current[-1].decide(decide))
        monkeypatch.setattr(sim_drafters, "decide", current[-1].decide(decide))
        return current[-1]

    return start


def fleet_lengths(fleet: InProcessFleet) -> list[int]:
    """One round of PROMPTS: each response's length, in the round's order (its samples' ids)."""
    out, _ = fleet.round(PROMPTS)
    return [len(out[(p, k)]) for p in PROMPTS for k in range(GROUP)]


def _trace(fleet: InProcessFleet, lengths: list[int]) -> Trace:
    """The round as a one-step trace: the fleet's prompts and the lengths its workers generated."""
    pids = [p for p in PROMPTS for _ in range(GROUP)]
    return Trace.build("fleet round", [1] * len(pids), pids, [len(fleet.encoded[p]) for p in pids], lengths)


def _by_length(model_dir: Path, path: Path) -> tuple[list[int], list[int]]:
    """Every response's length (position-keyed sampling: the same on any worker, at any batch), and the
    samples from the shortest response to the longest."""
    lengths = fleet_lengths(InProcessFleet(_job(model_dir, 1), path, scheduler=Placed([list(range(len(PROMPTS) * GROUP))])))
    return lengths, sorted(range(len(lengths)), key=lambda i: (lengths[i], i))


class LeaveAt:
    """The simulator's fleet hooks: worker `slot` leaves at `t`, its samples keeping their tokens."""

    def __init__(self, sim: Simulator, slot: int, t: float) -> None:
        self.slot = slot
        sim.hooks = self
        sim.fleet_event(t, 0)

    def on_fleet_event(self, sim: Simulator, arg: int) -> None:
        sim.leave(self.slot, keep_tokens=True)

    def between_steps(self, sim: Simulator, trained: int) -> None:
        pass


def test_freed_workers_pairs_and_merges_are_the_same_in_the_fleet_and_the_simulator(
        model_dir: Path, tmp_path: Path, record: Callable[[], Decisions]) -> None:
    lengths, order = _by_length(model_dir, tmp_path / "one")
    # workers 0 and 1 run a few short samples, no queue; 2 runs the rest, more than its batch: it queues
    queues = [order[3:6], [order[2], order[6]], order[:2] + order[7:]]
    job = _job(model_dir, 3, f", speculation: {{method: none, freed_drafters: true, draft_model: {model_dir}}}")
    fleet = InProcessFleet(job, tmp_path / "three", scheduler=Placed(queues))
    drafters = fleet.fleet.drafters
    drafters.costs = lambda: forced_costs(job, drafters.consolidates)  # drafting and every merge that fits pay
    in_fleet = record()
    assert fleet_lengths(fleet) == lengths
    assert in_fleet.priced is not None
    in_sim = record()
    profile, costs = in_fleet.priced  # the prices the fleet's decisions were taken on
    sim = Simulator(_trace(fleet, lengths), Placed(queues), SimConfig(workers=3, profile=profile, freed_drafters=costs))
    sim.run()
    assert in_sim.log == in_fleet.log == [
        # at the start 0 and 1 are stragglers (no queue) with nobody freed: 0 is emptied onto 1 and drafts for it
        ("merge", tuple((sid, 0, 1) for sid in sorted(queues[0]))),
        ("pairs", ((0, 1),)),
        ("pairs", ()),  # 1 ran dry; 2 still queues, so it is no verifier
        ("pairs", ((0, 2),)),  # 2's queue emptied: the lowest freed worker drafts for it
        ("pairs", ()),
    ]


def test_steals_and_a_leaving_workers_samples_go_the_same_way_in_the_fleet_and_the_simulator(
        model_dir: Path, tmp_path: Path, record: Callable[[], Decisions]) -> None:
    lengths, order = _by_length(model_dir, tmp_path / "one")
    # 0 runs the longest, more than its batch; 1 runs dry first and steals 0's queue; 2 leaves mid-round
    queues = [order[-8:] + order[4:-11], order[:4], order[-11:-8]]
    asked = itertools.count()
    fleet = InProcessFleet(_job(model_dir, 3), tmp_path / "three", scheduler=Placed(queues, steals=True),
                           wanted=lambda: 3 if next(asked) < 40 else 2)
    in_fleet = record()
    assert fleet_lengths(fleet) == lengths
    (evacuated,) = [d[1] for d in in_fleet.log if d[0] == "evacuate"]
    tokens = {m[3] for m in evacuated}
    assert len(tokens) == 1  # 2's samples all ran from the start: they had as many tokens when it left
    in_sim = record()
    sim = Simulator(_trace(fleet, lengths), Placed(queues, steals=True),
                    SimConfig(workers=3, profile=TableProfile.constant(max_batch=BATCH)))
    LeaveAt(sim, 2, float(tokens.pop()))  # when its samples had as many tokens as in the fleet
    sim.run()
    assert in_sim.log == in_fleet.log
    assert in_fleet.log == [("steal", tuple((sid, 0, 1) for sid in sorted(queues[0][BATCH:]))), ("evacuate", evacuated)]
    # the longest-running first to the worker with the least left of the round: 0 (8 running), then 0 again
    # (a tie with 1, which stole 9), then 1
    assert [dst for _, _, dst, _ in evacuated] == [0, 0, 1]
