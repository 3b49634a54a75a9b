"""The HistoSpec proposer vLLM calls, driven without vLLM by a stand-in engine that does what vLLM's
model runner does to it: rows in any order, requests leaving and coming back (preemption), a
greedy verifier that accepts the longest correct prefix of each draft and appends one token.

The reference is the torch engine's way of drafting: one `HistoryDrafter` handle per request,
driven with that request's own events. Whatever happens to the rows, each request must get
exactly the draft its reference gets."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs import make_job

from rhymerl.algorithms.drafting.index import HistoryDrafter, HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.model.folder import ModelError, model_dir
from rhymerl.workers.rollout.draft_link import DraftStream, LocalDraftLink, News
from rhymerl.workers.rollout.fastest_of_n import FastestOfNDrafts, job_sources
from rhymerl.workers.rollout.generation import GenRequest
from rhymerl.workers.rollout.speculators import DraftCapController
from rhymerl.workers.rollout.vllm_engine import VllmSettings, job_settings
from rhymerl.workers.rollout.vllm_proposer import FILLER, HistoryProposer

K = 8
MAX_LEN = 256


def _config(k: int = K, max_len: int = MAX_LEN) -> SimpleNamespace:
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_len))


def _spec(group_drafts: bool = False) -> SpeculationSpec:
    """History drafts alone by default: the reference drafter below knows no groups."""
    return SpeculationSpec.model_validate({"window": {"initial": 2, "step": 2, "max": K}, "group_drafts": group_drafts})


@dataclass
class _Request:
    prompt: list[int]
    target: list[int]  # what the (greedy) model generates
    tokens: list[int] = field(default_factory=list)  # prompt + generated so far
    ref: int = -1  # reference drafter handle
    ref_draft: list[int] = field(default_factory=list)
    ref_fed: int = 0  # generated tokens the reference drafter has seen
    passes: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def done(self) -> bool:
        return len(self.tokens) - len(self.prompt) >= len(self.target)


def _world(seed: int, n_prompts: int, group: int) -> tuple[list[_Request], dict[tuple[int, ...], HistoryIndex]]:
    """Prompts with histories of noisy copies of one response; each request's target is another noisy copy."""
    rng = random.Random(seed)
    requests, indexes = [], {}
    for p in range(n_prompts):
        prompt = [1] + [rng.randrange(3, 30) for _ in range(rng.randrange(3, 8))]
        base = [rng.randrange(3, 30) for _ in range(rng.randrange(20, 60))]

        def noisy(base: list[int] = base) -> list[int]:
            return [t if rng.random() > 0.1 else rng.randrange(3, 30) for t in base]

        if p % 5 != 4:  # every fifth prompt has no history
            indexes[tuple(prompt)] = HistoryIndex.build([(noisy(), rng.random()) for _ in range(4)])
        requests += [_Request(prompt, noisy(), list(prompt)) for _ in range(group)]
    return requests, indexes


def _run(seed: int, n_prompts: int, group: int, preempt: float) -> tuple[list[_Request], HistoryProposer]:
    rng = random.Random(seed)
    spec = _spec()
    requests, indexes = _world(seed, n_prompts, group)
    proposer = HistoryProposer(_config())
    proposer.configure(spec, None)
    prompts = sorted({tuple(r.prompt) for r in requests})
    proposer.set_step([list(p) for p in prompts], [indexes.get(p) for p in prompts])
    reference = HistoryDrafter(spec)
    for r in requests:
        index = indexes.get(tuple(r.prompt))
        if index is not None:
            r.ref = reference.add(index)
    # vLLM's order within a step: verify the rows' drafts, append what was accepted plus one sampled
    # token, then ask for the next drafts (a request that just finished is still a row then)
    for r in requests:  # the prefill step samples each request's first token
        r.tokens.append(r.target[0])
    drafts: dict[int, list[int]] = {}
    rows = list(requests)
    while rows:
        for r in rows:
            if id(r) in drafts:
                _verify(r, drafts[id(r)], reference)
        rng.shuffle(rows)
        table = np.full((len(rows) + 3, MAX_LEN), 7, dtype=np.int32)  # spare rows and stale tokens, as in vLLM
        lengths = np.zeros(len(rows) + 3, dtype=np.int32)
        for i, r in enumerate(rows):
            table[i, :len(r.tokens)] = r.tokens
            lengths[i] = len(r.tokens)
        proposed = proposer.propose([[1]] * len(rows), lengths[:len(rows)], table)
        for r, draft in zip(rows, proposed, strict=True):
            r.passes += 1
            assert draft == _reference_draft(r, reference), (r.prompt, len(r.tokens))
            drafts[id(r)] = draft
        pending = [r for r in requests if not r.done]
        rows = [r for r in pending if rng.random() >= preempt] or pending[:1]
    return requests, proposer


def _reference_draft(r: _Request, reference: HistoryDrafter) -> list[int]:
    """What the request's own drafter proposes after seeing what it generated since its last draft."""
    return _drafted(r, reference) if r.ref >= 0 else []


def _drafted(r: _Request, reference: HistoryDrafter) -> list[int]:
    new = r.tokens[len(r.prompt) + r.ref_fed:]
    r.ref_fed += len(new)
    reference.feed(np.array([r.ref]), np.array([0, len(new)]), np.array(new, dtype=np.int32))
    room = min(K, MAX_LEN - len(r.tokens) - 1)
    offsets, toks = reference.draft(np.array([r.ref]), np.array([room], dtype=np.int32))
    r.ref_draft = toks[offsets[0]:offsets[1]].tolist()
    return r.ref_draft


def _verify(r: _Request, draft: list[int], reference: HistoryDrafter) -> None:
    """Greedy verification against the target: the longest correct prefix, then one more token."""
    truth = r.target[len(r.tokens) - len(r.prompt):]
    accepted = 0
    while accepted < len(draft) and accepted < len(truth) and draft[accepted] == truth[accepted]:
        accepted += 1
    if draft:
        r.drafted += len(draft)
        r.accepted += accepted
        reference.report(np.array([r.ref]), np.array([accepted], dtype=np.int32))
    r.tokens += truth[: accepted + 1]


def test_each_request_gets_its_own_drafts_whatever_the_row_order_and_preemption() -> None:
    requests, proposer = _run(seed=1, n_prompts=40, group=8, preempt=0.2)  # 320 concurrent requests
    assert len(requests) == 320
    assert proposer.stats.fresh_rows == len(requests)  # each found again by content on every later step
    assert proposer.stats.accepted > 0 and proposer.stats.drafted > proposer.stats.accepted


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), preempt=st.sampled_from([0.0, 0.3, 0.7]))
def test_drafts_follow_the_request_not_the_row(seed: int, preempt: float) -> None:
    _run(seed, n_prompts=6, group=4, preempt=preempt)


def test_request_stats_count_each_requests_passes_drafts_and_acceptance() -> None:
    requests, proposer = _run(seed=2, n_prompts=10, group=4, preempt=0.3)
    stats = proposer.request_stats([r.tokens for r in requests])
    assert [s[:3] for s in stats] == [(r.passes, r.drafted, r.accepted) for r in requests]
    for (_, drafted, accepted, by_source), r in zip(stats, requests, strict=True):  # every draft was history's
        assert set(by_source) <= {"history"} and (drafted == 0) == (not by_source)
        if by_source:
            h = by_source["history"]
            assert (h.drafted, h.accepted) == (drafted, accepted) and 0 < h.passes < r.passes


def test_fastest_of_n_gives_each_request_the_drafts_of_the_torch_engines_source_run_on_it_alone() -> None:
    """The proposer runs the torch engine's Fastest-of-N (history and n-gram) per request: the same
    drafts as one `job_sources` per request driven with that request's own events."""
    rng = random.Random(4)
    spec = SpeculationSpec.model_validate({"method": "fastest-of-n", "window": {"initial": 2, "step": 2, "max": K},
                                           "group_drafts": False})
    requests, indexes = _world(4, 8, 4)
    for r in requests[::3]:  # some targets repeat their own prompt: n-gram drafts them
        r.target = (r.prompt * 12)[:len(r.target)]
    proposer = HistoryProposer(_config())
    proposer.configure(spec, None)
    prompts = sorted({tuple(r.prompt) for r in requests})
    proposer.set_step([list(p) for p in prompts], [indexes.get(p) for p in prompts])
    by_pid = {str(i): indexes[p] for i, p in enumerate(prompts) if p in indexes}
    refs = {id(r): job_sources(spec, by_pid, DraftCapController(spec, None)) for r in requests}
    for r in requests:
        ref = refs[id(r)]
        ref.begin(0, GenRequest(prompt_ids=r.prompt, sample_id=0, prompt_id=str(prompts.index(tuple(r.prompt)))))
        r.tokens.append(r.target[0])
        ref.settle([0], [0], [0], [[r.target[0]]])
    rows, sources = list(requests), set()
    while rows:
        rng.shuffle(rows)
        table = np.zeros((len(rows), MAX_LEN), dtype=np.int32)
        for i, r in enumerate(rows):
            table[i, :len(r.tokens)] = r.tokens
        proposed = proposer.propose([[1]] * len(rows), np.array([len(r.tokens) for r in rows]), table)
        for r, draft in zip(rows, proposed, strict=True):
            ref = refs[id(r)]
            assert draft == ref.propose([0], len(rows))[0]
            if draft:
                sources.add(ref.source_of(0))
            truth = r.target[len(r.tokens) - len(r.prompt):]
            accepted = next((j for j, (d, t) in enumerate(zip(draft, truth, strict=False)) if d != t),
                            min(len(draft), len(truth)))
            r.tokens += truth[: accepted + 1]
            ref.settle([0], [len(draft)], [accepted], [truth[: accepted + 1]])
        rows = [r for r in rows if not r.done]
    assert sources == {"history", "ngram"}
    counted = [s[3] for s in proposer.request_stats([r.tokens for r in requests])]
    assert {name for c in counted for name in c} == sources


def test_identical_requests_share_drafts_and_are_each_counted() -> None:
    requests, indexes = _world(3, 1, 1)
    index = next(iter(indexes.values()))
    proposer = HistoryProposer(_config())
    proposer.configure(_spec(), None)
    prompt = requests[0].prompt
    proposer.set_step([prompt], [index])
    row = prompt + requests[0].target[:5]
    table = np.array([row + [0] * (MAX_LEN - len(row))] * 3, dtype=np.int32)
    drafts = proposer.propose([[1]] * 3, np.array([len(row)] * 3), table)
    assert drafts[0] == drafts[1] == drafts[2] and drafts[0]
    table2 = table.copy()
    drafts2 = proposer.propose([[1]] * 3, np.array([len(row) + 1] * 3), table2)
    assert proposer.stats.matched_rows == 3 and len(drafts2) == 3
    assert [s[0] for s in proposer.request_stats([[*row, 0]] * 3)] == [2, 2, 2]


def test_the_longest_matching_prompt_wins() -> None:
    short, long = [1, 5, 6], [1, 5, 6, 7, 8]
    proposer = HistoryProposer(_config())
    proposer.configure(_spec(), None)
    proposer.set_step([short, long], [HistoryIndex.build([([9, 9, 9, 9, 9, 9], 1.0)]),
                                      HistoryIndex.build([([4, 4, 4, 4, 4, 4], 1.0)])])
    table = np.zeros((1, MAX_LEN), dtype=np.int32)
    table[0, :7] = [*long, 4, 4]
    assert proposer.propose([[4]], np.array([7]), table)[0][:2] == [4, 4]


def test_rows_without_a_sampled_token_or_without_history_get_no_draft() -> None:
    proposer = HistoryProposer(_config())
    proposer.configure(_spec(), None)
    proposer.set_step([[1, 5, 6]], [None])
    table = np.zeros((2, MAX_LEN), dtype=np.int32)
    table[:, :5] = [1, 5, 6, 3, 3]
    assert proposer.propose([[3], []], np.array([5, 5]), table) == [[], []]


def test_requests_of_a_group_draft_for_each_other_without_history() -> None:
    proposer = HistoryProposer(_config())
    proposer.configure(_spec(group_drafts=True), None)
    prompt = [1, 5, 6]
    proposer.set_step([prompt, [1, 9]], [None, None])
    table = np.zeros((3, MAX_LEN), dtype=np.int32)
    table[0, :7] = [*prompt, 11, 12, 13, 14]   # ahead
    table[1, :5] = [*prompt, 11, 12]           # behind: the one ahead drafts for it
    table[2, :4] = [1, 9, 11, 12]              # another prompt's group has nothing to offer
    assert proposer.propose([[14], [12], [12]], np.array([7, 5, 4]), table) == [[], [13, 14], []]


class _Listener:
    """A freed worker's drafting end (RolloutWorker.exchange) that records what it hears and drafts nothing."""

    def __init__(self) -> None:
        self.heard: list[list[News]] = []
        self.dropped: list[object] = []

    def exchange(self, link: object, news: list[News]) -> list[DraftStream]:
        self.heard.append(list(news))
        return []

    def drop_link(self, link: object) -> None:
        self.dropped.append(link)


def test_a_freed_drafter_hears_a_finished_request_end_and_the_link_is_dropped_with_the_step() -> None:
    proposer = HistoryProposer(_config())
    proposer.configure(_spec().model_copy(update={"freed_drafters": True}), None)
    prompt = [1, 5, 6]
    proposer.set_step([prompt], [None])
    drafter = _Listener()
    assert proposer.draft_from(LocalDraftLink(drafter, "0:7:1"))
    table = np.zeros((2, MAX_LEN), dtype=np.int32)
    table[0, :5], table[1, :5] = [*prompt, 11, 12], [*prompt, 21, 22]
    proposer.propose([[12], [22]], np.array([5, 5]), table)
    proposer.end_requests([[*prompt, 11, 12, 13]])  # the first finished in the next engine step
    table[0, :6] = [*prompt, 21, 22, 23]
    proposer.propose([[23]], np.array([6]), table[:1])
    first, second = drafter.heard
    seqs = {n.prompt: n.seq for n in first}
    assert sorted(seqs) == [(*prompt, 11, 12), (*prompt, 21, 22)]
    assert second == [News(seqs[(*prompt, 11, 12)], ended=True), News(seqs[(*prompt, 21, 22)], tokens=(23,))]
    proposer.set_step([prompt], [None])
    assert drafter.dropped == ["0:7:1"]


def test_a_forced_draft_offers_filler_on_every_sampling_row_within_the_length() -> None:
    proposer = HistoryProposer(_config(k=4, max_len=10))
    proposer.force = 3
    table = np.zeros((3, 10), dtype=np.int32)
    assert proposer.propose([[1], [1], []], np.array([4, 8, 4]), table) == [[FILLER] * 3, [FILLER], []]


def test_engine_settings_whose_method_and_speculation_method_differ_are_refused() -> None:
    with pytest.raises(ValueError, match=r"method fastest-of-n: our proposer runs speculation\.method, which is history"):
        VllmSettings(Path("m"), method="fastest-of-n")
    assert VllmSettings(Path("m"), method="fastest-of-n", speculation=SpeculationSpec(method="fastest-of-n"))


def test_a_vllm_jobs_fastest_of_n_drafts_with_the_draft_model_it_names_loaded_by_the_proposer() -> None:
    """The spec accepts fastest-of-n with a draft model on vLLM; the engine settings carry its folder,
    checked against the policy, and the proposer configured with it drafts with all three sources."""
    job = make_job("rollout.engine=vllm", "rollout.speculation.method=fastest-of-n",
                   "rollout.speculation.draft_model=builtin:tiny-arith-draft")
    settings = job_settings(job, 64)
    assert settings.draft_model == model_dir("builtin:tiny-arith-draft") and settings.method == "fastest-of-n"
    proposer = HistoryProposer(_config())
    proposer.configure(job.spec.rollout.speculation, None, str(settings.draft_model))
    assert proposer.draft is not None and proposer.draft_folder == str(settings.draft_model)
    proposer.set_step([[1, 5, 9]], [None])
    assert isinstance(proposer.source, FastestOfNDrafts) and proposer.source.names == ["history", "ngram", "draft-model"]
    proposer.configure(job.spec.rollout.speculation, None)  # no folder: history and n-gram alone
    assert proposer.draft is None and isinstance(proposer.source, FastestOfNDrafts)
    assert proposer.source.names == ["history", "ngram"]


def test_a_draft_model_of_another_vocabulary_is_refused_for_vllm_naming_the_field(tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(model_dir("builtin:tiny-arith-draft"), other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config | {"vocab_size": config["vocab_size"] + 1}))
    job = make_job("rollout.engine=vllm", "rollout.speculation.method=fastest-of-n",
                   f"rollout.speculation.draft_model={other}")
    with pytest.raises(ModelError, match=r"spec\.rollout\.speculation\.draft_model: .* a draft model must use the "
                                         r"policy's tokenizer"):
        job_settings(job, 64)
