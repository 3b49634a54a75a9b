"""Rollout calls on vLLM (rollout/vllm_engine.py), which holds the worker's only copy of the weights.

A call runs one engine step at a time (rollout/vllm_run.py): between steps it hands back, with
their tokens and log-probabilities, the samples the step loop asked for (`release`) or, leaving,
every unfinished one; a resumed sample goes on from its tokens, and a drafter link the fleet sends
(`draft_from`, freed drafters) goes to our proposer inside vLLM. No snapshots and no admits: vLLM's
sampling is not keyed by position, so a lost call is run again whole (rollout_engine.VLLM). With
freed_drafters the worker holds the job's draft model beside vLLM, to draft for others when freed.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import ClassVar

import torch

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.cap_decisions import CapDecisions
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api import RLJob
from rhymerl.workers import faults
from rhymerl.workers.model.folder import model_dir, read_config
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.roles.busy_clock import BusyClock
from rhymerl.workers.roles.call_mailbox import CallMailbox
from rhymerl.workers.roles.rollout_engine import (
    VLLM,
    CallEnd,
    EngineAbilities,
    Report,
    Weights,
    handed_back,
    is_finished,
    reported,
)
from rhymerl.workers.roles.samples import CallState, RolloutCall, RolloutProgress, StateTag
from rhymerl.workers.rollout.draft_model import load_draft_model
from rhymerl.workers.rollout.generation import GenResult, SamplingParams
from rhymerl.workers.rollout.verify_cost import Progress
from rhymerl.workers.rollout.vllm_engine import OURS, VllmEngine


class VllmRollout:
    """vLLM behind a rollout worker, driven one engine step at a time (vllm_run.py): between steps it hands
    back on a notice and takes a freed drafter's link (module docstring)."""

    abilities: ClassVar[EngineAbilities] = VLLM

    def __init__(self, job: RLJob, stop_ids: list[int], params: SamplingParams, longest_prompt: int,
                 progress: Progress | None) -> None:
        self.stop_ids, self.params = stop_ids, params
        policy = model_dir(job.spec.model.path)
        self.vllm = VllmEngine.for_job(job, read_config(policy).vocab_size, longest_prompt, progress)
        drafting = job.spec.rollout.speculation
        self.draft: TinyLlama | None = None
        if drafting.freed_drafters and drafting.draft_model is not None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            self.draft = load_draft_model(drafting.draft_model, policy, torch.float32, device)

    def run(self, call: RolloutCall, indexes: Mapping[str, HistoryIndex] | None, resume: RolloutProgress | None,
            mailbox: CallMailbox, busy: BusyClock) -> Generator[Report, None, CallEnd]:
        first = {r.prompt_id: r.prompt_ids for r in call.requests}
        self.vllm.set_history(list(first.values()), [(indexes or {}).get(p) for p in first])
        samples, requests, run = call.samples, call.requests, self.vllm.run(self.params, self.stop_ids)
        carried = [resume.results.get(s) if resume else None for s in samples]
        results = {i: r for i, r in enumerate(carried) if r is not None and self._finished(r)}
        arrived, gone, said = set(results), set[int](), False
        run.add_all([(i, r, carried[i]) for i, r in enumerate(requests) if i not in arrived])
        mailbox.open(call.id, 0)  # it admits nothing
        linked = False
        try:
            passes = 0
            while run.busy:
                mail = mailbox.collect()
                if mail.link:
                    linked = self.vllm.draft_from(mail.link[0]) or linked
                taken = {i: run.take(i) for i in run.running() if mail.leaving or samples[i] in mail.release}
                if taken or mail.release:
                    self.vllm.count_drafts([requests[i] for i in taken], list(taken.values()), [carried[i] for i in taken])
                    self.vllm.end_requests([requests[i] for i in taken], list(taken.values()))
                    gone.update(taken)
                    said = mail.leaving
                    yield from handed_back(busy, {samples[i]: r for i, r in taken.items()}, mail.release, mail.leaving)
                    continue
                done = run.step()
                results.update(done)
                self.vllm.end_requests([requests[i] for i, _ in done], [r for _, r in done])
                passes += 1
                if call.report_every and passes % call.report_every == 0:
                    yield from reported(busy, None, StateTag(CallState(
                        {samples[i]: run.generated(i) for i in run.running()},
                        {samples[i]: len(r.response_ids) for i, r in results.items()})))
                    faults.point("rollout-worker", call.step)
        finally:
            run.close()
            mailbox.close()
            if linked:
                self.vllm.draft_from(None)  # the drafter frees what it held for this call
        if mailbox.leaving and not said:  # told to leave as the call ended: nothing to hand back, but say so
            yield from handed_back(busy, {}, set(), leaving=True)
        kept = [i for i in range(len(samples)) if i not in gone]
        ran = [i for i in kept if i not in arrived]
        self.vllm.count_drafts([requests[i] for i in ran], [results[i] for i in ran], [carried[i] for i in ran])
        return CallEnd([samples[i] for i in kept], [results[i] for i in kept],
                       sum(len(c.response_ids) for i in kept if (c := carried[i])), 0,
                       CallState({}, {samples[i]: len(results[i].response_ids) for i in kept}))

    def _finished(self, r: GenResult) -> bool:
        return is_finished(r, self.stop_ids, self.params.max_response_length)

    def load_weights(self, weights: Weights) -> None:
        self.vllm.load_weights(weights)

    def drafter(self) -> TinyLlama | None:
        return self.draft

    def cost_profile(self) -> CostProfile | None:
        """vLLM's pass-cost profile, where it was measured."""
        return self.vllm.profile

    def cap_decisions(self) -> CapDecisions:
        """The draft caps our proposer chose in the last call (its stats since the call's `set_history`);
        none with vLLM's own drafting methods."""
        if self.vllm.settings.method not in OURS:
            return CapDecisions()
        return CapDecisions.from_json(self.vllm.proposer_stats())

    def end_step(self) -> None:
        pass

    def close(self) -> None:
        self.vllm.close()
