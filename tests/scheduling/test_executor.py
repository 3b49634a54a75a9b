"""The one executor of scheduler actions, on a toy fleet: what each action means."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.executor import carry_out, rebalance_choice, steal
from rhymerl.algorithms.scheduling.types import Action, Move, Rebalance, SampleId, Watch


class ToyFleet:
    """Workers as lists: `queues[w]` waiting (in order), `runs[w]` running; `tokens[sid]` generated."""

    def __init__(self, queues: list[list[int]], runs: list[list[int]], tokens: dict[int, int]) -> None:
        self.queues, self.runs, self.tokens = queues, runs, tokens
        self.watched: list[tuple[int, int]] = []

    def where(self, sid: SampleId) -> int:
        return next(w for w in range(len(self.queues)) if sid in self.queues[w] or sid in self.runs[w])

    def watch(self, sid: SampleId, tokens: int) -> None:
        self.watched.append((sid, tokens))

    def move(self, sid: SampleId, src: int | None, dst: int | None, generated: int | None, recompute: bool) -> Move:
        origin = self.where(sid)
        assert src is None or (src == origin and generated in (None, self.tokens[sid]))
        (self.queues[origin] if sid in self.queues[origin] else self.runs[origin]).remove(sid)
        assert dst is not None
        self.queues[dst].insert(0, sid)
        return Move(sid=sid, src=origin, dst=dst, generated=self.tokens[sid], recompute=recompute)

    def waiting(self, worker: int) -> Sequence[SampleId]:
        return self.queues[worker]

    def running(self, worker: int) -> Sequence[SampleId]:
        return self.runs[worker]

    def generated(self, sid: SampleId) -> int:
        return self.tokens[sid]

    def unstarted(self, worker: int, step: int) -> Sequence[SampleId]:
        return [sid for sid in self.queues[worker] if self.tokens[sid] == 0]

    def hand_over(self, move: Move) -> None:
        self.queues[move.src].remove(move.sid)
        assert move.dst is not None
        self.queues[move.dst].append(move.sid)


class Recorder:
    """Stands in for a scheduler: records what the executor reports, steals everything offered."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.moved: list[Move] = []

    def on_moved(self, moves: Sequence[Move]) -> None:
        self.moved += moves

    def on_idle(self, worker: int, step: int, waiting: Mapping[int, Sequence[SampleId]]) -> list[Move]:
        return [Move(sid=sid, src=src, dst=worker, generated=0) for src, sids in sorted(waiting.items()) for sid in sids]


def test_a_rebalance_takes_the_last_queued_then_the_running_with_fewest_tokens() -> None:
    fleet = ToyFleet([[1, 2, 3], []], [[4, 5, 6], []], {1: 0, 2: 0, 3: 0, 4: 9, 5: 2, 6: 2})
    assert rebalance_choice(cast(Any, fleet), Rebalance(src=0, dst=1, count=2)) == [3, 2]
    assert rebalance_choice(cast(Any, fleet), Rebalance(src=0, dst=1, count=5)) == [3, 2, 1, 5, 6]


def test_actions_are_carried_out_in_order_and_rebalanced_moves_reported() -> None:
    fleet = ToyFleet([[1], [2]], [[3], []], {1: 0, 2: 0, 3: 4})
    sched = Recorder(2)
    actions: list[Action] = [Watch(sid=3, tokens=10), Move(sid=3, src=0, dst=1, generated=4),
                             Rebalance(src=1, dst=0, count=1)]
    carry_out(cast(Scheduler, sched), cast(Any, fleet), actions)
    assert fleet.watched == [(3, 10)]
    assert [(m.sid, m.src, m.dst) for m in sched.moved] == [(2, 1, 0)]  # 3 went to the front of 1's queue
    assert fleet.queues == [[2, 1], [3]]


def test_stealing_offers_only_unstarted_samples_of_other_workers() -> None:
    fleet = ToyFleet([[1, 2], [3], []], [[4], [], []], {1: 0, 2: 5, 3: 0, 4: 7})
    moves = steal(cast(Scheduler, Recorder(3)), cast(Any, fleet), idle=2, step=1)
    assert [(m.sid, m.src) for m in moves] == [(1, 0), (3, 1)]
    assert fleet.queues == [[2], [], [1, 3]]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(1, 4)), max_size=20))
def test_every_sample_stays_on_exactly_one_worker(rebalances: list[tuple[int, int, int]]) -> None:
    fleet = ToyFleet([[0, 1, 2], [3], []], [[4, 5], [6], [7]], {i: i % 3 for i in range(8)})
    sched = Recorder(3)
    for src, dst, count in rebalances:
        if src != dst:
            carry_out(cast(Scheduler, sched), cast(Any, fleet), [Rebalance(src=src, dst=dst, count=count)])
    placed = sorted(sid for w in range(3) for sid in fleet.queues[w] + fleet.runs[w])
    assert placed == list(range(8))
