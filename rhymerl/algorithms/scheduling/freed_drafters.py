"""Drafters on freed rollout workers (SPECATOR §4.2): which idle workers draft for which stragglers,
and what a drafted verify pass costs. Pure: the simulator (rhymerl.tools.sim) and the rollout
fleet (workers/controller/) take the same decision, `decide`, each on its own workers' state.

In a round's tail most workers hold nothing while a few run the stragglers. A freed worker's GPU is
already held by its rollout pod, so it can run a draft model for one straggling worker's running
samples and ship the drafts there; that worker verifies them as before (lossless), gaining tokens
per pass. Why it can pay when speculation on the worker itself does not: in the tail a worker's
batch is small, decoding is bound by the weight read, and a verify pass of k+1 tokens per sequence
costs about one plain pass, while the draft passes run on another GPU instead of in series.

The rule (SPECATOR's Algorithm 3, coupled to one drafter per request's worker):
- freed: a worker that holds no sample (none running, none queued) and could take none now (the
  caller lists only such workers: on the shared queue an empty worker is one the queue cannot feed);
- a verifier: a worker running between 1 and `DraftCosts.max_batch` samples with none queued, whose
  drafted pass the cost model prices faster per token than its plain pass (`pays`);
- each freed worker drafts for at most one verifier, and a verifier has at most one drafter, which
  drafts for all its running samples: every straggler has at most one drafter, and there are never
  more drafters than freed workers. Verifiers are taken the longest predicted remaining first (the
  straggler), as SPECATOR serves the slowest request first;
- sticky: a drafter keeps its verifier while both stay eligible (a new assignment costs the
  verifier a rebuilt draft stream; SPECATOR's routine likewise only places newly freed workers);
- consolidation (optional, `DraftCosts.consolidate`): a verifier left without a drafter is emptied
  onto another straggling worker where the merged, drafted batch is predicted to end sooner by a
  margin (`consolidation`). Without drafting, moving a tail onto fewer workers measured worse
  (docs/scheduling.md, "tail consolidation"); with the emptied worker drafting it pays.

`decide` is the decision both fleets take after an event: the rollout fleet (workers/controller/)
on its workers' reported state, linking the pairs (workers/rollout/remote_drafts.py) and carrying
out a merge through the executor (`speculation.consolidateTail`); the simulator on its modelled
workers.
Not built: several drafter workers per straggler (SPECATOR's parallel drafters; a verifier chooses per
sequence between its own method's drafts and its one drafter's, workers/rollout/remote_drafts.py),
refreshing the draft model on the step's finished responses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .costmodel import (
    NO_SPECULATION,
    FloatArray,
    IterationProfile,
    RooflineProfile,
    SpeculationSpeedup,
    verify_time,
)

QWEN25_05B = RooflineProfile(params=0.494e9, kv_bytes_per_token=12_288.0)
"""The draft model on a freed H100: Qwen2.5-0.5B (0.49e9 parameters, model card; 24 layers x 2 KV
heads x 64 dims x K,V x 2 bytes = 12,288 bytes of KV per token, its config), priced by the same
roofline as the target (1.37 ms a pass at batch 1). SPECATOR §5 found 0.5B the best drafter for a
32B target; for our 7B-shaped target it is the smallest model of the same family (shared vocabulary)."""


@dataclass(frozen=True)
class ScaledProfile:
    """Another profile's times times `factor`: a draft model priced as a fraction of the policy's pass
    where it was not profiled itself (the controller knows the policy's measured pass times)."""

    base: IterationProfile
    factor: float

    @property
    def max_batch(self) -> int:
        return self.base.max_batch

    def iteration_time(self, batch: int, context: float) -> float:
        return self.factor * self.base.iteration_time(batch, context)

    def iteration_times(self, batch: FloatArray, context: FloatArray) -> FloatArray:
        return self.factor * self.base.iteration_times(batch, context)

    def prefill_time(self, tokens: int) -> float:
        return self.factor * self.base.prefill_time(tokens)

    @property
    def kv_capacity_tokens(self) -> int | None:
        return self.base.kv_capacity_tokens


@dataclass(frozen=True)
class DraftCosts:
    """What drafting on a freed worker costs and yields. Every number is a parameter; defaults and
    sources in benchmarks/freed-drafters/README.md."""

    acceptance: float = 0.714
    """Probability that a drafted token is accepted, independently per position. Default: our
    measured history drafts on the quickstart, accepted / drafted over all epochs, long match
    (benchmarks/acceptance/results.md); a draft model's on these traces is not measured here."""
    window: int = 4
    """Draft tokens shipped per verify pass (k)."""
    message_s: float = 1.0e-3
    """Seconds added to every drafted pass for shipping the drafts and the accepted count. Default:
    the one in-cluster message measured here, a history index from Redis through a history worker
    to its consumer on one machine, 1.00 ms median (benchmarks/runtime/results.md)."""
    draft_profile: IterationProfile = field(default=QWEN25_05B)
    """The draft model's cost per pass on the freed worker."""
    max_batch: int = 16
    """Most samples one drafter drafts for (SPECATOR's b_max, an assumption)."""
    consolidate: bool = False
    """Also empty a straggling worker onto another, so that it drafts, where that does not lengthen
    the tail (`consolidation`)."""
    consolidation_margin: float = 0.8
    """A consolidation must be predicted to end the two workers' work by this fraction of the time
    they would take without it: the remaining work is predicted crudely (the caller's fallback), and a
    merge cannot be undone. 0.8 is work stealing's margin for moving started samples
    (histopipe._pays, measured in benchmarks/replicas/results.md)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.acceptance < 1.0:
            raise ValueError("acceptance: in [0, 1)")
        if self.window < 1:
            raise ValueError("window: at least 1")
        if self.message_s < 0.0:
            raise ValueError("message_s: not negative")
        if self.max_batch < 1:
            raise ValueError("max_batch: at least 1")
        if not 0.0 < self.consolidation_margin <= 1.0:
            raise ValueError("consolidation_margin: in (0, 1]")

    @property
    def tokens_per_pass(self) -> float:
        """Expected tokens a verify pass yields per sequence with `window` drafts accepted each with
        probability p: the accepted prefix plus the target's own token, (1 - p^(k+1)) / (1 - p)
        (Leviathan et al. 2023, eq. 1)."""
        p, k = self.acceptance, self.window
        return float(sum(p**i for i in range(k + 1)))


def drafted_pass_seconds(profile: IterationProfile, costs: DraftCosts, batch: int, context: float,
                         spec: SpeculationSpeedup = NO_SPECULATION) -> float:
    """One verify pass of a worker whose `batch` running samples are all drafted on a freed worker:
    drafting and verification overlap (SPECATOR §4.1's decoupled Pi = max(w D(b), V_w(b))), so the
    pass takes the slower of the verification of k+1 tokens per sequence (`verify_time`, at the
    worker's own pass cost) and the drafter's k draft passes (the verifier waits for drafts that are
    late), plus the message latency."""
    verify = verify_time(profile, batch, context, costs.window + 1) * spec.pass_cost
    draft = costs.window * costs.draft_profile.iteration_time(batch, context)
    return max(verify, draft) + costs.message_s


def pays(profile: IterationProfile, costs: DraftCosts, batch: int, context: float,
         spec: SpeculationSpeedup = NO_SPECULATION) -> bool:
    """Whether drafting for a worker running `batch` samples at mean `context` makes its tokens come
    faster than its own passes do: drafted tokens per pass over the drafted pass time, against its
    own speculation's tokens per pass over its own pass time."""
    drafted = max(costs.tokens_per_pass, spec.tokens_per_pass) / drafted_pass_seconds(profile, costs, batch, context,
                                                                                        spec)
    plain = spec.tokens_per_pass / (profile.iteration_time(batch, context) * spec.pass_cost)
    return drafted > plain


@dataclass(frozen=True)
class WorkerView:
    """One worker as the decision sees it."""

    worker: int
    running: int
    """Samples it decodes now."""
    queued: int
    """Samples waiting on it (its own queue)."""
    context: float
    """Mean context (prompt + tokens) of its running samples."""
    remaining: float
    """Predicted tokens its longest running sample still has to go (the caller's prediction)."""


def assign(workers: Sequence[WorkerView], freed: Sequence[int], current: Mapping[int, int],
           profile: IterationProfile, costs: DraftCosts,
           spec: SpeculationSpeedup = NO_SPECULATION) -> dict[int, int]:
    """Drafter -> verifier: which freed worker drafts for which straggling worker (see the module's
    docstring for the rule). `current` is the assignment in force; its pairs stay where both sides
    are still eligible. A worker listed in `freed` that `workers` shows holding samples is not freed."""
    free = set(freed) - {v.worker for v in workers if v.running or v.queued}
    eligible = {
        v.worker: v for v in workers
        if v.worker not in free and 1 <= v.running <= costs.max_batch and v.queued == 0
        and pays(profile, costs, v.running, v.context, spec)
    }
    out: dict[int, int] = {}
    taken: set[int] = set()
    for d, w in sorted(current.items()):
        if d in free and w in eligible and w not in taken:
            out[d] = w
            taken.add(w)
    waiting = sorted((v for w, v in eligible.items() if w not in taken), key=lambda v: (-v.remaining, v.worker))
    idle = sorted(d for d in free if d not in out)
    for d, view in zip(idle, waiting, strict=False):
        out[d] = view.worker
    return out


def _plain_finish(profile: IterationProfile, v: WorkerView, spec: SpeculationSpeedup) -> float:
    return v.remaining / spec.tokens_per_pass * profile.iteration_time(v.running, v.context) * spec.pass_cost


def _drafted_finish(profile: IterationProfile, costs: DraftCosts, v: WorkerView, spec: SpeculationSpeedup) -> float:
    tpp = max(costs.tokens_per_pass, spec.tokens_per_pass)
    return v.remaining / tpp * drafted_pass_seconds(profile, costs, v.running, v.context, spec)


def consolidation(workers: Sequence[WorkerView], plan: Mapping[int, int], profile: IterationProfile,
                  costs: DraftCosts, spec: SpeculationSpeedup = NO_SPECULATION) -> tuple[int, int] | None:
    """One worker to empty onto another, (source, destination), or None: when a straggling worker
    that `pays` to draft for has no drafter in `plan` (every freed worker drafts already), the one
    with the least predicted work moves its running samples to the eligible worker with the most,
    which then runs them all, drafted for, while the source drafts. Only where the merged batch fits
    one drafter and the destination, after the prefill of what it takes in (the moved samples' KV
    cache is recomputed, as in every migration), drafted for by the source, is predicted to finish
    within `consolidation_margin` of the later of the two without the merge: the tail does not
    lengthen."""
    free = {v.worker for v in workers if v.running == 0 and v.queued == 0}
    eligible = [v for v in workers if v.worker not in free and 1 <= v.running <= costs.max_batch and v.queued == 0
                and pays(profile, costs, v.running, v.context, spec)]
    drafted = set(plan.values())
    for src in sorted((v for v in eligible if v.worker not in drafted), key=lambda v: (v.remaining, v.worker)):
        dsts = sorted((v for v in eligible if v.worker != src.worker and v.running + src.running <= costs.max_batch),
                      key=lambda v: (-v.remaining, v.worker))
        for dst in dsts:
            before_dst = _drafted_finish(profile, costs, dst, spec) if dst.worker in drafted else _plain_finish(
                profile, dst, spec)
            before = max(_plain_finish(profile, src, spec), before_dst)
            batch = src.running + dst.running
            merged = WorkerView(worker=dst.worker, running=batch, queued=0,
                                context=(src.running * src.context + dst.running * dst.context) / batch,
                                remaining=max(src.remaining, dst.remaining))
            after = profile.prefill_time(round(src.running * src.context)) + _drafted_finish(profile, costs, merged,
                                                                                             spec)
            if after <= costs.consolidation_margin * before:
                return src.worker, dst.worker
    return None


@dataclass(frozen=True)
class DrafterPlan:
    """What the fleet does about freed workers after an event."""

    pairs: dict[int, int]
    """Drafter -> verifier (`assign`)."""
    merge: tuple[int, int] | None
    """(source, destination): a straggling worker to empty onto another, after which the source drafts
    for the destination (`consolidation`); None: none."""


def decide(workers: Sequence[WorkerView], freed: Sequence[int], current: Mapping[int, int],
           profile: IterationProfile, costs: DraftCosts, spec: SpeculationSpeedup = NO_SPECULATION,
           may_merge: bool = True) -> DrafterPlan:
    """The pairs in force from now and at most one merge (only with `costs.consolidate` and
    `may_merge`: a fleet whose earlier merge, or another move, is still under way asks for none).
    `current`: the pairs in force, a worker emptied by a merge counted as drafting for the worker it
    filled."""
    pairs = assign(workers, freed, current, profile, costs, spec)
    merge = consolidation(workers, pairs, profile, costs, spec) if costs.consolidate and may_merge else None
    return DrafterPlan(pairs, merge)
