"""A rollout worker: one member of the job's rollout fleet, an engine (torch or vLLM) with its own
copy of the weights, answering rollout calls as a stream of reports.

A call is a generator: every `report_every` passes it reports each sample's token count, every
`snapshot_every` passes their tokens (what a re-run resumes from if this worker dies), and at the
end the finished responses. Between passes it honours what the step loop asked meanwhile
(`release`: hand named samples back with their tokens, to be moved; `admit`: take moved samples
into the running call; `leave`: hand every unfinished sample back, the worker is leaving the
fleet; `hear`: tokens the samples' siblings generated on other workers, for its group drafts). In
the step loop's process the loop steps the generator itself, one report at a time; on Ray it is a
streaming actor method, and those requests run beside the call in their own concurrency group.

On a pod (and on a local Ray instance) SIGTERM is a notice to leave: a worker running a call
hands its samples back and is stopped by the step loop once they are safe; an idle one exits at
once (it holds nothing). The pod's process forwards the kubelet's SIGTERM to its workers through
the pid files they leave in `RHYMERL_NODE_DIR`.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import ClassVar, Protocol

import torch

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api import RLJob
from rhymerl.workers import faults
from rhymerl.workers.history.store import MemoryHistoryStore
from rhymerl.workers.model.folder import model_dir, read_config
from rhymerl.workers.model.registry import load_native_policy
from rhymerl.workers.model.tokenizer import Tokenizer, load_tokenizer
from rhymerl.workers.roles.samples import (
    CallState,
    Handback,
    RolloutCall,
    RolloutOutput,
    RolloutProgress,
    SampleRef,
    Tag,
)
from rhymerl.workers.roles.threads import apply_threads, chooser, use_threads
from rhymerl.workers.roles.weight_sync import STAGED_WAIT_S, Group, Layout, WeightReceiver
from rhymerl.workers.roles.worker_metrics import WorkerMetrics
from rhymerl.workers.rollout.engine import GenRequest, GenResult, SamplingParams, TorchEngine
from rhymerl.workers.rollout.group_drafts import GroupDrafts, GrownTokens
from rhymerl.workers.rollout.remote_drafts import DraftLink, DraftServer, DraftStream, News, RemoteDrafts
from rhymerl.workers.rollout.speculation import RolloutSpeculation, reachable_batches
from rhymerl.workers.rollout.verify_cost import Progress, load_or_measure
from rhymerl.workers.rollout.vllm_engine import VllmEngine
from rhymerl.workers.task.prompts import Prompt, load_prompts, prompt_tokens

Weights = dict[str, torch.Tensor]
NODE_DIR_ENV = "RHYMERL_NODE_DIR"  # a pod's scratch folder: its role workers leave their pid files there
PID_SUFFIX = ".pid"


def encode_prompts(tok: Tokenizer, prompts: Sequence[Prompt]) -> dict[str, list[int]]:
    return {p.prompt_id: prompt_tokens(tok, p) for p in prompts}


def load_job_tokenizer(job: RLJob) -> Tokenizer:
    return load_tokenizer(model_dir(job.spec.model.path))


class Deferred(Protocol):
    """A reference to weights held elsewhere, resolved only when asked."""

    def get(self) -> Weights: ...


class RolloutWorker:
    CONCURRENCY_GROUPS: ClassVar[dict[str, int]] = {"control": 1, "weights": 1, "drafts": 1}
    CONTROL: ClassVar[frozenset[str]] = frozenset({"release", "admit", "leave", "host", "draft_from", "hear"})
    """Methods that reach a running call (they run beside it, in the control group, on Ray)."""
    WEIGHTS: ClassVar[frozenset[str]] = frozenset({"receive_weights"})
    """Receiving a published version over a broadcast, beside a running call (the weights group)."""
    DRAFTS: ClassVar[frozenset[str]] = frozenset({"exchange", "drop_link"})
    """Drafting for another worker's call (freed drafters, rollout/remote_drafts.py), beside this
    worker's own calls (the drafts group)."""


    def __init__(self, job: RLJob, threads: int | None = None, progress: Progress | None = None,
                 notice: bool = False) -> None:
        """threads: torch's intra-op threads (None: the pod's CPU limit on a pod, else the process's setting); `progress` follows
        the verify-cost profile's measurement; `notice`: take SIGTERM as a notice to leave (a Ray actor)."""
        self.threads = apply_threads(threads)
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
            self.vllm = VllmEngine.for_job(job, vocab, max(map(len, encoded.values())), progress)
        else:
            self.model, _ = load_native_policy(spec.model)
            adaptive = chooser(self.threads) if spec.rollout.adaptive_threads and self.threads > 1 else None
            self.engine = TorchEngine(self.model, tok.stop_ids, spec.rollout.max_batch_size, threads=adaptive)
            self.speculation = RolloutSpeculation.for_job(job, self.model, MemoryHistoryStore(), progress)
            # the profile is this count's (its cache key): passes at another correct only the calibration
            self.speculation.control.profiled = lambda: torch.get_num_threads() == self.threads
        self._busy = _Busy()
        if self.vllm is None:  # the draft cap prices passes from this worker's own time, not its turns' gaps
            self.speculation.control.clock = self._busy.now
        self.policy_version = 0
        self.metrics = WorkerMetrics("rollout")
        self.receiver = WeightReceiver()
        self._lock = threading.Lock()
        self._call: int | None = None  # the running call's id
        self._release: set[SampleRef] = set()  # samples the step loop asked the running call to hand back
        self._admitted: list[tuple[SampleRef, GenRequest, GenResult | None]] = []  # to join the running call
        self._max_prompt = 0  # the running call's longest prompt: what its KV cache was sized for
        self._leaving = False
        self._link: list[DraftLink | None] = []  # a drafter link for the running call to switch to
        self._heard: list[GrownTokens] = []  # siblings' tokens from other workers, for the running call's groups
        self._servers: dict[object, DraftServer] = {}  # links this worker drafts for
        if notice:
            signal.signal(signal.SIGTERM, self._on_notice)
            node_dir = os.environ.get(NODE_DIR_ENV)
            if node_dir:
                Path(node_dir).mkdir(parents=True, exist_ok=True)
                (Path(node_dir) / f"rollout-{os.getpid()}{PID_SUFFIX}").write_text(str(os.getpid()))

    def _on_notice(self, signum: int, frame: FrameType | None) -> None:
        with self._lock:
            self._leaving = True
            idle = self._call is None
        if idle:  # nothing to hand back: gone at once
            os._exit(0)

    # ------------------------------------------------------------------ control (beside a running call)
    def release(self, call: int, samples: Sequence[SampleRef]) -> None:
        """Ask the running call `call` to hand `samples` back with their tokens (those still
        unfinished; the others are named as missed). A call that already ended ignores it."""
        with self._lock:
            if self._call == call:
                self._release.update(samples)

    def admit(self, call: int, samples: list[SampleRef], requests: list[GenRequest],
              partials: RolloutProgress | None) -> bool:
        """Add samples, with the tokens they have, to the running call `call` (a moved sample joins
        the destination's batch rather than queueing behind it); they come back in its output.
        False, and nothing added, if that call is no longer running or its cache cannot hold them."""
        with self._lock:
            if self._call != call or self._leaving or max(len(r.prompt_ids) for r in requests) > self._max_prompt:
                return False
            results = partials.results if partials is not None else {}
            self._admitted += [(s, r, results.get(s)) for s, r in zip(samples, requests, strict=True)]
            return True

    def leave(self) -> None:
        """Leave the fleet: the running call hands every unfinished sample back (an idle worker has
        nothing to hand back); the step loop then stops this worker."""
        with self._lock:
            self._leaving = True

    def draft_from(self, call: int, link: DraftLink | None) -> None:
        """Have the running call `call` verify drafts from `link` where its own method has none (None:
        from nobody); a call that already ended ignores it (freed drafters, rollout/remote_drafts.py)."""
        with self._lock:
            if self._call == call:
                self._link = [link]

    def hear(self, call: int, blocks: list[GrownTokens]) -> None:
        """Tokens siblings of the running call's samples generated on other workers, for its group
        indexes (group drafts); a call that already ended ignores them."""
        with self._lock:
            if self._call == call:
                self._heard += blocks

    # ------------------------------------------------------------------ drafting for another worker
    def exchange(self, link: object, news: list[News]) -> list[DraftStream]:
        """Draft for the call at the other end of `link`: take its news, send streams back."""
        assert self.speculation.draft is not None, "a drafter needs the job's draft model (freed_drafters)"
        server = self._servers.get(link)
        if server is None:
            server = self._servers[link] = DraftServer(self.job.spec.rollout.speculation, self.speculation.draft)
        return server.exchange(news)

    def drop_link(self, link: object) -> None:
        """The call at the other end of `link` no longer drafts from here."""
        self._servers.pop(link, None)

    def host(self) -> str:
        """The host this worker runs on: in a cluster, its pod's name (which pod a scale-down removes:
        the fleet retires the workers on the highest ordinals first)."""
        return socket.gethostname()

    def ping(self) -> tuple[int, bool]:
        """This worker's process id, and whether it is leaving."""
        return os.getpid(), self._leaving

    # ------------------------------------------------------------------ weights
    def receive_weights(self, version: int, group: Group, rank: int, layout: Layout) -> None:
        """Receive a policy version over a broadcast into a staging copy (`load_weights` takes it)."""
        self.receiver.receive(version, group, rank, layout)

    def load_weights(self, version: int, weights: Weights | Deferred) -> tuple[float, bool]:
        """Load a policy version in place; the seconds it took, and whether a broadcast meant to
        bring it failed. `weights`: the tensors, or a reference to them (the object store's copy)
        while the version comes over a broadcast: the broadcast's copy once it arrived, else, after
        STAGED_WAIT_S, the reference's."""
        t0 = time.perf_counter()
        fell_back = False
        if not isinstance(weights, Mapping):
            staged = self.receiver.take(version, STAGED_WAIT_S)
            fell_back = staged is None
            weights = staged if staged is not None else weights.get()
        else:
            self.receiver.loaded(version)
        if self.vllm is not None:
            self.vllm.load_weights(weights)
        else:
            with torch.no_grad():
                self.model.load_hf_state_dict(weights)
        self.policy_version = version
        self.metrics.policy.set(version)
        self.metrics.flush()
        return time.perf_counter() - t0, fell_back

    # ------------------------------------------------------------------ calls
    def generate(self, call: RolloutCall, indexes: Mapping[str, HistoryIndex] | None,
                 resume: RolloutProgress | None = None) -> Iterator[Tag | RolloutProgress | RolloutOutput | None]:
        """The call's reports, each an item then its tag (the tag is small: a caller reading over the
        network reads tags and keeps items by reference; module samples.Tag). `indexes` None: no
        history drafts this time; `resume`: partial results by sample (a lost call's progress, or
        tokens of samples moved here), continued from their tokens."""
        busy = self._busy
        busy.resume()
        started = busy.now()
        try:
            if self.vllm is not None:
                yield from self._generate_vllm(call, indexes, resume, busy, started)
            else:
                yield from self._generate_torch(call, indexes, resume, busy, started)
        finally:
            busy.pause()
            use_threads(self.threads)  # the passes' count (adaptive_threads) ends with the call

    def _generate_torch(self, call: RolloutCall, indexes: Mapping[str, HistoryIndex] | None,
                        resume: RolloutProgress | None, busy: _Busy,
                        started: float) -> Iterator[Tag | RolloutProgress | RolloutOutput | None]:
        spec = self.job.spec.rollout.speculation
        groups = GroupDrafts(spec, (r.prompt_id for r in call.requests)) if spec.group_drafts else None
        drafts = self.speculation.drafts_from(indexes or {}, groups)
        remote = RemoteDrafts(spec, drafts) if spec.freed_drafters else None
        drafts = remote or drafts
        samples, requests = list(call.samples), list(call.requests)
        results: dict[int, GenResult] = {}
        gone: set[int] = set()  # handed back
        carried: dict[int, int] = {}  # tokens each sample brought from elsewhere
        shared: dict[int, int] = {}  # tokens of each sample its reports carried (share_every)
        # samples other calls hand over (`admit`) take the slots this call's finished samples free
        session = self.engine.session(self.params, drafts, slots=len(requests),
                                      max_prompt_len=max(len(r.prompt_ids) for r in requests))

        def add(i: int, partial: GenResult | None, first: bool = False) -> None:
            carried[i] = len(partial.response_ids) if partial else 0
            if partial is not None and self._finished(partial):
                results[i] = partial
            else:
                session.add(i, requests[i], partial, first=first)

        def state(passes: int | None = None) -> CallState:  # waiting samples in queue order, then running ones
            """passes: after this many passes (None: the call's end)."""
            live = [*session.waiting(), *session.running()]
            share = call.share_every is not None and (passes is None or passes % call.share_every == 0)
            return CallState({samples[i]: session.generated(i) for i in live},
                             {samples[i]: len(r.response_ids) for i, r in results.items()},
                             grown() if share else None)

        def grown() -> GrownTokens | None:
            """Tokens since they were last shared (a moved sample's from where it arrived: its
            tokens before that were shared where they were generated)."""
            rows = []
            for i, n in [*((i, session.generated(i)) for i in session.running()),
                         *((i, len(r.response_ids)) for i, r in results.items())]:
                start = shared.get(i, carried[i])
                if n > start:
                    tokens = results[i].response_ids[start:] if i in results else session.tokens(i, start)
                    rows.append((samples[i].epoch, requests[i].sample_id, requests[i].prompt_id, start, tokens))
                    shared[i] = n
            return GrownTokens.of(rows)

        for i, sample in enumerate(samples):
            add(i, resume.results.get(sample) if resume else None)
        with self._lock:
            self._call, self._release, self._admitted, self._link, self._heard = call.id, set(), [], [], []
            self._max_prompt = session.max_prompt_len
        try:
            passes = 0
            while True:
                release, admitted, leaving, link, heard = self._requests()
                if remote is not None and link:
                    remote.attach(link[0])
                if groups is not None and heard:
                    before = groups.heard
                    groups.hear(heard)
                    self.metrics.heard.inc(groups.heard - before)
                for sample, request, partial in admitted:
                    if groups is not None:
                        groups.prompts.add(request.prompt_id)
                    samples.append(sample)
                    requests.append(request)
                    add(len(samples) - 1, partial, first=True)
                live = {*session.waiting(), *session.running()}
                if leaving:
                    release = {samples[i] for i in live}
                if release:
                    taken = {i: session.take(i) for i in sorted(live) if samples[i] in release}
                    gone.update(taken)
                    handed = {samples[i]: len(r.response_ids) for i, r in taken.items()}
                    busy.pause()
                    yield RolloutProgress({samples[i]: r for i, r in taken.items()})
                    yield ("handback", Handback(handed, sorted(release - handed.keys(), key=_order), leaving))
                    busy.resume()
                if not session.busy:
                    if self._close_call():
                        break
                    continue
                results.update(session.step())
                passes += 1
                if call.snapshot_every and passes % call.snapshot_every == 0:
                    snapshot = RolloutProgress({samples[i]: r for i, r in (results | session.progress()).items()})
                    busy.pause()
                    yield snapshot
                    yield ("progress", state(passes))
                    busy.resume()
                    faults.point("rollout-worker", call.step)
                elif call.report_every and passes % call.report_every == 0:
                    busy.pause()
                    yield None
                    yield ("state", state(passes))
                    busy.resume()
                    if not call.snapshot_every:  # in the step loop's process: a point to hold at
                        faults.point("rollout-worker", call.step)
        finally:
            with self._lock:
                self._call = None
            if remote is not None:
                remote.attach(None)  # the drafter frees what it held for this call
        kept = [i for i in range(len(requests)) if i not in gone]
        yield from self._finish(RolloutOutput([samples[i] for i in kept], [results[i] for i in kept],
                                              self.policy_version, busy.now() - started, bool(indexes),
                                              sum(carried[i] for i in kept), groups.heard if groups else 0),
                                state(), busy)

    def _requests(self) -> tuple[set[SampleRef], list[tuple[SampleRef, GenRequest, GenResult | None]], bool,
                                 list[DraftLink | None], list[GrownTokens]]:
        with self._lock:
            out = (self._release, self._admitted, self._leaving, self._link, self._heard)
            self._release, self._admitted, self._link, self._heard = set(), [], [], []
            return out

    def _close_call(self) -> bool:
        """End the running call unless samples were admitted to it meanwhile."""
        with self._lock:
            if self._admitted:
                return False
            self._call = None
            return True

    def _generate_vllm(self, call: RolloutCall, indexes: Mapping[str, HistoryIndex] | None,
                       resume: RolloutProgress | None, busy: _Busy,
                       started: float) -> Iterator[Tag | RolloutProgress | RolloutOutput | None]:
        """The call on vLLM, one engine step at a time (rollout/vllm_run.py): between steps it hands
        back, with their tokens and log-probabilities, the samples the step loop asked for (`release`)
        or, leaving, every unfinished one; a resumed sample goes on from its tokens. No snapshots and
        no admits (vLLM's sampling is not keyed by position: a lost call is run again whole)."""
        assert self.vllm is not None
        first = {r.prompt_id: r.prompt_ids for r in call.requests}
        self.vllm.set_history(list(first.values()), [(indexes or {}).get(p) for p in first])
        samples, requests, run = call.samples, call.requests, self.vllm.run(self.params, self.stop_ids)
        carried = [resume.results.get(s) if resume else None for s in samples]
        results = {i: r for i, r in enumerate(carried) if r is not None and self._finished(r)}
        arrived, gone, said = set(results), set[int](), False
        run.add_all([(i, r, carried[i]) for i, r in enumerate(requests) if i not in arrived])
        with self._lock:
            self._call, self._release = call.id, set()
        try:
            passes = 0
            while run.busy:
                release, _, leaving, _, _ = self._requests()
                taken = {i: run.take(i) for i in run.running() if leaving or samples[i] in release}
                if taken or release:
                    self.vllm.count_drafts([requests[i] for i in taken], list(taken.values()), [carried[i] for i in taken])
                    gone.update(taken)
                    handed = {samples[i]: len(r.response_ids) for i, r in taken.items()}
                    said = leaving
                    busy.pause()
                    yield RolloutProgress({samples[i]: r for i, r in taken.items()})
                    yield ("handback", Handback(handed, sorted(release - handed.keys(), key=_order), leaving))
                    busy.resume()
                    continue
                results.update(run.step())
                passes += 1
                if call.report_every and passes % call.report_every == 0:
                    busy.pause()
                    yield None
                    yield ("state", CallState({samples[i]: run.generated(i) for i in run.running()},
                                              {samples[i]: len(r.response_ids) for i, r in results.items()}))
                    busy.resume()
        finally:
            run.close()
            with self._lock:
                self._call = None
        if self._leaving and not said:  # told to leave as the call ended: nothing to hand back, but say so
            busy.pause()
            yield RolloutProgress({})
            yield ("handback", Handback({}, [], leaving=True))
            busy.resume()
        kept = [i for i in range(len(samples)) if i not in gone]
        ran = [i for i in kept if i not in arrived]
        self.vllm.count_drafts([requests[i] for i in ran], [results[i] for i in ran], [carried[i] for i in ran])
        yield from self._finish(RolloutOutput([samples[i] for i in kept], [results[i] for i in kept],
                                              self.policy_version, busy.now() - started, bool(indexes),
                                              sum(len(c.response_ids) for i in kept if (c := carried[i]))),
                                CallState({}, {samples[i]: len(results[i].response_ids) for i in kept}), busy)

    def _finish(self, out: RolloutOutput, state: CallState, busy: _Busy) -> Iterator[Tag | RolloutOutput]:
        resumed = out.resumed_tokens
        m = self.metrics
        m.tokens.inc(sum(len(r.response_ids) for r in out.results) - resumed)
        m.drafted.inc(sum(r.drafted for r in out.results))
        m.accepted.inc(sum(r.accepted for r in out.results))
        m.resumed.inc(resumed)
        m.call(out.seconds)
        m.flush()
        busy.pause()
        yield out
        yield ("output", state)

    def _finished(self, r: GenResult) -> bool:
        ids = r.response_ids
        return bool(ids) and (ids[-1] in self.stop_ids or len(ids) >= self.params.max_response_length)

    def cost_profile(self) -> CostProfile | None:
        """The engine's measured pass times, the scheduler's cost model: the verify-cost profile the
        torch engine's speculation prices drafts with (measured now, or read from this machine's
        cache, where speculation does not use one); vLLM's pass-cost profile where it was measured."""
        if self.vllm is not None:
            return self.vllm.profile
        return self.speculation.control.profile or load_or_measure(self.model, batches=reachable_batches(self.job))

    def end_step(self) -> None:
        """What the step's passes showed about the verify-cost profile goes into the machine's cache."""
        if self.vllm is None:
            self.speculation.keep_cost_evidence()

    def close(self) -> None:
        if self.vllm is not None:
            self.vllm.close()


def _order(s: SampleRef) -> tuple[int, str, int]:
    return s.epoch, s.prompt_id, s.index


class _Busy:
    """A clock of the seconds a worker spent working: it stands still while a call sits at a yield
    waiting to be stepped on (in the step loop's process the workers take turns) and between calls,
    so a call's duration, and the pass times the draft cap is priced from, are this worker's own."""

    def __init__(self) -> None:
        self._total = 0.0
        self._since: float | None = None

    def pause(self) -> None:
        if self._since is not None:
            self._total += time.perf_counter() - self._since
            self._since = None

    def resume(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    def now(self) -> float:
        return self._total + (time.perf_counter() - self._since if self._since is not None else 0.0)
