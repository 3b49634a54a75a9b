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

The worker holds one engine (rollout_engine.py: torch_rollout.py or vllm_rollout.py, which say
what their calls can do), the mailbox a running call hears through (call_mailbox.py), and what
every engine shares: the weights' version, the metrics, the busy clock.

On a pod (and on a local Ray instance) SIGTERM is a notice to leave: a worker running a call
hands its samples back and is stopped by the step loop once they are safe; an idle one exits at
once (it holds nothing). The pod's process forwards the kubelet's SIGTERM to its workers through
the pid files they leave (leave_notice.py).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType
from typing import ClassVar, Protocol

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.cap_decisions import CapDecisions
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api import RLJob
from rhymerl.workers.model.tokenizer import load_job_tokenizer
from rhymerl.workers.roles.busy_clock import BusyClock
from rhymerl.workers.roles.call_mailbox import CallMailbox
from rhymerl.workers.roles.leave_notice import leave_pid_file
from rhymerl.workers.roles.rollout_engine import Report, RolloutEngine, Weights
from rhymerl.workers.roles.samples import (
    CallState,
    OutputTag,
    RolloutCall,
    RolloutOutput,
    RolloutProgress,
    SampleRef,
    Tag,
)
from rhymerl.workers.roles.threads import apply_threads, use_threads
from rhymerl.workers.roles.torch_rollout import TorchRollout
from rhymerl.workers.roles.vllm_rollout import VllmRollout
from rhymerl.workers.roles.weight_layout import Group, Layout
from rhymerl.workers.roles.weight_sync import STAGED_WAIT_S, WeightReceiver
from rhymerl.workers.roles.worker_metrics import WorkerMetrics
from rhymerl.workers.rollout.draft_link import DraftLink, DraftStream, News
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams
from rhymerl.workers.rollout.group_drafts import GrownTokens
from rhymerl.workers.rollout.remote_drafts import DraftServer
from rhymerl.workers.rollout.verify_cost import Progress
from rhymerl.workers.task.prompts import encode_prompts, load_prompts

__all__ = ["RolloutWorker", "Weights"]


class CapReportingEngine(RolloutEngine, Protocol):
    """A rollout engine that also tells what draft caps its passes ran under (both engines do)."""

    def cap_decisions(self) -> CapDecisions:
        """The draft cap of each pass of the call that ended last, and why (asked once, at its end)."""
        ...


def open_engine(job: RLJob, threads: int, progress: Progress | None, busy: BusyClock,
                metrics: WorkerMetrics) -> CapReportingEngine:
    """The engine the job's spec.rollout.engine names, loaded."""
    spec = job.spec
    tok = load_job_tokenizer(job)
    params = SamplingParams(spec.rollout.temperature, spec.rollout.top_p, spec.rollout.seed,
                            spec.algorithm.max_response_length)
    if spec.rollout.engine == "vllm":
        longest = max(map(len, encode_prompts(tok, load_prompts(spec.data)).values()))
        return VllmRollout(job, tok.stop_ids, params, longest, progress)
    return TorchRollout(job, tok.stop_ids, params, threads, progress, busy.now, metrics)


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
        """threads: torch's intra-op threads (None: the pod's CPU limit on a pod, else the process's setting); `progress`
        follows the verify-cost profile's measurement; `notice`: take SIGTERM as a notice to leave (a Ray actor)."""
        self.threads = apply_threads(threads)
        self.job = job
        self._busy = BusyClock()
        self.metrics = WorkerMetrics("rollout")
        self.engine = open_engine(job, self.threads, progress, self._busy, self.metrics)
        self.policy_version = 0
        self.receiver = WeightReceiver()
        self.mailbox = CallMailbox()
        self._servers: dict[object, DraftServer] = {}  # links this worker drafts for
        if notice:
            signal.signal(signal.SIGTERM, self._on_notice)
            leave_pid_file("rollout")

    def _on_notice(self, signum: int, frame: FrameType | None) -> None:
        if self.mailbox.notice():  # idle: nothing to hand back, gone at once
            os._exit(0)

    # ------------------------------------------------------------------ control (beside a running call)
    def release(self, call: int, samples: Sequence[SampleRef]) -> None:
        """Ask the running call `call` to hand `samples` back with their tokens (those still
        unfinished; the others are named as missed). A call that already ended ignores it."""
        self.mailbox.release(call, samples)

    def admit(self, call: int, samples: list[SampleRef], requests: list[GenRequest],
              partials: RolloutProgress | None) -> bool:
        """Add samples, with the tokens they have, to the running call `call` (a moved sample joins
        the destination's batch rather than queueing behind it); they come back in its output.
        False, and nothing added, if that call is no longer running or its cache cannot hold them."""
        return self.mailbox.admit(call, samples, requests, partials)

    def leave(self) -> None:
        """Leave the fleet: the running call hands every unfinished sample back (an idle worker has
        nothing to hand back); the step loop then stops this worker."""
        self.mailbox.leave()

    def draft_from(self, call: int, link: DraftLink | None) -> None:
        """Have the running call `call` verify drafts from `link` where its own method has none (None:
        from nobody); a call that already ended ignores it (freed drafters, rollout/remote_drafts.py)."""
        self.mailbox.draft_from(call, link)

    def hear(self, call: int, blocks: list[GrownTokens]) -> None:
        """Tokens siblings of the running call's samples generated on other workers, for its group
        indexes (group drafts); a call that already ended ignores them."""
        self.mailbox.hear(call, blocks)

    # ------------------------------------------------------------------ drafting for another worker
    def exchange(self, link: object, news: list[News]) -> list[DraftStream]:
        """Draft for the call at the other end of `link`: take its news, send streams back."""
        draft = self.engine.drafter()
        assert draft is not None, "a drafter needs the job's draft model (freed_drafters)"
        server = self._servers.get(link)
        if server is None:
            server = self._servers[link] = DraftServer(self.job.spec.rollout.speculation, draft)
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
        return os.getpid(), self.mailbox.leaving

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
        self.engine.load_weights(weights)
        self.policy_version = version
        self.metrics.policy.set(version)
        self.metrics.flush()
        return time.perf_counter() - t0, fell_back

    # ------------------------------------------------------------------ calls
    def generate(self, call: RolloutCall, indexes: Mapping[str, HistoryIndex] | None,
                 resume: RolloutProgress | None = None) -> Iterator[Report]:
        """The call's reports, each an item then its tag (the tag is small: a caller reading over the
        network reads tags and keeps items by reference; module samples.Tag). `indexes` None: no
        history drafts this time; `resume`: partial results by sample (a lost call's progress, or
        tokens of samples moved here), continued from their tokens."""
        busy = self._busy
        busy.resume()
        started = busy.now()
        try:
            end = yield from self.engine.run(call, indexes, resume, self.mailbox, busy)
            yield from self._finish(RolloutOutput(end.samples, end.results, self.policy_version, busy.now() - started,
                                                  bool(indexes), end.resumed_tokens, end.heard_tokens,
                                                  self.engine.cap_decisions()), end.state)
        finally:
            busy.pause()
            use_threads(self.threads)  # the passes' count (adaptive_threads) ends with the call

    def _finish(self, out: RolloutOutput, state: CallState) -> Iterator[Tag | RolloutOutput]:
        resumed = out.resumed_tokens
        m = self.metrics
        m.tokens.inc(sum(len(r.response_ids) for r in out.results) - resumed)
        m.drafted.inc(sum(r.drafted for r in out.results))
        m.accepted.inc(sum(r.accepted for r in out.results))
        m.resumed.inc(resumed)
        m.call(out.seconds)
        m.flush()
        self._busy.pause()
        yield out
        yield OutputTag(state)

    def cost_profile(self) -> CostProfile | None:
        """The engine's measured pass times, the scheduler's cost model: the verify-cost profile the
        torch engine's speculation prices drafts with, vLLM's pass-cost profile where it was measured."""
        return self.engine.cost_profile()

    def end_step(self) -> None:
        self.engine.end_step()

    def close(self) -> None:
        self.engine.close()
