"""Real draft sources inside the engine: n-gram and HistoSpec drafts never change the tokens."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import torch

from rhymerl.algorithms.drafting.adaptive_cap import AcceptanceTracker, CostProfile
from rhymerl.algorithms.drafting.index import HistoryDrafter, HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.rollout.speculators import PROBE_EVERY, DraftCapController, HistoryDrafts, NgramDrafts

EOS = 2


def _requests(n: int, group: int = 4) -> list[GenRequest]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        prompt = [1] + [rng.randrange(3, 40) for _ in range(rng.randrange(2, 10))]
        out += [GenRequest(prompt, sample_key(f"p{i}", 2, k), f"p{i}") for k in range(group)]
    return out


def _history(results: list[GenResult], group: int = 4) -> dict[str, HistoryIndex]:
    """Each prompt's index built from these responses (as `_requests` orders them), equally weighted."""
    return {f"p{i}": HistoryIndex.build([(r.response_ids, 1.0) for r in results[group * i: group * (i + 1)]])
            for i in range(len(results) // group)}


@pytest.fixture
def model(tiny_model: TinyLlama) -> TinyLlama:
    return tiny_model.double()


def test_history_drafts_from_last_epoch_are_accepted_and_change_nothing(model: TinyLlama) -> None:
    reqs = _requests(3)
    params = SamplingParams(temperature=0.0, seed=1, max_response_length=48)
    engine = TorchEngine(model, EOS, max_batch_size=5)
    plain = engine.generate(reqs, params)
    # last epoch's responses: the same greedy continuations, so history drafts are right
    indexes = _history(plain)
    control = DraftCapController(SpeculationSpec())
    spec = engine.generate(reqs, params, HistoryDrafts(SpeculationSpec(), indexes, control))
    assert [r.response_ids for r in spec] == [r.response_ids for r in plain]
    assert sum(r.accepted for r in spec) > 0.5 * sum(len(r.response_ids) for r in spec)
    assert sum(r.forward_passes for r in spec) < 0.5 * sum(r.forward_passes for r in plain)


def test_history_drafts_at_temperature_one_keep_the_sampled_tokens(model: TinyLlama) -> None:
    reqs = _requests(3)
    params = SamplingParams(temperature=1.0, seed=4, max_response_length=40)
    engine = TorchEngine(model, EOS, max_batch_size=12)
    last_epoch = engine.generate([GenRequest(r.prompt_ids, r.sample_id + 1, r.prompt_id) for r in reqs], params)
    indexes = {f"p{i}": HistoryIndex.build([(r.response_ids, float(k)) for k, r in
                                            enumerate(last_epoch[4 * i: 4 * i + 4])]) for i in range(3)}
    plain = engine.generate(reqs, params)
    spec = engine.generate(reqs, params, HistoryDrafts(SpeculationSpec(), indexes, DraftCapController(SpeculationSpec())))
    assert [r.response_ids for r in spec] == [r.response_ids for r in plain]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ngram_drafts_change_nothing(model: TinyLlama, temperature: float) -> None:
    # prompts that repeat themselves give the n-gram matcher something to find
    reqs = [GenRequest([1, *([5, 9, 11, 7] * 6)], sample_key("rep", k), "rep") for k in range(6)]
    params = SamplingParams(temperature=temperature, seed=2, max_response_length=40)
    engine = TorchEngine(model, EOS, max_batch_size=6)
    plain = engine.generate(reqs, params)
    spec = engine.generate(reqs, params, NgramDrafts(SpeculationSpec(), DraftCapController(SpeculationSpec()),
                                                     match=(1, 3)))
    assert [r.response_ids for r in spec] == [r.response_ids for r in plain]
    assert sum(r.drafted for r in spec) > 0


def _drive(control: DraftCapController, batches: list[int]) -> list[int | None]:
    """What a draft source does each pass: ask whether speculation is parked, else for a cap
    (None = parked: the drafter was not asked)."""
    return [None if control.parked(b) else control.cap(b) for b in batches]


def test_the_controller_parks_speculation_for_poor_drafts_but_keeps_probing() -> None:
    # verifying costs in proportion to tokens appended: poor drafts never pay
    prof = CostProfile((1, 64), (1, 33), ((1.0, 33.0), (64.0, 64.0 * 33)))
    control = DraftCapController(SpeculationSpec(), prof, AcceptanceTracker(prior=0.05))
    # choose off and park 1, 2, 4, 8 passes (backing off), then PROBE_EVERY - 1; then probe at
    # the initial window, choose off again, park PROBE_EVERY - 1, probe ...
    ramp = [x for n in (1, 2, 4, 8) for x in [0] + [None] * n]
    cycle = [0] + [None] * (PROBE_EVERY - 1) + [SpeculationSpec().window.initial]
    caps = _drive(control, [64] * (len(ramp) + 2 * len(cycle)))
    assert caps == ramp + cycle + cycle
    assert control.probes == 2


def test_nothing_on_offer_is_plain_decoding_without_parking() -> None:
    prof = CostProfile((1, 64), (1, 33), ((1.0, 1.0), (1.0, 1.0)))
    control = DraftCapController(SpeculationSpec(), prof, AcceptanceTracker(prior=0.9))
    # young sequences, not matching their history yet, then matching
    caps = [None if control.parked(4) else control.cap(4, lengths) for lengths in ([0] * 4, [0] * 4, [3] * 4)]
    assert caps == [0, 0, 4]


def test_a_passing_dip_costs_a_short_park() -> None:
    prof = CostProfile((1, 64), (1, 33), ((1.0, 1.0), (1.0, 1.0)))  # drafts are free: any acceptance pays
    control = DraftCapController(SpeculationSpec(), prof, AcceptanceTracker(prior=0.9))
    assert _drive(control, [8, 8]) == [32, 32]
    control.spec.disable_above_batch = 7  # a moment where the rules say off ...
    assert _drive(control, [8, 8, 8]) == [0, None, 0]
    control.spec.disable_above_batch = None  # ... is over after a park of one pass, then two
    assert _drive(control, [8, 8, 8]) == [None, None, 32]


def test_a_halved_batch_ends_the_park_early() -> None:
    prof = CostProfile((1, 64), (1, 33), ((1.0, 33.0), (64.0, 64.0 * 33)))
    control = DraftCapController(SpeculationSpec(), prof, AcceptanceTracker(prior=0.05))
    caps = _drive(control, [64, 64, 64, 64, 64, 64, 40, 32, 32])
    # off, park 1, off, park 2, off, park 4 ... but 32 is half of 64: chosen afresh, parked again
    assert caps == [0, None, 0, None, None, 0, None, 0, None]
    assert control.probes == 0


def test_disable_above_batch_overrides_the_profile() -> None:
    control = DraftCapController(SpeculationSpec(disable_above_batch=8))
    assert control.cap(8) == 32 and control.cap(9) == 0


def test_a_sequence_without_history_is_generated_plainly(model: TinyLlama) -> None:
    reqs = _requests(2)
    params = SamplingParams(temperature=1.0, seed=3, max_response_length=20)
    engine = TorchEngine(model, EOS, max_batch_size=8)
    drafts = HistoryDrafts(SpeculationSpec(group_drafts=False), {}, DraftCapController(SpeculationSpec()))
    out = engine.generate(reqs, params, drafts)
    assert sum(r.drafted for r in out) == 0
    assert torch.tensor([len(r.response_ids) for r in out]).min() >= 1


def test_the_time_between_choices_calibrates_the_cost_model() -> None:
    prof = CostProfile((1, 64), (1, 33), ((0.02, 0.02), (0.02, 0.02)))  # every pass predicted at 20 ms
    control = DraftCapController(SpeculationSpec(), prof, AcceptanceTracker(prior=0.9))
    control.cap(4, [3, 3, 3, 3])  # a speculative pass ...
    time.sleep(0.04)              # ... that took 20 ms more than its prediction
    control.cap(4, [0, 0, 0, 0])  # nothing on offer: a plain pass
    assert control.calibration.spec is not None and 0.015 <= control.calibration.spec <= 0.08
    assert control.calibration.plain is None


def _steep_profile() -> CostProfile:
    # a second draft token per sequence costs hundreds of passes: only 1-token drafts can pay
    return CostProfile((1, 64), (1, 2, 3, 33), ((1.0, 1.05, 1000.0, 2000.0), (1.0, 1.05, 1000.0, 2000.0)))


def test_drafts_cut_to_the_chosen_cap_still_change_nothing(model: TinyLlama) -> None:
    reqs = _requests(3)
    params = SamplingParams(temperature=0.0, seed=1, max_response_length=48)
    engine = TorchEngine(model, EOS, max_batch_size=12)
    plain = engine.generate(reqs, params)
    indexes = _history(plain)
    control = DraftCapController(SpeculationSpec(), _steep_profile(), AcceptanceTracker(prior=0.99))
    spec = engine.generate(reqs, params, HistoryDrafts(SpeculationSpec(), indexes, control))
    assert [r.response_ids for r in spec] == [r.response_ids for r in plain]
    # the AIMD windows grow to 32 underneath, but no pass verified more than the 1-token cap
    assert set(control.caps_chosen) <= {0, 1}
    assert max(r.drafted / r.forward_passes for r in spec) <= 1.0
    assert sum(r.accepted for r in spec) > 0


def test_ngram_drafts_cut_to_the_chosen_cap_change_nothing(model: TinyLlama) -> None:
    reqs = [GenRequest([1, *([5, 9, 11, 7] * 6)], sample_key("rep", k), "rep") for k in range(6)]
    params = SamplingParams(temperature=1.0, seed=2, max_response_length=40)
    engine = TorchEngine(model, EOS, max_batch_size=6)
    plain = engine.generate(reqs, params)
    control = DraftCapController(SpeculationSpec(), _steep_profile(), AcceptanceTracker(prior=0.99))
    spec = engine.generate(reqs, params, NgramDrafts(SpeculationSpec(prefix={"min": 1, "max": 3}), control))
    assert [r.response_ids for r in spec] == [r.response_ids for r in plain]
    # a cap of 2 pays only when few sequences offer 2 tokens (a pass is priced by its real tokens)
    assert set(control.caps_chosen) <= {0, 1, 2}
    assert max(r.drafted / r.forward_passes for r in spec) <= 2.0


def test_a_drafter_catching_up_after_a_park_drafts_what_an_always_fed_one_drafts() -> None:
    rng = random.Random(5)
    history = [[rng.randrange(3, 12) for _ in range(60)] for _ in range(4)]
    index = HistoryIndex.build([(r, 1.0) for r in history])
    eager = HistoryDrafts(SpeculationSpec(), {"p": index}, DraftCapController(SpeculationSpec()))
    lazy = HistoryDrafts(SpeculationSpec(), {"p": index}, DraftCapController(SpeculationSpec()))
    for d in (eager, lazy):
        d.begin(0, GenRequest([1, 4], 7, "p"))
    stream = history[1][:40]
    for pos in range(0, 40, 4):
        emitted = stream[pos: pos + 4]
        assert eager.propose([0], 1)  # fed (and asked) every pass
        eager.settle([0], [0], [0], [emitted])  # nothing verified: the AIMD window stays
        lazy.settle([0], [0], [0], [emitted])   # never asked: tokens wait in `pending`
    assert lazy.pending[0] == stream
    assert lazy.propose([0], 1) == eager.propose([0], 1) != [[]]
    assert lazy.pending[0] == []


class _CountingDrafter:
    def __init__(self, inner: HistoryDrafter) -> None:
        self.inner, self.draft_calls = inner, 0

    def draft(self, *args: Any) -> Any:
        self.draft_calls += 1
        return self.inner.draft(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_parked_speculation_does_not_ask_the_drafter(model: TinyLlama) -> None:
    reqs = _requests(3)
    params = SamplingParams(temperature=0.0, seed=3, max_response_length=60)
    engine = TorchEngine(model, EOS, max_batch_size=12)
    plain = engine.generate(reqs, params)
    # right drafts on offer, but the profile says no draft token is ever worth its cost
    indexes = _history(plain)
    prohibitive = CostProfile((1, 64), (1, 2, 33), ((1.0, 1000.0, 2000.0), (1.0, 1000.0, 2000.0)))
    control = DraftCapController(SpeculationSpec(), prohibitive, AcceptanceTracker(prior=0.99))
    source = HistoryDrafts(SpeculationSpec(), indexes, control)
    counting = _CountingDrafter(source.drafter)
    source.drafter = counting  # type: ignore[assignment]
    spec = engine.generate(reqs, params, source)
    assert [r.response_ids for r in spec] == [r.response_ids for r in plain]
    assert control.off_passes > 0.7 * control.passes
    assert sum(r.drafted for r in spec) > 0  # probes
    assert counting.draft_calls < 0.35 * control.passes


def test_group_drafts_in_a_first_epoch_are_accepted_and_change_nothing(model: TinyLlama) -> None:
    reqs = _requests(2)
    params = SamplingParams(temperature=0.0, seed=6, max_response_length=24)
    engine = TorchEngine(model, EOS, max_batch_size=3)  # later siblings run behind earlier ones
    plain = engine.generate(reqs, params)
    spec = engine.generate(reqs, params, HistoryDrafts(SpeculationSpec(), {}, DraftCapController(SpeculationSpec())))
    assert [r.response_ids for r in spec] == [r.response_ids for r in plain]
    # greedy siblings repeat each other: the ones behind draft from the ones ahead
    assert sum(r.accepted for r in spec) > 0.3 * sum(len(r.response_ids) for r in spec)


def test_group_samples_moved_between_sessions_with_group_drafts_keep_their_tokens(model: TinyLlama) -> None:
    reqs = _requests(2)
    params = SamplingParams(temperature=1.0, seed=8, max_response_length=30)
    engine = TorchEngine(model, EOS, max_batch_size=8)
    plain = engine.generate(reqs, params)
    longest = max(len(r.prompt_ids) for r in reqs)
    src, dst = (engine.session(params, HistoryDrafts(SpeculationSpec(), {}, DraftCapController(SpeculationSpec())),
                               max_prompt_len=longest) for _ in range(2))
    for i, r in enumerate(reqs):
        src.add(i, r)
    done: dict[int, GenResult] = {}
    for _ in range(4):
        done.update(src.step())
    for k in src.running()[::2]:
        dst.add(k, reqs[k], src.take(k))
    for session in (src, dst):
        while session.busy:
            done.update(session.step())
    assert [done[i].response_ids for i in range(len(reqs))] == [r.response_ids for r in plain]


def _group_source() -> HistoryDrafts:
    spec = SpeculationSpec(min_prob=0.0)
    return HistoryDrafts(spec, {}, DraftCapController(spec))


def test_a_resumed_samples_tokens_draft_for_its_siblings_on_the_receiving_worker() -> None:
    source = _group_source()
    moved = [5, 6, 7, 8, 9, 10]
    source.begin(0, GenRequest([1], 0, "p"))
    source.settle([0], [0], [0], [moved])  # what the engine's prefill does for a resumed sample
    source.begin(1, GenRequest([1], 1, "p"))
    source.settle([1], [0], [0], [[5, 6]])
    assert source.propose([0, 1], 2) == [[], [7, 8]]  # window 2; the moved one has nothing ahead of it


def test_a_finished_siblings_last_tokens_stay_in_its_group() -> None:
    source = _group_source()
    source.begin(0, GenRequest([1], 0, "p"))
    source.settle([0], [0], [0], [[5, 6, 7, 8]])
    source.end(0)  # finished before anything drafted: its tokens were never fed
    source.begin(1, GenRequest([1], 1, "p"))
    source.begin(2, GenRequest([1], 2, "q"))
    source.settle([1, 2], [0, 0], [0, 0], [[5, 6], [5, 6]])
    assert source.propose([1, 2], 2) == [[7, 8], []]  # another prompt's group has nothing to offer


def _ngram_after(tokens: list[int], width: int, slots: list[int]) -> list[list[int]]:
    """What n-gram drafting proposes in `slots` (each fed the same prompt and then `tokens`, one pass
    per token) from a buffer `width` tokens wide to begin with."""
    drafts = NgramDrafts(SpeculationSpec(window={"initial": 4, "max": 4}), None, width=width)
    for s in slots:
        drafts.begin(s, GenRequest([1, 3, 4], s))
    for tok in tokens:
        drafts.settle(slots, [0] * len(slots), [0] * len(slots), [[tok]] * len(slots))
    return drafts.propose(slots, len(slots))


def test_ngram_drafts_of_a_sequence_longer_than_the_buffer_match_its_latest_tokens() -> None:
    """The buffer grows with the sequence (vLLM's proposer reads the whole context): 9 10 11 12 13 comes
    after 40 tokens of filler and 5 6 7 at the end recalls it, 4 tokens drafted (the window)."""
    filler = [20 + i % 17 for i in range(40)]
    tokens = [*filler, 5, 6, 7, 9, 10, 11, 12, 13, *filler[:5], 5, 6, 7]
    assert _ngram_after(tokens, width=8, slots=[0]) == [[9, 10, 11, 12]]
    assert _ngram_after(tokens, width=8, slots=[0]) == _ngram_after(tokens, width=2048, slots=[0])


def test_ngram_drafts_are_the_same_from_packed_slots_and_from_scattered_ones() -> None:
    """Slots 0..n-1 are read in place, any others copied out: the drafts do not depend on which."""
    tokens = [5, 6, 7, 9, 10, 11, 30, 31, 5, 6, 7]
    assert _ngram_after(tokens, 4, [0, 1]) == _ngram_after(tokens, 4, [3, 1]) == [[9, 10, 11, 30]] * 2
