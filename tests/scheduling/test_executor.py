"""The one executor of scheduler actions, on a toy fleet that answers moves later (as a worker
reached over the network does): what each action means, and books that stay right whatever
the fleet answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.scheduling import HistoPipe, Sample, SchedulingError
from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.executor import Executor, rebalance_choice
from rhymerl.algorithms.scheduling.types import (
    Action,
    Move,
    MoveReason,
    Rebalance,
    RoundPlan,
    SampleId,
    Watch,
)


class ToyFleet:
    """Workers as lists: `queues[w]` waiting (in order), `runs[w]` running; `tokens[sid]` generated.
    Moves wait in `asked` until the test answers them (`answer`)."""

    def __init__(self, queues: list[list[int]], runs: list[list[int]], tokens: dict[int, int]) -> None:
        self.queues, self.runs, self.tokens = queues, runs, tokens
        self.watched: list[tuple[int, int]] = []
        self.asked: list[Move] = []
        self.executor: Executor | None = None

    def where(self, sid: SampleId) -> int:
        return next(w for w in range(len(self.queues)) if sid in self.queues[w] or sid in self.runs[w])

    def watch(self, sid: SampleId, tokens: int) -> None:
        self.watched.append((sid, tokens))

    def request(self, move: Move) -> None:
        self.asked.append(move)

    def unfinished(self, worker: int, step: int) -> Sequence[tuple[SampleId, int]]:
        return [(sid, self.tokens[sid]) for sid in self.queues[worker] + self.runs[worker]]

    def answer(self, ok: bool) -> Move:
        """Carry out (or refuse) the oldest request."""
        assert self.executor is not None
        move = self.asked.pop(0)
        if not ok:
            self.executor.refused(move.sid)
            return move
        origin = self.where(move.sid)
        assert origin == move.src
        (self.queues[origin] if move.sid in self.queues[origin] else self.runs[origin]).remove(move.sid)
        assert move.dst is not None
        self.queues[move.dst].insert(0, move.sid)
        done = Move(sid=move.sid, src=origin, dst=move.dst, generated=self.tokens[move.sid], recompute=move.recompute)
        self.executor.confirmed(done)
        return done


class Recorder(Scheduler):
    """A scheduler that records what the executor reports and steals everything offered."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.moved: list[tuple[Move, MoveReason]] = []
        self.failed: list[Move] = []

    def on_moved(self, moves: Sequence[Move], reason: MoveReason = "rebalance") -> None:
        self.moved += [(m, reason) for m in moves]

    def on_move_failed(self, m: Move) -> None:
        self.failed.append(m)

    def on_sample_finished(self, sid: SampleId, worker: int, output_len: int, now: float) -> list[Action]:
        return []

    def on_idle(self, worker: int, step: int, unfinished: Mapping[int, Sequence[tuple[SampleId, int]]]) -> list[Move]:
        return [Move(sid=sid, src=src, dst=worker, generated=g) for src, ss in sorted(unfinished.items()) for sid, g in ss]


def _wire(fleet: ToyFleet, sched: Scheduler) -> Executor:
    fleet.executor = Executor(sched, fleet)
    return fleet.executor


def test_a_rebalance_takes_the_last_queued_then_the_started_with_fewest_tokens() -> None:
    offered = [(1, 0), (2, 0), (3, 0), (4, 9), (5, 2), (6, 2)]
    assert [s for s, _ in rebalance_choice(offered, 2)] == [3, 2]
    assert [s for s, _ in rebalance_choice(offered, 5)] == [3, 2, 1, 5, 6]


def test_actions_are_requested_in_order_and_a_rebalance_is_booked_only_once_confirmed() -> None:
    fleet = ToyFleet([[1], [2]], [[3], []], {1: 0, 2: 0, 3: 4})
    sched = Recorder(2)
    ex = _wire(fleet, sched)
    actions: list[Action] = [Watch(sid=3, tokens=10), Move(sid=3, src=0, dst=1, generated=4),
                             Rebalance(src=1, dst=0, count=1, round_no=1)]
    ex.carry_out(actions)
    assert fleet.watched == [(3, 10)]
    assert [(m.sid, m.src, m.dst) for m in fleet.asked] == [(3, 0, 1), (2, 1, 0)]
    assert sched.moved == []  # nothing is booked before the fleet answers
    fleet.answer(True)
    fleet.answer(True)
    assert [(m.sid, m.src, m.dst, reason) for m, reason in sched.moved] == [(2, 1, 0, "rebalance")]  # 3 was decided
    assert fleet.queues == [[2, 1], [3]]
    assert ex.done == {"migrate": 1, "rebalance": 1} and ex.tokens_moved == 4 and not ex.in_flight


def test_a_refused_migration_is_undone_in_the_schedulers_books_and_a_refused_steal_is_forgotten() -> None:
    fleet = ToyFleet([[], [], []], [[1, 2], [], []], {1: 3, 2: 5})
    sched = Recorder(3)
    ex = _wire(fleet, sched)
    ex.carry_out([Move(sid=1, src=0, dst=1, generated=3)])
    ex.steal(2, round_no=1)  # 1 is in flight: only 2 is offered
    assert [(m.sid, m.dst) for m in fleet.asked] == [(1, 1), (2, 2)]
    ex.finished(1, 0, 9, now=0.0)  # it finished before its worker handed it over: refused first
    assert [m.sid for m in sched.failed] == [1]
    fleet.asked.pop(0)
    fleet.answer(False)
    assert sched.moved == [] and not ex.in_flight and ex.done == {}


def test_a_second_move_of_a_sample_in_flight_is_refused_at_once() -> None:
    fleet = ToyFleet([[], []], [[1], []], {1: 3})
    sched = Recorder(2)
    ex = _wire(fleet, sched)
    ex.steal(1, round_no=1)
    ex.carry_out([Move(sid=1, src=0, dst=1, generated=3)])
    assert len(fleet.asked) == 1 and [m.sid for m in sched.failed] == [1]
    ex.progressed(1, 0, 3, now=0.0)  # a watch report while in flight waits (no error, nothing asked)


def test_a_leaving_workers_samples_go_to_the_least_loaded_live_workers_longest_first() -> None:
    sched = HistoPipe(3, placement="per-worker", groups=1, two_tier=False)
    plan = sched.plan_round(1, [Sample(i, "p", 4) for i in range(6)])
    fleet = ToyFleet([list(q) for q in plan.queues], [[], [], []], dict.fromkeys(range(6), 0))
    ex = _wire(fleet, sched)
    gone = 0
    leaving = [(sid, 10 * k) for k, sid in enumerate(plan.queues[gone])]
    assert ex.evacuate(gone, 1, leaving, live=[1, 2]) == len(leaving)
    while fleet.asked:
        fleet.answer(True)
    assert sched.outstanding(gone, 1) == 0
    assert sched.outstanding(1, 1) + sched.outstanding(2, 1) == 6
    assert abs(sched.outstanding(1, 1) - sched.outstanding(2, 1)) <= 1
    assert sched.stats.evacuated == len(leaving)
    assert ex.evacuate(1, 1, [(0, 0)], live=[]) == 0  # nobody to take it: the fleet keeps it


def _placed(fleet: ToyFleet) -> list[int]:
    return sorted(sid for w in range(len(fleet.queues)) for sid in fleet.queues[w] + fleet.runs[w])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(1, 4), st.booleans()), max_size=20))
def test_every_sample_stays_on_exactly_one_worker_and_the_books_agree_whatever_the_fleet_answers(
        rebalances: list[tuple[int, int, int, bool]]) -> None:
    sched = HistoPipe(3, placement="per-worker", groups=1, two_tier=False)
    plan: RoundPlan = sched.plan_round(1, [Sample(i, "p", 4) for i in range(8)])
    fleet = ToyFleet([list(q) for q in plan.queues], [[], [], []], {i: i % 3 for i in range(8)})
    ex = _wire(fleet, sched)
    for src, dst, count, ok in rebalances:
        if src != dst:
            ex.carry_out([Rebalance(src=src, dst=dst, count=count, round_no=1)])
        if fleet.asked:
            fleet.answer(ok)
    while fleet.asked:
        fleet.answer(True)
    assert _placed(fleet) == list(range(8))
    for w in range(3):  # the scheduler's books say where each sample is
        assert sched.outstanding(w, 1) == len(fleet.queues[w]) + len(fleet.runs[w])


def test_a_joining_worker_gets_an_index_and_the_fleet_shrinks_only_where_nothing_is_left() -> None:
    sched = HistoPipe(2, placement="per-worker", groups=1, two_tier=False)
    sched.plan_round(1, [Sample(i, "p", 4) for i in range(4)])
    assert sched.add_worker() == 2 and sched.workers == 3
    sched.set_workers(2)  # index 2 holds nothing
    try:
        sched.set_workers(1)
    except SchedulingError as exc:
        assert "still hold unfinished samples" in str(exc)
    else:
        raise AssertionError("shrank over a worker with samples")
