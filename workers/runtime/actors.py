"""What each role's worker does in the distributed runtime: plain classes that Ray runs as actors
(cluster.py places them), one per pod of the role in a cluster.

Bulk data never passes through the controller: a rollout worker's output goes by reference to a
reward worker, whose scored samples go by reference to the train worker (which trains on them and
writes the step's dump: it is the replay buffer) and to the history worker (which indexes them for
the next epoch and ships each prompt's index to the rollout worker that runs it). The controller
gets `SampleSummary`s: a few numbers per response.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import ray
import torch

from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api import RLJob
from rhymerl.workers import dumps, faults
from rhymerl.workers.controller.history import RunHistory
from rhymerl.workers.controller.loop import Group, records, score_samples, training_samples
from rhymerl.workers.controller.prompts import Prompt, load_prompts
from rhymerl.workers.controller.run_dir import LoopState, RunDir
from rhymerl.workers.controller.speculation import RolloutSpeculation
from rhymerl.workers.controller.vllm_rollout import VllmRollout, logprob_gap
from rhymerl.workers.history.store import MemoryHistoryStore
from rhymerl.workers.model.folder import model_dir, read_config
from rhymerl.workers.model.registry import load_native_policy, load_policy
from rhymerl.workers.model.tokenizer import Tokenizer, load_tokenizer
from rhymerl.workers.reward.pool import open_scorer
from rhymerl.workers.rollout.engine import EngineSession, GenRequest, GenResult, SamplingParams, TorchEngine
from rhymerl.workers.rollout.vllm_engine import VllmEngine
from rhymerl.workers.runtime.worker_metrics import WorkerMetrics
from rhymerl.workers.train.trainer import Trainer

Weights = dict[str, torch.Tensor]
DATA_DIR_ENV = "RHYMERL_DATA_DIR"
POD_RUN_DIR = "run"
SNAPSHOT_PASSES = 16  # a rollout call reports its progress this often (engine passes)
STATE_PASSES = 4  # with migration, it reports its samples' token counts (small) this often
OPEN_GROUPS = "open_groups"  # a checkpoint's record of groups it left open


@dataclass(frozen=True)
class SampleRef:
    """Which response a request is: prompt, sample index within its group, and the epoch of the
    group (an outlier deferred past an epoch's end runs beside the next epoch's visit of its prompt)."""

    prompt_id: str
    index: int
    epoch: int


GroupKey = tuple[int, str]
"""A group of responses: (epoch, prompt id)."""


@dataclass
class RolloutOutput:
    """One rollout call's responses (in request order), the policy version that generated them."""

    samples: list[SampleRef]
    results: list[GenResult]
    policy_version: int
    seconds: float
    speculated: bool  # history drafts were available for this call
    resumed_tokens: int  # carried over from a lost call's progress


@dataclass
class RolloutProgress:
    """Partial results by sample: what a re-run of a lost call, or the call that takes over samples
    a busy worker released, resumes from."""

    results: dict[SampleRef, GenResult]


@dataclass(frozen=True)
class CallState:
    """What a rollout call reports with each progress item, its output and, with migration, every
    STATE_PASSES passes: the tokens each running sample has so far and the length of each finished
    one (the scheduler's events)."""

    running: dict[SampleRef, int]
    finished: dict[SampleRef, int]


Tag = tuple[str, object]
"""What the item before it in a rollout stream was: ("progress", CallState), ("state", CallState)
after a None item, ("released", the SampleRefs handed back to an idle worker), ("migrated", (the
SampleRefs handed back to be moved, those asked for that had finished)), ("output", CallState)."""


@dataclass
class ScoredSample:
    sample: SampleRef
    result: GenResult
    reward: float
    error: str | None
    policy_version: int


@dataclass(frozen=True)
class SampleSummary:
    """What the controller learns of a scored response."""

    sample: SampleRef
    length: int
    reward: float
    error: str | None
    drafted: int
    accepted: int
    forward_passes: int


@dataclass(frozen=True)
class ChunkSummary:
    """What the controller learns of one rollout call once it is scored."""

    samples: list[SampleSummary]
    rollout_seconds: float
    reward_seconds: float
    speculated: bool
    policy_version: int
    resumed_tokens: int


def pod_run_dir() -> Path:
    """The run folder of a stateful pod (controller, train): on its data volume."""
    return Path(os.environ[DATA_DIR_ENV]) / POD_RUN_DIR


def encode_prompts(tok: Tokenizer, prompts: Sequence[Prompt]) -> dict[str, list[int]]:
    return {p.prompt_id: tok.prompt_ids(p.text) for p in prompts}


def load_job_tokenizer(job: RLJob) -> Tokenizer:
    return load_tokenizer(model_dir(job.spec.model.path))


def assemble(chunks: Sequence[Sequence[ScoredSample]], prompts: Mapping[str, Prompt], order: Sequence[GroupKey],
             encoded: Mapping[str, list[int]], group_size: int) -> list[Group]:
    """The groups `order` names from scored samples spread over chunks (any placement), each group's
    responses by sample index: what the in-process loop builds from one rollout. Every response
    must be there once; chunks may hold others (of groups that complete later)."""
    by_sample: dict[SampleRef, ScoredSample] = {}
    for chunk in chunks:
        for s in chunk:
            if by_sample.setdefault(s.sample, s) is not s:
                raise RuntimeError(f"sample {s.sample}: scored twice")
    groups = []
    for epoch, pid in order:
        refs = [SampleRef(pid, k, epoch) for k in range(group_size)]
        if missing := [r.index for r in refs if r not in by_sample]:
            raise RuntimeError(f"prompt {pid} of epoch {epoch}: responses {missing} did not arrive")
        scored = [by_sample[r] for r in refs]
        versions = {s.policy_version for s in scored}
        if len(versions) != 1:
            raise RuntimeError(f"prompt {pid}: responses of one group from policy versions {sorted(versions)}")
        groups.append(Group(prompts[pid], encoded[pid], [s.result for s in scored], [s.reward for s in scored],
                            [s.error for s in scored], versions.pop(), epoch))
    return groups


@dataclass(frozen=True)
class StepLayout:
    """The groups a step completed, in order; the scored chunks passed after it hold their responses
    (and may hold responses of groups an outlier deferred to a later step: those are left for it)."""

    groups: list[GroupKey]

    def assemble(self, chunks: Sequence[Sequence[ScoredSample]], prompts: Mapping[str, Prompt],
                 encoded: Mapping[str, list[int]], group_size: int) -> list[Group]:
        return assemble(chunks, prompts, self.groups, encoded, group_size)


class RolloutWorker:
    """A rollout engine with its own copy of the weights, replaced in place by `load_weights`.
    Calls run one at a time, in order, except `release`, which reaches a running call."""

    CONCURRENCY_GROUPS: ClassVar[dict[str, int]] = {"control": 1}

    def __init__(self, job: RLJob, threads: int) -> None:
        torch.set_num_threads(threads)
        spec = job.spec
        self.job = job
        tok = load_job_tokenizer(job)
        self.stop_ids = tok.stop_ids
        self.params = SamplingParams(spec.rollout.temperature, spec.rollout.top_p, spec.rollout.seed,
                                     spec.algorithm.max_response_length)
        self.vllm: VllmEngine | None = None
        if spec.rollout.engine == "vllm":  # vLLM holds the only copy of the weights here
            encoded = encode_prompts(tok, load_prompts(spec.data))
            vocab = read_config(model_dir(spec.model.path)).vocab_size
            self.vllm = VllmRollout.engine_for(job, vocab, max(map(len, encoded.values())))
        else:
            self.model, _ = load_native_policy(spec.model)
            self.engine = TorchEngine(self.model, tok.eos_id, spec.rollout.max_batch_size)
            self.speculation = RolloutSpeculation.for_job(job, self.model, MemoryHistoryStore())
        self.policy_version = 0
        self.metrics = WorkerMetrics("rollout")
        self._lock = threading.Lock()
        self._call: int | None = None  # the running generate call's id
        self._release = 0  # samples the controller asked the running call to hand back to an idle worker
        self._migrate: set[SampleRef] = set()  # samples it asked the running call to hand back to be moved
        self._admitted: list[tuple[SampleRef, GenRequest, GenResult | None]] = []  # to join the running call
        self._max_prompt = 0  # the running call's longest prompt: what its KV cache was sized for

    @ray.method(concurrency_group="control")
    def release(self, call: int, n: int = 0, samples: Sequence[SampleRef] = ()) -> None:
        """Ask the running call `call` to hand back up to `n` of its unfinished samples (work stealing
        by an idle worker) and `samples` where unfinished (migration); runs beside the call, in its
        own thread. A call that already ended ignores it."""
        with self._lock:
            if self._call == call:
                self._release = max(self._release, n)
                self._migrate.update(samples)

    @ray.method(concurrency_group="control")
    def admit(self, call: int, samples: list[SampleRef], requests: list[GenRequest],
              partials: RolloutProgress) -> bool:
        """Add samples, with the tokens they have, to the running call `call` (an intra-step
        migration joins the destination's batch rather than queueing behind it); they come back in
        its output. False, and nothing added, if that call is no longer running."""
        with self._lock:
            if self._call != call or max(len(r.prompt_ids) for r in requests) > self._max_prompt:
                return False
            self._admitted += [(s, r, partials.results.get(s)) for s, r in zip(samples, requests, strict=True)]
            return True

    def _requests(self) -> tuple[int, set[SampleRef], list[tuple[SampleRef, GenRequest, GenResult | None]]]:
        with self._lock:
            out = (self._release, self._migrate, self._admitted)
            self._release, self._migrate, self._admitted = 0, set(), []
            return out

    def _close_call(self) -> bool:
        """End the running call unless samples were admitted to it meanwhile."""
        with self._lock:
            if self._admitted:
                return False
            self._call = None
            return True

    def ping(self) -> int:
        return os.getpid()

    def load_weights(self, version: int, weights: Weights) -> int:
        if self.vllm is not None:
            self.vllm.load_weights(weights)
        else:
            with torch.no_grad():
                self.model.load_hf_state_dict(weights)
        self.policy_version = version
        self.metrics.policy.set(version)
        self.metrics.flush()
        return version

    def generate(self, samples: list[SampleRef], requests: list[GenRequest],
                 indexes: Mapping[str, HistoryIndex] | None, step: int,
                 resume: RolloutProgress | None = None, call: int = -1,
                 report_state: bool = False) -> Iterator[Tag | RolloutProgress | RolloutOutput | None]:
        """A stream of (item, tag) pairs: (RolloutProgress, progress tag) every SNAPSHOT_PASSES
        passes, (None, state tag) every STATE_PASSES passes in between with `report_state` (the
        controller migrates outliers), (RolloutProgress of the samples handed back, released or
        migrated tag) when `release` asked for some, then (RolloutOutput of the samples kept and
        admitted, output tag).
        The small tag after an item says what it was and that it is complete (the caller reads
        tags, never items).
        `indexes` None: no history drafts this time; `resume`: partial results by sample, from
        the progress of a lost call or of a call that released them, continued from their tokens."""
        t0 = time.perf_counter()
        if self.vllm is not None:
            yield from self._generate_vllm(samples, requests, indexes, t0)
            return
        drafts = self.speculation.drafts_from(indexes or {})
        samples, requests = list(samples), list(requests)
        results: dict[int, GenResult] = {}
        gone: set[int] = set()  # handed back
        carried: dict[int, int] = {}  # tokens each sample brought from elsewhere
        # outliers other calls hand over (`admit`) take the slots this call's finished samples free
        session = self.engine.session(self.params, drafts, slots=len(requests),
                                      max_prompt_len=max(len(r.prompt_ids) for r in requests))

        def add(i: int, partial: GenResult | None, first: bool = False) -> None:
            carried[i] = len(partial.response_ids) if partial else 0
            if partial is not None and self._finished(partial):
                results[i] = partial
            else:
                session.add(i, requests[i], partial, first=first)

        def state() -> CallState:
            live = {*session.waiting(), *session.running()}
            return CallState({samples[i]: session.generated(i) for i in live},
                             {samples[i]: len(r.response_ids) for i, r in results.items()})

        for i, sample in enumerate(samples):
            add(i, resume.results.get(sample) if resume else None)
        with self._lock:
            self._call, self._release, self._migrate, self._admitted = call, 0, set(), []
            self._max_prompt = session.max_prompt_len
        try:
            passes = 0
            while True:
                n, migrate, admitted = self._requests()
                for sample, request, partial in admitted:
                    samples.append(sample)
                    requests.append(request)
                    add(len(samples) - 1, partial, first=True)
                if migrate:
                    live = {*session.waiting(), *session.running()}
                    moving = {i: session.take(i) for i in sorted(live) if samples[i] in migrate}
                    gone.update(moving)
                    handed = [samples[i] for i in moving]
                    yield RolloutProgress({samples[i]: r for i, r in moving.items()})
                    yield ("migrated", (handed, [s for s in migrate if s not in set(handed)]))
                if n and session.busy:
                    stolen = self._hand_back(session, n)
                    gone.update(stolen)
                    yield RolloutProgress({samples[i]: r for i, r in stolen.items()})
                    yield ("released", [samples[i] for i in stolen])
                if not session.busy:
                    if self._close_call():
                        break
                    continue
                results.update(session.step())
                passes += 1
                if passes % SNAPSHOT_PASSES == 0:
                    yield RolloutProgress({samples[i]: r for i, r in (results | session.progress()).items()})
                    yield ("progress", state())
                    faults.point("rollout-worker", step)
                elif report_state and passes % STATE_PASSES == 0:
                    yield None
                    yield ("state", state())
        finally:
            with self._lock:
                self._call = None
        kept = [i for i in range(len(requests)) if i not in gone]
        yield from self._finish(RolloutOutput([samples[i] for i in kept], [results[i] for i in kept],
                                              self.policy_version, time.perf_counter() - t0, bool(indexes),
                                              sum(carried[i] for i in kept)), state())

    @staticmethod
    def _hand_back(session: EngineSession, n: int) -> dict[int, GenResult]:
        """Take up to `n` unfinished samples out of the session, those with the fewest tokens first
        (the least to recompute where they go), always keeping one: their partial results."""
        unfinished = sorted([*session.waiting(), *session.running()], key=lambda k: (session.generated(k), k))
        return {k: session.take(k) for k in unfinished[: min(n, len(unfinished) - 1)]}

    def _generate_vllm(self, samples: list[SampleRef], requests: list[GenRequest],
                       indexes: Mapping[str, HistoryIndex] | None, t0: float) -> Iterator[Tag | RolloutOutput]:
        """The call on vLLM: one generate, no progress snapshots (vLLM's sampling is not keyed by
        position, so a lost call is run again whole rather than resumed from its tokens)."""
        assert self.vllm is not None
        first = {r.prompt_id: r.prompt_ids for r in requests}
        self.vllm.set_history(list(first.values()), [(indexes or {}).get(p) for p in first])
        results = self.vllm.generate(requests, self.params, self.stop_ids)
        yield from self._finish(RolloutOutput(samples, results, self.policy_version, time.perf_counter() - t0,
                                              bool(indexes), 0),
                                CallState({}, {s: len(r.response_ids) for s, r in zip(samples, results, strict=True)}))

    def _finish(self, out: RolloutOutput, state: CallState) -> Iterator[Tag | RolloutOutput]:
        resumed = out.resumed_tokens
        m = self.metrics
        m.tokens.inc(sum(len(r.response_ids) for r in out.results) - resumed)
        m.drafted.inc(sum(r.drafted for r in out.results))
        m.accepted.inc(sum(r.accepted for r in out.results))
        m.resumed.inc(resumed)
        m.call(out.seconds)
        m.flush()
        yield out
        yield ("output", state)

    def _finished(self, r: GenResult) -> bool:
        ids = r.response_ids
        return bool(ids) and (ids[-1] in self.stop_ids or len(ids) >= self.params.max_response_length)

    def end_step(self) -> None:
        """What the step's passes showed about the verify-cost profile goes into the machine's cache."""
        if self.vllm is None:
            self.speculation.keep_cost_evidence()


class RewardWorker:
    """Scores rollout outputs with the job's verifier or user function (in its own worker processes)."""

    def __init__(self, job: RLJob) -> None:
        self.job = job
        self.tok = load_job_tokenizer(job)
        self.prompts = {p.prompt_id: p for p in load_prompts(job.spec.data)}
        self.scorer = open_scorer(job.spec.reward)
        self.metrics = WorkerMetrics("reward")

    def ping(self) -> int:
        return os.getpid()

    def score(self, output: RolloutOutput, step: int) -> tuple[list[ScoredSample], ChunkSummary]:
        t0 = time.perf_counter()
        outcomes = score_samples(self.job, self.scorer, self.tok,
                                 [(self.prompts[s.prompt_id], s.index, r)
                                  for s, r in zip(output.samples, output.results, strict=True)], step)
        faults.point("reward-worker", step)
        scored = [ScoredSample(s, r, o.value, o.error, output.policy_version)
                  for s, r, o in zip(output.samples, output.results, outcomes, strict=True)]
        summaries = [SampleSummary(s.sample, len(s.result.response_ids), s.reward, s.error, s.result.drafted,
                                   s.result.accepted, s.result.forward_passes) for s in scored]
        seconds = time.perf_counter() - t0
        self.metrics.scored.inc(len(scored))
        self.metrics.call(seconds)
        self.metrics.flush()
        return scored, ChunkSummary(summaries, output.seconds, seconds, output.speculated, output.policy_version,
                                    output.resumed_tokens)

    def close(self) -> None:
        self.scorer.close()


class TrainWorker:
    """The policy's master weights and optimiser; trains on a step's kept groups, writes the step's
    dump (the replay buffer's record) and the checkpoints."""

    def __init__(self, job: RLJob, run_path: str | None, threads: int) -> None:
        """run_path: the run folder; None on a pod: POD_RUN_DIR on the pod's own data volume."""
        torch.set_num_threads(threads)
        torch.manual_seed(job.spec.rollout.seed)
        spec = job.spec
        self.job = job
        self.run = RunDir(Path(run_path) if run_path else pod_run_dir())
        self.run.path.mkdir(parents=True, exist_ok=True)
        self.model, tok = load_policy(spec.model)
        self.trainer = Trainer(self.model, spec.algorithm, spec.rollout.temperature)
        self.prompts = {p.prompt_id: p for p in load_prompts(spec.data)}
        self.encoded = encode_prompts(tok, list(self.prompts.values()))
        self.metrics = WorkerMetrics("train")

    def ping(self) -> int:
        return os.getpid()

    def restore(self) -> tuple[LoopState, list[GroupKey]]:
        """Weights and optimiser of the newest intact checkpoint; metrics and dumps cut back to it.
        Also the groups that checkpoint left open (an outlier of theirs was deferred past it): the
        resumed run generates them again, whole."""
        state = self.run.restore(self.model, self.trainer.optimizer)
        return state, [(int(e), str(p)) for e, p in self.run.checkpoint_extra(state.step).get(OPEN_GROUPS, [])]

    def history_records(self) -> list[dumps.RolloutRecord]:
        """Every dumped response (what a history worker starting mid-run refills its store from)."""
        return dumps.read_run(self.run.path) if (self.run.path / dumps.DUMP_DIR).is_dir() else []

    def lengths(self) -> list[tuple[str, list[int]]]:
        """Each dumped group's response lengths, in step order (the controller's length history)."""
        groups: dict[tuple[int, str], list[int]] = {}
        for rec in self.history_records():
            groups.setdefault((rec.step, rec.prompt_id), []).append(len(rec.response_ids))
        return [(pid, ls) for (_, pid), ls in groups.items()]

    def weights(self) -> Weights:
        """Copies under Hugging Face names; a tied output layer is the embedding's copy, not a second one."""
        copies: dict[int, torch.Tensor] = {}
        return {k: copies.setdefault(v.data_ptr(), v.detach().clone()) for k, v in self.model.hf_state_dict().items()}

    def step(self, state: LoopState, layout: StepLayout, kept: list[GroupKey],
             *chunks: list[ScoredSample]) -> tuple[dict[str, float], Weights | None]:
        """Train on the kept groups of the step, then dump every group. `state` is the
        loop's state after the step. Returns the statistics and, if the weights changed, the new
        weights."""
        groups = layout.assemble(chunks, self.prompts, self.encoded, self.job.spec.algorithm.group_size)
        wanted = set(kept)
        samples = training_samples([grp for grp in groups if (grp.epoch, grp.prompt.prompt_id) in wanted], self.job,
                                   state.step)
        # the rollout engine's log-probabilities against these weights, on the samples they generated
        current = state.policy_version - (1 if samples else 0)
        gap = logprob_gap(self.model, [(grp.prompt_ids, r) for grp in groups if grp.policy_version == current
                                       for r in grp.results])
        t0 = time.perf_counter()
        stats = self.trainer.step(samples) if samples else {}
        stats["time_train_s"] = time.perf_counter() - t0
        if gap is not None:
            stats["rollout_logprob_diff_mean"], stats["rollout_logprob_diff_max"] = gap
        if samples and (self.trainer.skipped_samples or self.trainer.skipped_updates):
            self.run.note(f"step {state.step}: on_nonfinite=skip left out {len(self.trainer.skipped_samples)} "
                          f"sample(s) {self.trainer.skipped_samples} and {self.trainer.skipped_updates} update(s) "
                          "with a nan/inf value")
        dumps.write_step(self.run.path, state.step, list(records(groups, state)))
        self.metrics.call(stats["time_train_s"])
        self.metrics.flush()
        return stats, (self.weights() if samples else None)

    def save(self, state: LoopState, open_groups: Sequence[GroupKey] = ()) -> str:
        return str(self.run.save_checkpoint(state, self.model, self.trainer.optimizer,
                                            self.job.spec.checkpoint.keep_last,
                                            {OPEN_GROUPS: [list(k) for k in open_groups]}))


class HistoryWorker:
    """The job's history store (memory, or Redis shared by every history worker): records each
    step's groups and builds the indexes a rollout worker drafts from."""

    def __init__(self, job: RLJob, fill: Callable[[], list[dumps.RolloutRecord]]) -> None:
        """Starts from `fill()`: every response dumped so far (the train worker keeps the dumps), so a
        history worker started by a resumed run, or restarted, drafts what the first one would have."""
        self.job = job
        self.history = RunHistory.for_job(job)
        self.prompts = {p.prompt_id: p for p in load_prompts(job.spec.data)}
        self.encoded = encode_prompts(load_job_tokenizer(job), list(self.prompts.values()))
        self.history.record(fill())
        self.metrics = WorkerMetrics("history")

    def ping(self) -> int:
        return os.getpid()

    def indexes(self, epoch: int, prompt_ids: list[str], step: int) -> tuple[dict[str, HistoryIndex], int]:
        """The indexes (for a rollout worker) and how many there are (for the controller, which learns
        from this small second object whether the call served without fetching the indexes)."""
        faults.point("history-worker", step)
        t0 = time.perf_counter()
        found = self.history.drafting.indexes_before(epoch, prompt_ids)
        self.metrics.shipped.inc(len(found))
        self.metrics.shipped_bytes.inc(sum(len(i.to_bytes()) for i in found.values()))
        self.metrics.call(time.perf_counter() - t0)
        self.metrics.flush()
        return found, len(found)

    def record(self, state: LoopState, layout: StepLayout, *chunks: list[ScoredSample]) -> int:
        groups = layout.assemble(chunks, self.prompts, self.encoded, self.job.spec.algorithm.group_size)
        self.history.record(records(groups, state))
        return len(groups)
