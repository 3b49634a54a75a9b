"""A vLLM rollout worker on a spot notice: its call hands back, between two engine steps, every
unfinished sample with the tokens and log-probabilities it had, and another worker finishes them
from there. Greedy, so the finished responses are exactly those of one uninterrupted generate.
The notice is forced at a report (a point between engine steps), never timed."""

from __future__ import annotations

from typing import Any

import pytest
from jobs import make_job

pytest.importorskip("vllm")

from rhymerl.api import RLJob
from rhymerl.workers.model.tokenizer import load_job_tokenizer
from rhymerl.workers.roles.rollout_engine import engine_abilities
from rhymerl.workers.roles.rollout_worker import RolloutWorker
from rhymerl.workers.roles.samples import (
    CallState,
    HandbackTag,
    OutputTag,
    RolloutCall,
    RolloutOutput,
    RolloutProgress,
    SampleRef,
    StateTag,
    Tag,
)
from rhymerl.workers.roles.vllm_rollout import VllmRollout
from rhymerl.workers.rollout.generation import GenRequest
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.rollout.vllm_engine import VllmEngine
from rhymerl.workers.task.prompts import encode_prompts, load_prompts

pytestmark = pytest.mark.slow


def _job() -> RLJob:
    return make_job({"model": {"implementation": "transformers"}, "data": {"num_prompts": 6},
                     "algorithm": {"group_size": 2, "prompts_per_step": 3, "max_response_length": 200},
                     "rollout": {"engine": "vllm", "temperature": 0.0, "seed": 0, "max_batch_size": 16,
                                 "speculation": {"method": "ngram"}}}, base="defaults")


def _run(stream: Any, leave: RolloutWorker | None = None) -> tuple[RolloutOutput, list[tuple[object, Tag]], CallState | None]:
    """Drain a call's reports; with `leave`, that worker is told to leave at the first report that
    shows a sample finished and another still running. The output, every (item, tag), and the last
    state reported before the notice."""
    reports: list[tuple[object, Tag]] = []
    before = None
    for item in stream:
        tag = next(stream)
        reports.append((item, tag))
        match tag:
            case StateTag(state) if leave is not None and before is None and state.finished and state.running:
                before = state
                leave.leave()
            case OutputTag():
                return item, reports, before
    raise AssertionError("the call ended without an output")


def test_a_vllm_call_told_to_leave_hands_back_its_unfinished_samples_and_another_worker_finishes_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job()
    worker = RolloutWorker(job)
    rollout = worker.engine
    assert isinstance(rollout, VllmRollout) and rollout.abilities == engine_abilities(job.spec)
    engine = rollout.vllm
    try:
        encoded = encode_prompts(load_job_tokenizer(job), load_prompts(job.spec.data))
        samples = [SampleRef(p, k, 1) for p in sorted(encoded) for k in range(2)]
        requests = [GenRequest(encoded[s.prompt_id], sample_key(s.prompt_id, 1, s.index), s.prompt_id)
                    for s in samples]
        whole = dict(zip(samples, engine.generate(requests, rollout.params, rollout.stop_ids), strict=True))

        out, reports, before = _run(worker.generate(RolloutCall(1, samples, requests, step=1, report_every=1), None),
                                    leave=worker)
        assert before is not None, "no report showed a sample finished while others ran"
        ((progress, tag),) = [(i, t) for i, t in reports if isinstance(t, HandbackTag)]
        assert isinstance(tag, HandbackTag) and isinstance(progress, RolloutProgress)
        hb = tag.handback
        # handed back after the step it was told in: every sample then running, with the tokens it had
        assert hb.leaving and not hb.missed and hb.handed == before.running
        for s, n in hb.handed.items():
            partial = progress.results[s]
            assert partial.response_ids == whole[s].response_ids[:n] and partial.finish_reason == "length"
            assert partial.logprobs == pytest.approx(whole[s].logprobs[:n], abs=1e-4)
        assert out.resumed_tokens == 0 and set(out.samples).isdisjoint(hb.handed)
        assert not engine.llm.llm_engine.has_unfinished_requests()  # aborted in vLLM, not left running
        assert all(r.response_ids == whole[s].response_ids for s, r in zip(out.samples, out.results, strict=True))

        monkeypatch.setattr(VllmEngine, "for_job", lambda *a, **k: engine)  # another worker, the same engine
        other = RolloutWorker(job)
        moved = sorted(hb.handed, key=samples.index)
        rest, _, _ = _run(other.generate(RolloutCall(2, moved, [requests[samples.index(s)] for s in moved], step=1),
                                         None, resume=progress))
        assert sorted(out.samples + rest.samples, key=samples.index) == samples  # none lost, none twice
        assert rest.resumed_tokens == sum(hb.handed.values()) > 0
        for s, r in zip(rest.samples, rest.results, strict=True):
            assert r.response_ids == whole[s].response_ids
            assert r.logprobs == pytest.approx(whole[s].logprobs, abs=1e-4)
    finally:
        engine.close()
