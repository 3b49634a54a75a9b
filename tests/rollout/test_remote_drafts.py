"""Drafts from another worker (freed drafters): the verifier's tokens stay plain decoding's whatever the
drafter sends, late, wrong or never, and a stream is used only where the tokens emitted since it was
made are the ones it predicted."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.model.folder import model_dir
from rhymerl.workers.model.tokenizer import CharTokenizer
from rhymerl.workers.model.transformer import TinyLlama, load_model
from rhymerl.workers.rollout.draft_link import DraftStream, News
from rhymerl.workers.rollout.draft_model import load_draft_model
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams
from rhymerl.workers.rollout.remote_drafts import SOURCE, DraftServer, RemoteDrafts
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.rollout.speculators import NgramDrafts
from rhymerl.workers.task import arith_chain

SPEC = SpeculationSpec(method="none", draft_model="builtin:tiny-arith-draft", freed_drafters=True)


class Link:
    """A drafter in this process whose replies arrive `delay` polls after the news went out (0: at the
    next pass), or never (`lost`)."""

    def __init__(self, server: DraftServer, delay: int = 0, lost: bool = False) -> None:
        self.server, self.delay, self.lost = server, delay, lost
        self.pending: list[DraftStream] | None = None
        self.waited = 0
        self.sent: list[list[News]] = []
        self.closed = False

    def send(self, news: Sequence[News]) -> None:
        self.sent.append(list(news))
        self.pending, self.waited = self.server.exchange(news), 0

    def poll(self) -> list[DraftStream] | None:
        if self.lost or self.pending is None or self.waited < self.delay:
            self.waited += 1
            return None
        reply, self.pending = self.pending, None
        return reply

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def policy() -> TinyLlama:
    return load_model(model_dir("builtin:tiny-arith"), torch.float64)


@pytest.fixture(scope="module")
def draft() -> TinyLlama:
    return load_draft_model("builtin:tiny-arith-draft", model_dir("builtin:tiny-arith"), torch.float64)


def _requests(n: int = 3, group: int = 2) -> list[GenRequest]:
    tok = CharTokenizer()
    return [GenRequest(tok.prompt_ids(p.prompt), sample_key(f"a{i}", 1, k), f"a{i}")
            for i, p in enumerate(arith_chain.generate(n, seed=7)) for k in range(group)]


@pytest.mark.parametrize(("temperature", "delay"), [(0.0, 0), (1.0, 0), (1.0, 2)])
def test_drafts_from_a_drafter_keep_plain_decodings_tokens_and_are_counted_as_its(
        policy: TinyLlama, draft: TinyLlama, temperature: float, delay: int) -> None:
    reqs = _requests()
    params = SamplingParams(temperature=temperature, seed=3, max_response_length=48)
    engine = TorchEngine(policy, CharTokenizer().eos_id, max_batch_size=len(reqs))
    plain = engine.generate(reqs, params)
    remote = RemoteDrafts(SPEC, None)
    link = Link(DraftServer(SPEC, draft), delay)
    remote.attach(link)
    out = engine.generate(reqs, params, remote)
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    counted = [r.by_source[SOURCE] for r in out if SOURCE in r.by_source]
    assert sum(c.accepted for c in counted) > 0.3 * sum(c.drafted for c in counted) > 0
    assert remote.messages > 0 and remote.failed is None
    assert {n.seq for n in link.sent[0]} == set(range(len(reqs)))  # every sequence announced whole, once
    assert all(n.prompt is not None for n in link.sent[0]) and all(n.prompt is None for m in link.sent[1:] for n in m
                                                                   if not n.ended)


def test_a_drafter_that_never_answers_or_breaks_costs_drafts_not_tokens(policy: TinyLlama, draft: TinyLlama) -> None:
    reqs = _requests()
    params = SamplingParams(temperature=1.0, seed=4, max_response_length=40)
    engine = TorchEngine(policy, CharTokenizer().eos_id, max_batch_size=len(reqs))
    plain = engine.generate(reqs, params)
    silent = RemoteDrafts(SPEC, None)
    silent.attach(Link(DraftServer(SPEC, draft), lost=True))
    out = engine.generate(reqs, params, silent)
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    assert sum(r.drafted for r in out) == 0 and silent.messages == 0

    class Broken(Link):
        def poll(self) -> list[DraftStream] | None:
            raise ConnectionError("the drafter's pod is gone")

    broken = RemoteDrafts(SPEC, None)
    broken.attach(Broken(DraftServer(SPEC, draft)))
    out = engine.generate(reqs, params, broken)
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    assert broken.link is None and broken.failed == "ConnectionError: the drafter's pod is gone"


def test_the_verifiers_own_drafts_come_first_and_the_drafters_fill_where_it_has_none(
        policy: TinyLlama, draft: TinyLlama) -> None:
    reqs = _requests()
    params = SamplingParams(temperature=1.0, seed=5, max_response_length=48)
    engine = TorchEngine(policy, CharTokenizer().eos_id, max_batch_size=len(reqs))
    plain = engine.generate(reqs, params)
    spec = SpeculationSpec(method="ngram", draft_model="builtin:tiny-arith-draft", freed_drafters=True)
    remote = RemoteDrafts(spec, NgramDrafts(spec, None))
    remote.attach(Link(DraftServer(spec, draft)))
    out = engine.generate(reqs, params, remote)
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    sources = {name for r in out for name in r.by_source}
    assert sources == {"ngram", SOURCE}


class Wrong:
    """A draft source whose every draft is wrong: two pad tokens, which the policy never samples."""

    def begin(self, slot: int, request: GenRequest) -> None: ...

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        return [[CharTokenizer().pad_id] * 2 for _ in slots]

    def settle(self, slots: list[int], drafted: list[int], accepted: list[int], emitted: list[list[int]]) -> None: ...

    def end(self, slot: int) -> None: ...

    def move(self, src: list[int], dst: list[int]) -> None: ...

    def source_of(self, slot: int) -> str:
        return "wrong"


def test_a_sequence_takes_the_drafters_drafts_where_they_keep_predicting_better_than_its_own(
        policy: TinyLlama) -> None:
    reqs = _requests()
    params = SamplingParams(temperature=0.0, seed=5, max_response_length=48)
    engine = TorchEngine(policy, CharTokenizer().eos_id, max_batch_size=len(reqs))
    plain = engine.generate(reqs, params)
    remote = RemoteDrafts(SPEC, Wrong())
    remote.attach(Link(DraftServer(SPEC, policy)))  # the policy drafting for itself, greedily: always right
    out = engine.generate(reqs, params, remote)
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    wrong, theirs = (sum(r.by_source[n].passes for r in out if n in r.by_source) for n in ("wrong", SOURCE))
    # its own drafts come first (a tie), until the drafter's confirm more: then the drafter's stay
    assert 0 < wrong <= 2 * len(reqs) < theirs
    assert sum(r.by_source[SOURCE].accepted for r in out) == sum(r.by_source[SOURCE].drafted for r in out)


def test_a_stream_drafts_only_past_the_tokens_it_predicted() -> None:
    remote = RemoteDrafts(SPEC, None)
    remote.begin(0, GenRequest([1, 2, 3], 0))
    remote.windows.windows[0] = 3
    link = Link(DraftServer.__new__(DraftServer))  # never asked: the stream is set by hand
    remote.link = link
    seq = remote.seqs[0].seq
    remote.streams[seq] = DraftStream(seq, base=3, tokens=(7, 8, 9, 10, 11))
    assert remote._from_stream(0) == [7, 8, 9]
    remote.seqs[0].context += [7, 8]  # the verifier emitted what the stream predicted
    assert remote._from_stream(0) == [9, 10, 11]
    remote.seqs[0].context += [9, 4]  # ... then something else
    assert remote._from_stream(0) == []
    remote.streams[seq] = DraftStream(seq, base=5, tokens=(9, 4))  # all of it emitted already
    assert remote._from_stream(0) == []


def test_a_drafter_takes_news_in_any_order_and_frees_what_ended(draft: TinyLlama) -> None:
    server = DraftServer(SPEC, draft)
    first = server.exchange([News(0, prompt=(1, 5, 6)), News(1, prompt=(1, 7))])
    assert {s.seq: s.base for s in first} == {0: 3, 1: 2}
    again = server.exchange([News(0, tokens=(*first[0].tokens[:1], 3)), News(1, ended=True),
                             News(2, tokens=(4,))])  # news of a sequence never announced: ignored
    assert [(s.seq, s.base) for s in again] == [(0, 5)]
    assert server.free == [server.slots.get(1, 1)] and 1 not in server.slots and 2 not in server.slots
