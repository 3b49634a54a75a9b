"""Fastest-of-N in the torch engine: the tokens are plain decoding's, each response moves to the source
whose drafts its own tokens confirm, and the dump records which source drafted what."""

from __future__ import annotations

import pytest
import torch

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.fastest_of_n import FastestOfNDrafts
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.rollout.speculation import speculation_metrics
from rhymerl.workers.rollout.speculators import PROBE_EVERY, DraftCapController, HistoryDrafts, NgramDrafts

EOS = 2


@pytest.fixture
def model(tiny_model: TinyLlama) -> TinyLlama:
    return tiny_model.double()


def _requests() -> list[GenRequest]:
    prompts = [[1, *([5, 9, 11, 7] * 4)], [1, 12, 30, 4, 17, 8], [1, 3, 3, 25]]
    return [GenRequest(p, sample_key(f"p{i}", 3, k), f"p{i}") for i, p in enumerate(prompts) for k in range(3)]


class _Garbage:
    """A source that always offers the same wrong tokens (0 is never sampled: it is padding)."""

    def begin(self, slot: int, request: GenRequest) -> None: ...

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        return [[0, 0, 0] for _ in slots]

    def settle(self, slots: list[int], drafted: list[int], accepted: list[int], emitted: list[list[int]]) -> None: ...

    def end(self, slot: int) -> None: ...

    def move(self, src: list[int], dst: list[int]) -> None: ...

    def source_of(self, slot: int) -> str:
        return "garbage"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_fastest_of_n_drafts_leave_the_tokens_of_plain_decoding(model: TinyLlama, temperature: float) -> None:
    reqs = _requests()
    params = SamplingParams(temperature=temperature, seed=3, max_response_length=40)
    engine = TorchEngine(model, EOS, max_batch_size=4)  # fewer slots than requests: admission and packing move slots
    plain = engine.generate(reqs, params)
    indexes = {f"p{i}": HistoryIndex.build([(r.response_ids, 1.0) for r in plain[3 * i: 3 * i + 2]]) for i in range(3)}
    spec = SpeculationSpec()
    drafts = FastestOfNDrafts({"history": HistoryDrafts(spec, indexes, None), "ngram": NgramDrafts(spec, None),
                               "garbage": _Garbage()}, DraftCapController(spec))
    out = engine.generate(reqs, params, drafts)
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    assert sum(r.accepted for r in out) > 0
    for r in out:  # per source, the counts add up to the response's own
        assert sum(c.drafted for c in r.by_source.values()) == r.drafted
        assert sum(c.accepted for c in r.by_source.values()) == r.accepted


def _greedy_with_known_history(model: TinyLlama) -> tuple[TorchEngine, SamplingParams, list[GenResult],
                                                          dict[str, HistoryIndex]]:
    """An engine, greedy sampling, its plain responses to `_requests()`, and history indexes of exactly
    those responses (greedy decoding repeats them, so history drafts are right)."""
    params = SamplingParams(temperature=0.0, seed=3, max_response_length=40)
    engine = TorchEngine(model, EOS, max_batch_size=9)
    plain = engine.generate(_requests(), params)
    indexes = {f"p{i}": HistoryIndex.build([(r.response_ids, 1.0) for r in plain[3 * i: 3 * i + 3]]) for i in range(3)}
    return engine, params, plain, indexes


def test_a_response_leaves_a_source_whose_drafts_its_tokens_refute(model: TinyLlama) -> None:
    engine, params, plain, indexes = _greedy_with_known_history(model)
    reqs = _requests()
    # the garbage source is listed first, so it wins the first pass's tie and then loses every
    # response to history
    spec = SpeculationSpec()
    drafts = FastestOfNDrafts({"garbage": _Garbage(), "history": HistoryDrafts(spec, indexes, None)},
                              DraftCapController(spec))
    out = engine.generate(reqs, params, drafts)
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    for r in out:
        garbage = r.by_source.get("garbage")
        assert garbage is not None and garbage.passes == 1 and garbage.accepted == 0
        assert r.by_source["history"].passes >= 1
    totals = speculation_metrics(sum(len(r.response_ids) for r in out), sum(r.drafted for r in out),
                                 sum(r.accepted for r in out), sum(r.forward_passes for r in out),
                                 {"garbage": out[0].by_source["garbage"], "history": out[0].by_source["history"]})
    sources = totals["spec_sources"]
    assert sources["garbage"]["acceptance"] == 0.0
    assert sources["garbage"]["share"] + sources["history"]["share"] == pytest.approx(1.0)


def test_a_parked_pass_drafts_from_no_source(model: TinyLlama) -> None:
    spec = SpeculationSpec(disable_above_batch=1)  # two sequences: every pass over the limit runs plain
    reqs = _requests()[:2]  # two samples of one prompt, decoded greedily: they end together
    params = SamplingParams(temperature=0.0, seed=3, max_response_length=16)
    engine = TorchEngine(model, EOS, max_batch_size=2)
    drafts = FastestOfNDrafts({"garbage": _Garbage(), "ngram": NgramDrafts(spec, None)}, DraftCapController(spec))
    out = engine.generate(reqs, params, drafts)
    assert all(r.drafted == 0 and not r.by_source for r in out)
    assert torch.tensor([len(r.response_ids) for r in out]).min() > 0


class _Counting(_Garbage):
    """A costly source that drafts nothing useful and counts the sequences it was asked for."""

    def __init__(self) -> None:
        self.asked = 0

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        self.asked += len(slots)
        return super().propose(slots, batch_size)

    def source_of(self, slot: int) -> str:
        return "costly"

    def draft_seconds(self, slots: list[int]) -> float | None:
        return None

    def probe(self, slots: list[int], batch_size: int) -> list[list[int]]:
        return self.propose(slots, batch_size)


def test_a_costly_source_that_loses_is_asked_only_on_probes(model: TinyLlama) -> None:
    engine, params, plain, indexes = _greedy_with_known_history(model)
    reqs = _requests()
    spec = SpeculationSpec()
    costly = _Counting()
    drafts = FastestOfNDrafts({"history": HistoryDrafts(spec, indexes, None), "costly": costly},
                              DraftCapController(spec), costly={"costly": costly})
    out = engine.generate(reqs, params, drafts)
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    drafting_passes = sum(r.forward_passes - 1 for r in out)  # the prefill pass drafts nothing
    # asked on each sequence's first drafting pass and every PROBE_EVERY-th after, never in between
    assert len(reqs) <= costly.asked <= len(reqs) + drafting_passes / PROBE_EVERY
    assert all("costly" not in r.by_source for r in out)


class _CountedHistory(HistoryDrafts):
    """History drafts (right, with the known history) standing in for a costly source of a set price:
    counts the sequences it was asked for."""

    asked = 0
    price: float | None = None

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        self.asked += len(slots)
        return super().propose(slots, batch_size)

    def draft_seconds(self, slots: list[int]) -> float | None:
        return self.price

    def probe(self, slots: list[int], batch_size: int) -> list[list[int]]:
        return self.propose(slots, batch_size)


@pytest.mark.parametrize(("price", "asked_every_pass"), [(None, True), (1e6, False)])
def test_a_costly_source_that_adds_no_tokens_for_its_seconds_is_asked_only_on_probes(
        model: TinyLlama, price: float | None, asked_every_pass: bool) -> None:
    # both sources draft the right tokens, the costly one listed first so it leads every tie: its lead
    # adds nothing over history, so once its drafting is priced it is asked only on probes
    engine, params, plain, indexes = _greedy_with_known_history(model)
    reqs = _requests()
    spec = SpeculationSpec()
    costly = _CountedHistory(spec, indexes, None)
    costly.price = price
    control = DraftCapController(spec, CostProfile((1, 64), (1, 33), ((1.0, 1.0), (1.0, 1.0))))
    drafts = FastestOfNDrafts({"costly": costly, "history": HistoryDrafts(spec, indexes, None)}, control,
                              costly={"costly": costly})
    out = engine.generate(reqs, params, drafts)
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    drafting_passes = sum(r.forward_passes - 1 for r in out)
    if asked_every_pass:
        assert costly.asked >= drafting_passes
    else:
        assert costly.asked <= len(reqs) + drafting_passes / PROBE_EVERY
        assert sum(r.by_source["history"].passes for r in out) > sum(
            r.by_source["costly"].passes for r in out if "costly" in r.by_source)


class _Silent(_Garbage):
    """A source with nothing to offer."""

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        return [[] for _ in slots]


class _Probed(_Garbage):
    """A costly source priced out of reach whose probes draft the right token: it records the passes
    it was probed on."""

    def __init__(self) -> None:
        self.probed: list[int] = []
        self.passes = 0

    def draft_seconds(self, slots: list[int]) -> float | None:
        return 1e6

    def probe(self, slots: list[int], batch_size: int) -> list[list[int]]:
        self.probed.append(self.passes)
        return [[5] for _ in slots]


def test_while_a_costly_source_wins_no_paid_lead_its_probes_thin_out() -> None:
    spec = SpeculationSpec()
    control = DraftCapController(spec, CostProfile((1, 64), (1, 33), ((1.0, 1.0), (1.0, 1.0))))
    costly = _Probed()
    drafts = FastestOfNDrafts({"silent": _Silent(), "costly": costly}, control, costly={"costly": costly})
    drafts.begin(0, GenRequest([1, 2, 3], 0))
    for p in range(200):
        costly.passes = p
        (draft,) = drafts.propose([0], 1)
        drafts.settle([0], [len(draft)], [len(draft)], [[*draft, 6]])
    # it leads after its first probe, but never pays: probed at 0, then after 32, 64, 128 passes of gaps
    assert costly.probed == [0, 32, 64, 128]
