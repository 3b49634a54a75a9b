"""Freed drafters on a rollout fleet (rollout/remote_drafts.py): after each event the fleet's
workers as the decision sees them (scheduling/freed_drafters.py `decide`), each verifier's running
call told its drafter's link (or that it has none any more), and a straggling worker emptied onto
another, through the executor, where the decision merges them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.costmodel import IterationProfile, TableProfile
from rhymerl.algorithms.scheduling.executor import Executor
from rhymerl.algorithms.scheduling.freed_drafters import (
    DraftCosts,
    DrafterPlan,
    ScaledProfile,
    WorkerView,
    decide,
)
from rhymerl.algorithms.scheduling.types import Move
from rhymerl.api import RLJob
from rhymerl.workers import faults
from rhymerl.workers.controller.fleet_members import Membership
from rhymerl.workers.controller.fleet_records import Book, Call, Calls, Member, Round
from rhymerl.workers.controller.role_apis import RolloutAPI
from rhymerl.workers.controller.transport import Transport

DRAFT_STEP_COST = 0.5
"""A draft-model step over a policy pass at the same batch, as the freed-drafter decision prices it: the
shipped tiny-arith-draft measured 0.51-0.54 on the 2-core CPU (benchmarks/draft-model); on a GPU a
model 10x smaller costs less, so this errs toward not drafting."""

Decide = Callable[[Sequence[WorkerView], Sequence[int], Mapping[int, int], bool], DrafterPlan]
"""The decision from the workers' views, the freed ones, the pairs in force and whether a merge may start."""


class FreedDrafters:
    """Pairs freed workers with straggling ones, and empties a straggler to draft where it pays."""

    def __init__(self, job: RLJob, transport: Transport, book: Book, calls: Calls, members: Membership,
                 sched: Scheduler, executor: Executor, note: Callable[[str], None], pairs: bool,
                 moves: bool) -> None:
        """pairs: the job has freed drafters and its engine verifies and serves remote drafts; moves:
        its calls hand samples over and take them in (a merge moves them: torch, not vLLM)."""
        self.job, self.transport, self.book, self.calls, self.members = job, transport, book, calls, members
        self.sched, self.executor, self.note = sched, executor, note
        self.enabled = pairs
        self.consolidates = pairs and moves and job.spec.rollout.speculation.consolidate_tail
        self.drafting: dict[int, tuple[int, int]] = {}  # drafter's member id -> (verifier's member id, its call id)
        self.emptied: dict[int, int] = {}
        """Member id of a worker whose samples are moving away -> the one it is to draft for once freed."""
        self.decide: Decide = self._priced
        """The decision (a seam: tests force pairs, or watch the merges)."""
        self.costs: Callable[[], tuple[IterationProfile, DraftCosts] | None] = self._draft_costs
        """What the decision prices (a seam: in-process tests price with `forced_costs`)."""

    def after_event(self, rnd: Round) -> None:
        """The pairs the decision makes from the round's calls, linked; a merge it asks for, begun."""
        if not self.enabled:
            return
        members = {m.id: m for m in self.members.staying() if m.slot >= 0}
        running: dict[int, Call] = {}
        views = []
        for m in members.values():
            calls = self.calls.active(m)
            if not calls:
                continue
            running[m.id] = calls[0]
            views.append(self._view(m, calls))
        freed = sorted(i for i in members if i not in running and i in rnd.workers)
        current = {**self.emptied, **{d: v for d, (v, _) in self.drafting.items()}}
        self.emptied = {d: v for d, v in self.emptied.items() if d in running and v in running}
        plan = self.decide(views, freed, current, self.consolidates and not self.book.moving() and not self.emptied)
        wanted = {d: v for d, v in plan.pairs.items() if d in members and d not in running and v in running}
        if plan.merge is not None:
            self._consolidate(rnd, members, running, plan.merge)
        self._link(rnd, members, running, wanted)

    def _link(self, rnd: Round, members: Mapping[int, Member], running: Mapping[int, Call],
              wanted: Mapping[int, int]) -> None:
        for d, (v, call_id) in list(self.drafting.items()):
            call = running.get(v)
            if wanted.get(d) != v or call is None or call.id != call_id:
                del self.drafting[d]
                if call is not None and call.id == call_id:
                    self.transport.tell(call.member.handle, RolloutAPI.draft_from, call_id, None)
        for d, v in wanted.items():
            if d not in self.drafting:
                call = running[v]
                self.drafting[d] = (v, call.id)
                link = self.transport.draft_link(members[d].handle, f"{v}:{call.id}:{d}")
                self.transport.tell(call.member.handle, RolloutAPI.draft_from, call.id, link)
                self.note(f"rollout worker {d} drafts for rollout worker {v} (step {rnd.step}; freed drafters)")
        rnd.drafting = max(rnd.drafting, len(self.drafting))

    def _consolidate(self, rnd: Round, members: Mapping[int, Member], running: Mapping[int, Call],
                     merge: tuple[int, int]) -> None:
        """Every unfinished sample of one straggling worker moves to another (through the executor,
        booked as rebalances; the samples keep their tokens), and the emptied worker, once its call
        has handed them over, drafts for the one it filled (SPECATOR §4.2's consolidation). Only a
        worker whose every running call is of this round, and has reported (a worker drops a
        release for a call it has not begun): emptied, it is freed."""
        src, dst = merge
        if src not in running or dst not in running or src == dst \
                or any(c.round is not rnd or not c.reported for c in self.calls.active(members[src])):
            return
        samples = self.book.unfinished(self.calls.holding(members[src].slot, rnd.no))
        if not samples:
            return
        self.emptied[src] = dst
        rnd.consolidations += 1
        self.note(f"rollout worker {src} hands its {len(samples)} samples to rollout worker {dst} and drafts for it "
                  f"(step {rnd.step}; freed drafters)")
        self.executor.consolidate([Move(sid=sid, src=members[src].slot, dst=members[dst].slot, generated=n,
                                        recompute=True) for sid, n in samples])

    def _view(self, m: Member, calls: list[Call]) -> WorkerView:
        """A worker as the drafter decision sees it: its unfinished samples (those beyond its batch
        queued), their mean context as last reported, and as its remaining work as many tokens again as
        its longest-running sample has made (work stealing's fallback, as the simulator predicts it)."""
        left = [(c, i) for c in calls for i, s in enumerate(c.samples) if not self.book.finished(c.id, s)]
        tokens = []
        for c, i in left:
            held = self.book.held(c.id).get(c.samples[i])
            tokens.append(self.book.tokens(c.id).get(c.samples[i], 0 if held is None else held.resumed))
        context = sum(len(c.requests[i].prompt_ids) for c, i in left) + sum(tokens)
        batch = self.job.spec.rollout.max_batch_size
        return WorkerView(m.id, min(len(left), batch), max(0, len(left) - batch), context / max(len(left), 1),
                          float(max([1, *tokens])))

    def _priced(self, views: Sequence[WorkerView], freed: Sequence[int], current: Mapping[int, int],
                may_merge: bool) -> DrafterPlan:
        """freed_drafters.decide on the costs of `_draft_costs` (no pairs before they are known)."""
        priced = self.costs()
        if priced is None:
            return DrafterPlan({}, None)
        return decide(views, freed, current, *priced, may_merge=may_merge)

    def _draft_costs(self) -> tuple[IterationProfile, DraftCosts] | None:
        """The pass times and drafting costs the drafter decisions price: the fleet's measured pass
        times (None before they are measured), the draft model's steps at DRAFT_STEP_COST of a policy
        pass; `forced_costs` where RHYMERL_FORCE names freed-drafters (faults.forced: a run's
        processes started by Ray or the pods harness, which no in-process seam reaches)."""
        if faults.forced("freed-drafters"):
            return forced_costs(self.job, self.consolidates)
        if self.sched.profile is None:
            return None
        return self.sched.profile, DraftCosts(draft_profile=ScaledProfile(self.sched.profile, DRAFT_STEP_COST),
                                              consolidate=self.consolidates)


def forced_costs(job: RLJob, consolidates: bool) -> tuple[IterationProfile, DraftCosts]:
    """Passes that cost the same whatever they verify and drafts that cost nothing and are almost
    always right: every straggling worker a freed one can serve pays, and so does every merge that
    fits one drafter (how tests force the real decisions to pair and merge)."""
    flat = TableProfile.constant(max_batch=job.spec.rollout.max_batch_size)
    return flat, DraftCosts(acceptance=0.99, message_s=0.0, draft_profile=ScaledProfile(flat, 0.0),
                            consolidate=consolidates)
