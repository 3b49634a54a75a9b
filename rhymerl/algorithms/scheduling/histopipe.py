"""HistoPipe (RhymeRL §6): history-ranked groups, alternating layout, two-tier sizing, migration.

plan: rank the step's prompts by last epoch's median length into K groups (tier 1), size each
group's worker share with the profiled cost model (tier 2), lay groups out ascending on odd
steps and descending on even steps, and balance each group's samples over its workers by
predicted length. Workers run in the `per-worker` pipeline: each starts the next step as soon
as its own sub-batch is done (within the off-policy bound), so one step's short work fills the
bubble left by the previous step's long work.

run: once a group is down to its tail, watch its samples; one that passes lambda times the
group's longest historical response migrates (intra-step for short groups, inter-step for long
ones), tokens preserved. A worker that finished its share of a step but may not start the next
(off-policy bound) takes waiting, unstarted samples of its step from a busy worker (`_steal`).

placement (the default, `shared`): the same ranking orders one queue that the workers pull from
across steps, within the same off-policy bound, instead of per-worker sub-batches: samples resumed
with their tokens first, then the predicted longest first (history), or the ranking groups' order
where there is none. A free slot takes the next sample of any step the bound releases, so a
step's tail no longer waits at a barrier of its own sub-batch; a running sample keeps the weights
it began with (no recompute when new weights land). Measured on every trace of `rhymerl bench
schedule` this beat the per-worker placement and `async` (docs/scheduling.md, "HistoPipe").
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Unpack

import numpy as np

from rhymerl.api.scheduling import MigrationSpec

from . import migration as mig
from .base import SampleState, Scheduler, SchedulerOptions
from .costmodel import group_decode_time
from .ranking import FirstEpoch, Ranking, equal_share, layout, rank_prompts, step_order
from .tiering import allocate
from .types import Action, Move, Pipeline, RoundPlan, Sample, SampleId, Watch

Placement = Literal["shared", "per-worker"]


@dataclass
class _Group:
    rank: int
    members: list[SampleId]
    workers: range
    size: int
    remaining: int
    max_hist: float | None
    threshold: int | None = None
    tail: bool = False
    predicted: float = 0.0


@dataclass
class _RoundGroups:
    groups: list[_Group] = field(default_factory=list)
    worker_group: dict[int, int] = field(default_factory=dict)


def lpt(weights: list[tuple[SampleId, float]], workers: list[int]) -> dict[int, list[SampleId]]:
    """Longest-processing-time-first: heaviest sample to the currently lightest worker."""
    out: dict[int, list[SampleId]] = {w: [] for w in workers}
    if not workers:
        return out
    heap = [(0.0, i, w) for i, w in enumerate(workers)]
    for sid, wt in sorted(weights, key=lambda x: -x[1]):
        load, i, w = heapq.heappop(heap)
        out[w].append(sid)
        heapq.heappush(heap, (load + wt, i, w))
    return out


def _by_prompt(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    """Samples by prompt id, prompts in order of first appearance."""
    by_prompt: dict[str, list[Sample]] = {}
    for s in samples:
        by_prompt.setdefault(s.prompt_id, []).append(s)
    return by_prompt


class HistoPipe(Scheduler):
    name = "histopipe"
    pipeline: Pipeline = "per-worker"
    needs_history = True

    def __init__(
        self,
        workers: int,
        *,
        groups: int = 8,
        two_tier: bool = True,
        first_epoch: FirstEpoch = "prompt-length",
        migration: MigrationSpec | None = None,
        work_stealing: bool = True,
        placement: Placement = "shared",
        spread_groups: bool = True,
        **kwargs: Unpack[SchedulerOptions],
    ) -> None:
        """placement: `shared`, one queue across steps in the ranking's order; `per-worker`, the
        paper's alternating per-worker sub-batches sized by tier 2. spread_groups: a shared queue
        without length history takes each prompt's first sample, then each one's second, ...
        (`_shared_order`)."""
        super().__init__(workers, **kwargs)
        if groups < 1:
            raise ValueError("groups: at least 1")
        if placement not in ("shared", "per-worker"):
            raise ValueError(f"placement: {placement!r}, expected shared or per-worker")
        self.placement = placement
        self.pipeline = "shared" if placement == "shared" else "per-worker"
        self.fills_batch = placement == "shared"
        self.groups = groups
        self.two_tier = two_tier
        self.first_epoch = first_epoch
        self.migration = migration if migration is not None else MigrationSpec()
        self.work_stealing = work_stealing
        self.spread_groups = spread_groups
        self._rounds: dict[int, _RoundGroups] = {}
        self._weight: dict[SampleId, float] = {}
        self._predicted: dict[SampleId, float] = {}  # predicted response lengths, where history gives one
        self.last_lambda = self.migration.min_lambda

    @property
    def label(self) -> str:
        parts = ["shared" if self.placement == "shared" else "2-tier" if self.two_tier else "1-tier"]
        if not self.migration.enabled:
            parts.append("no migration")
        if not self.work_stealing:
            parts.append("no stealing")
        return f"histopipe ({', '.join(parts)})"

    # ------------------------------------------------------------------ planning
    def _predicted_lengths(self, prompt_id: str, count: int, fallback: float) -> np.ndarray:
        hist = self.history.lengths(prompt_id)
        if hist is None:
            return np.full(count, fallback, dtype=np.float64)
        q = (np.arange(count, dtype=np.float64) + 0.5) / count
        return np.quantile(hist, q)

    def _plan(self, round_no: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        by_prompt = _by_prompt(samples)
        input_len = {p: float(np.mean([s.input_len for s in ss])) for p, ss in by_prompt.items()}
        k = max(1, min(self.groups, self.workers, len(by_prompt) or 1))
        ranking = rank_prompts(list(by_prompt), input_len, self.history, k, self.first_epoch, self.seed + round_no)
        lam = self.history.growth_lambda(self.migration.growth_percentile, self.migration.min_lambda)
        self.last_lambda = lam
        with_lengths = ranking.source == "history"
        group_samples, preds, weights = self._group_predictions(ranking, by_prompt, with_lengths)
        self._join_longest(carried, group_samples, preds, weights, lam, with_lengths)
        counts, predicted_times = self._worker_counts(group_samples, preds, with_lengths)
        self._weight.update(weights)
        if with_lengths:
            self._predicted.update({sid: w for sid, w in weights.items() if sid not in self._predicted})
        queues, info = self._place_groups(group_samples, layout(counts, round_no), weights, ranking, lam,
                                          predicted_times)
        self._rounds[round_no] = info
        for g, grp in enumerate(info.groups):
            for sid in grp.members:
                self._samples[sid].group = g
        self._forget_finished(round_no)
        if self.placement == "shared":
            return RoundPlan(round_no=round_no, queues=[],
                             shared=self._shared_order(queues, carried, with_lengths, by_prompt), ranking=ranking.source)
        return RoundPlan(
            round_no=round_no,
            queues=queues,
            ranking=ranking.source,
            order=step_order(round_no),
            workers_per_group=list(counts),
            predicted_group_time=predicted_times,
        )

    def _group_predictions(self, ranking: Ranking, by_prompt: Mapping[str, Sequence[Sample]], with_lengths: bool
                           ) -> tuple[list[list[Sample]], list[np.ndarray], dict[SampleId, float]]:
        """Each ranking group's samples, their predicted lengths (history's quantiles; none without
        history) and each sample's weight (its prompt's ranking key; 1 without history)."""
        group_samples: list[list[Sample]] = [[s for p in grp for s in by_prompt[p]] for grp in ranking.groups] or [[]]
        preds: list[np.ndarray] = []
        weights: dict[SampleId, float] = {}
        for prompt_group in ranking.groups or [[]]:
            parts = []
            for p in prompt_group:
                pl = self._predicted_lengths(p, len(by_prompt[p]), ranking.keys[p]) if with_lengths else None
                for s in by_prompt[p]:
                    weights[s.sid] = float(ranking.keys[p]) if with_lengths else 1.0
                if pl is not None:
                    parts.append(pl)
            preds.append(np.concatenate(parts) if parts else np.zeros(0))
        return group_samples, preds, weights

    def _join_longest(self, carried: list[Sample], group_samples: list[list[Sample]], preds: list[np.ndarray],
                      weights: dict[SampleId, float], lam: float, with_lengths: bool) -> None:
        """Outliers deferred from the last step join the longest group, each weighted by what lambda
        times its prompt's longest response leaves it to generate."""
        top = len(group_samples) - 1
        for s in carried:
            group_samples[top].append(s)
            base = self.history.max(s.prompt_id) or (max(weights.values()) if weights else 1.0)
            remaining = max(1.0, lam * base - s.generated)
            weights[s.sid] = remaining
            if with_lengths:
                preds[top] = np.append(preds[top], remaining)
                self._predicted[s.sid] = s.generated + remaining

    def _worker_counts(self, group_samples: list[list[Sample]], preds: list[np.ndarray], with_lengths: bool
                       ) -> tuple[list[int], list[float]]:
        """Workers per group and each group's predicted time: tier 2 (the cost model) where it
        applies, else an equal share and no prediction."""
        k = len(group_samples)
        if not (self.two_tier and with_lengths and k > 1 and self.placement == "per-worker"):
            return equal_share(k, self.workers), []
        mean_in = [float(np.mean([s.input_len for s in g])) if g else 0.0 for g in group_samples]
        costs = np.zeros((k, self.workers))
        for g in range(k):
            for n in range(1, self.workers + 1):
                costs[g, n - 1] = group_decode_time(preds[g], mean_in[g], n, self.profile, self.speculation)
        alloc = allocate(costs, self.workers)
        return alloc.workers_per_group, alloc.predicted

    def _place_groups(self, group_samples: list[list[Sample]], ranges: list[range], weights: Mapping[SampleId, float],
                      ranking: Ranking, lam: float, predicted_times: list[float]
                      ) -> tuple[list[list[SampleId]], _RoundGroups]:
        """Each group's samples balanced over its workers (`lpt`), and the round's group records."""
        queues: list[list[SampleId]] = [[] for _ in range(self.workers)]
        info = _RoundGroups()
        for g, members in enumerate(group_samples):
            placed = lpt([(s.sid, weights[s.sid]) for s in members], list(ranges[g]))
            for w, sids in placed.items():
                queues[w].extend(sids)
                info.worker_group[w] = g
            maxes = [m for m in (self.history.max(p) for p in (ranking.groups[g] if g < len(ranking.groups) else []))
                     if m is not None]
            max_hist = max(maxes) if maxes else None
            grp = _Group(
                rank=g,
                members=[s.sid for s in members],
                workers=ranges[g],
                size=len(members),
                remaining=len(members),
                max_hist=max_hist,
                predicted=predicted_times[g] if predicted_times else 0.0,
            )
            if self.migration.enabled and max_hist is not None:
                grp.threshold = mig.threshold_tokens(lam, max_hist)
            info.groups.append(grp)
        return queues, info

    def _forget_finished(self, round_no: int) -> None:
        """Keep the books small: rounds before the last that have finished need no migration state."""
        for old in [s for s in self._rounds if s < round_no - 1 and self.round_left(s) == 0]:
            for grp in self._rounds[old].groups:
                for sid in grp.members:
                    self._weight.pop(sid, None)
                    self._predicted.pop(sid, None)
            del self._rounds[old]

    def _shared_order(self, queues: list[list[SampleId]], carried: list[Sample], with_lengths: bool,
                      by_prompt: Mapping[str, Sequence[Sample]]) -> list[SampleId]:
        """The shared queue: resumed samples first (their tokens are already paid for), then the
        predicted longest first where history predicts; without it, the groups' order, and with
        `spread_groups` sibling by sibling: every prompt's first sample, then every one's second, ...
        So where a step holds more samples than the engines decode at once, a group's earlier
        samples run ahead of its later ones and those draft from them (group drafts; Seer's grouped
        speculation), instead of a whole group starting level and running in lockstep. The fleet
        (and the simulator) deal a queue round-robin, so the longest spread over the workers; the
        k-th siblings start k prompts further on, so a group's siblings spread over the workers too
        (without the turn, with as many prompts as workers, a whole group would land on one)."""
        first = {s.sid for s in carried}
        sids = [sid for q in queues for sid in q]
        pos = {sid: i for i, sid in enumerate(sids)}
        weight = self._weight if with_lengths else {}
        turn: dict[SampleId, tuple[int, int]] = {}
        if self.spread_groups and not with_lengths:
            prompts = sorted(by_prompt, key=lambda p: min(pos.get(s.sid, len(pos)) for s in by_prompt[p]))
            turn = {s.sid: (k, (i - k) % len(prompts)) for i, p in enumerate(prompts)
                    for k, s in enumerate(by_prompt[p])}
        return sorted(sids, key=lambda sid: (sid not in first, -weight.get(sid, 0.0), turn.get(sid, (0, 0)), pos[sid]))

    # ------------------------------------------------------------------ running
    def _group(self, st: SampleState) -> _Group | None:
        if st.round_no is None or st.group < 0:
            return None
        info = self._rounds.get(st.round_no)
        if info is None or st.group >= len(info.groups):
            return None
        return info.groups[st.group]

    def _after_finish(self, st: SampleState, now: float) -> list[Action]:
        grp = self._group(st)
        if grp is None:
            return []
        grp.remaining -= 1
        return self._maybe_tail(grp)

    def _maybe_tail(self, grp: _Group) -> list[Action]:
        if grp.tail or grp.threshold is None or not mig.in_tail(grp.remaining, grp.size, self.migration.tail_fraction):
            return []
        grp.tail = True
        out: list[Action] = []
        for sid in grp.members:
            st = self._samples.get(sid)  # finished samples of old steps may be forgotten already
            if st is not None and not st.done and not st.migrated and st.round_no is not None:
                out.append(Watch(sid, grp.threshold))
        return out

    def _progress(self, st: SampleState, worker: int, generated: int, now: float) -> list[Action]:
        grp = self._group(st)
        if grp is None or not grp.tail or st.migrated or grp.threshold is None or generated < grp.threshold:
            return []
        assert st.round_no is not None
        info = self._rounds[st.round_no]
        candidates = [
            mig.Candidate(worker=w, group_rank=g, outstanding=self.outstanding(w, st.round_no))
            for w, g in info.worker_group.items()
            if g != grp.rank and self.outstanding(w, st.round_no) > 0
        ]
        inter_ok = self.migration.inter_step and self.later_round_possible()
        decision = mig.decide(worker, grp.rank, len(info.groups), candidates, inter_ok)
        if decision.kind == "stay":
            return []
        move = self._emit(Move(sid=st.sample.sid, src=worker, dst=decision.dst, generated=generated, recompute=True))
        if move.dst is None:
            grp.remaining -= 1
        return [move]

    def _move_failed(self, st: SampleState, m: Move) -> None:
        grp = self._group(st)
        if m.dst is None and grp is not None:
            grp.remaining += 1  # it finishes here after all

    def _steal(self, worker: int, round_no: int, unfinished: Mapping[int, Sequence[tuple[SampleId, int]]]) -> list[Move]:
        """An idle worker takes over half (rounded up) of the unfinished samples of the worker with
        the most predicted work left in the same step (each sample's predicted length less its
        tokens, at least 1; without history every sample counts 1), the cheapest to move first:
        unstarted ones (the shorter end of a longest-first queue first), then those with the fewest
        tokens, which go on from their tokens. The victim keeps its last started sample (moving its
        only work would just idle it): a worker still busy with an earlier step gives this step's
        unstarted samples away half at a time, one running a sample alone gives nothing. Started
        samples move only where the cost model says it pays (`_pays`): where a pass costs about the
        same whatever the batch (memory-bound decoding) a smaller batch finishes no sooner, and the
        moved samples' recompute is lost. Stolen samples run with the weights they were placed
        with, on a worker that has them."""
        if not self.work_stealing:
            return []
        best: tuple[float, int] | None = None
        for v, samples in unfinished.items():
            if v == worker or not samples:
                continue
            load = sum(max(self._weight.get(sid, 1.0) - generated, 1.0) for sid, generated in samples)
            if best is None or (load, -v) > (best[0], -best[1]):
                best = (load, v)
        if best is None:
            return []
        victim = best[1]
        samples = list(unfinished[victim])
        order = [s for s in samples if s[1] == 0][::-1] + sorted((s for s in samples if s[1] > 0),
                                                                 key=lambda s: (s[1], s[0]))
        take = order[: math.ceil(len(order) / 2)]
        if len(take) == len(order) and any(g > 0 for _, g in order):
            take = [s for s in take if s != max(order, key=lambda s: (s[1], -s[0]))]
        started = [s for s in take if s[1] > 0]
        if started and not self._pays(samples, started):
            take = [s for s in take if s[1] == 0]
        return [Move(sid=sid, src=victim, dst=worker, generated=generated, recompute=True) for sid, generated in take]

    def _pays(self, held: Sequence[tuple[SampleId, int]], moved: Sequence[tuple[SampleId, int]]) -> bool:
        """Whether moving started samples `moved` off a worker holding `held` shortens the work: a
        worker's remaining time is its longest remaining sample's passes at the iteration time of
        its batch; the thief's starts with the prefill of what it recomputes. A sample's remaining
        tokens are its predicted length less its tokens; without a prediction (no history), as many
        again as the longest-running sample of the worker has made (what has run long runs on). It
        pays when the later of the two finishes at least 20% before the victim alone would (a moved
        sample also restarts its drafting state, which the model does not price: measured on the
        quickstart's next epoch over 4 in-process workers, a 5% margin moved 103 samples and cost
        14% of the makespan, 20% moved 32 and cost none; benchmarks/replicas/results.md)."""
        elapsed = float(max(g for _, g in held))

        def left(sid: SampleId, generated: int) -> float:
            predicted = self._predicted.get(sid)
            return max(predicted - generated if predicted is not None else elapsed, 1.0)

        def finish(items: Sequence[tuple[SampleId, int]]) -> float:
            if not items:
                return 0.0
            rest = max(left(sid, generated) for sid, generated in items)
            ctx = sum(self._samples[sid].sample.input_len + g for sid, g in items) / len(items)
            passes = rest / self.speculation.tokens_per_pass
            return passes * self.profile.iteration_time(len(items), ctx) * self.speculation.pass_cost

        gone = {sid for sid, _ in moved}
        kept = [s for s in held if s[0] not in gone]
        recompute = self.profile.prefill_time(sum(self._samples[sid].sample.input_len + g for sid, g in moved))
        return max(finish(kept), recompute + finish(moved)) < 0.8 * finish(held)
