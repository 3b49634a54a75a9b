from __future__ import annotations

import random

import pytest
import torch
from scipy.stats import chisquare

from rhymerl.workers.model import cached_attention
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.engine import EngineSession, TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key, sample_tokens

EOS = 2


def naive_generate(model: TinyLlama, prompt: list[int], sample_id: int, p: SamplingParams) -> list[int]:
    """Reference: recompute the whole sequence for every token, no cache, no batching."""
    out: list[int] = []
    with torch.no_grad():
        for pos in range(p.max_response_length):
            logits = model(torch.tensor([prompt + out]))[0, -1]
            tok = int(sample_tokens(logits[None], p.seed, torch.tensor([sample_id]), torch.tensor([pos]),
                                    p.temperature, p.top_p)[0])
            out.append(tok)
            if tok == EOS:
                break
    return out


def _requests(n: int, seed: int) -> list[GenRequest]:
    rng = random.Random(seed)
    return [GenRequest([1] + [rng.randrange(3, 40) for _ in range(rng.randrange(1, 15))], sample_key("p", i))
            for i in range(n)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("batch", [1, 3, 16])
def test_batched_cached_generation_equals_token_by_token_recomputation(
        tiny_model: TinyLlama, temperature: float, batch: int) -> None:
    reqs = _requests(7, seed=batch)
    params = SamplingParams(temperature=temperature, top_p=0.9 if temperature else 1.0, seed=3,
                            max_response_length=24)
    results = TorchEngine(tiny_model, EOS, max_batch_size=batch).generate(reqs, params)
    for req, res in zip(reqs, results, strict=True):
        assert res.response_ids == naive_generate(tiny_model, req.prompt_ids, req.sample_id, params)
        assert res.finish_reason == ("stop" if res.response_ids[-1] == EOS else "length")
        assert res.forward_passes == len(res.response_ids)


def test_a_sample_does_not_depend_on_its_batch_neighbours(tiny_model: TinyLlama) -> None:
    reqs = _requests(9, seed=5)
    params = SamplingParams(temperature=1.0, seed=11, max_response_length=30)
    alone = TorchEngine(tiny_model, EOS, max_batch_size=1).generate(reqs[4:5], params)[0]
    together = TorchEngine(tiny_model, EOS, max_batch_size=4).generate(reqs, params)[4]
    assert alone.response_ids == together.response_ids


def test_a_group_sharing_a_prompt_is_prefilled_once_and_samples_as_if_alone(
        tiny_model: TinyLlama, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = [r.prompt_ids for r in _requests(3, seed=8)]
    reqs = [GenRequest(prompts[i], sample_key("g", i, k), f"p{i}") for i in range(3) for k in range(4)]
    scored: list[int] = []
    prefill = tiny_model.prefill

    def counting(tokens: torch.Tensor, *args: object) -> torch.Tensor:
        scored.append(tokens.shape[0])
        return prefill(tokens, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(tiny_model, "prefill", counting)
    params = SamplingParams(temperature=1.0, seed=6, max_response_length=20)
    results = TorchEngine(tiny_model, EOS, max_batch_size=12).generate(reqs, params)
    assert scored == [3]
    for req, res in zip(reqs, results, strict=True):
        assert res.response_ids == naive_generate(tiny_model, req.prompt_ids, req.sample_id, params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_samples_resumed_elsewhere_with_different_progress_continue_as_if_never_moved(
        tiny_model: TinyLlama, dtype: torch.dtype) -> None:
    model = tiny_model.to(dtype)
    long, short = [1, 5, 6, 7, 8, 9, 10], [1, 5, 6]
    reqs = [GenRequest(long if i % 3 else short, sample_key("g", i % 3, i), "x") for i in range(9)]
    params = SamplingParams(temperature=1.0, seed=5, max_response_length=30)
    engine = TorchEngine(model, EOS, max_batch_size=6)
    plain = engine.generate(reqs, params)
    src = engine.session(params, max_prompt_len=7)
    dst = engine.session(params, max_prompt_len=7, slots=9)
    for i, r in enumerate(reqs):
        src.add(i, r)
    done: dict[int, GenResult] = {}
    for _ in range(3):
        done.update(src.step())
    for key in src.running() + src.waiting():  # same prompts, different generated tokens (or none yet)
        dst.add(key, reqs[key], src.take(key))
    while dst.busy:
        done.update(dst.step())
    assert [done[i].response_ids for i in range(9)] == [r.response_ids for r in plain]


def test_different_seeds_give_different_samples(tiny_model: TinyLlama) -> None:
    reqs = _requests(4, seed=0)
    a = TorchEngine(tiny_model, EOS).generate(reqs, SamplingParams(seed=1, max_response_length=30))
    b = TorchEngine(tiny_model, EOS).generate(reqs, SamplingParams(seed=2, max_response_length=30))
    assert [r.response_ids for r in a] != [r.response_ids for r in b]


def test_prompts_too_long_for_the_model_are_rejected(tiny_model: TinyLlama) -> None:
    with pytest.raises(ValueError, match="positions"):
        TorchEngine(tiny_model, EOS).generate([GenRequest([1] * 200, 0)], SamplingParams(max_response_length=100))


def test_position_keyed_sampling_follows_the_softmax_distribution() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 30_000
    ids = torch.arange(n)
    tokens, _ = sample_tokens(logits.expand(n, -1), 123, ids, torch.full((n,), 7), temperature=1.0)
    observed = torch.bincount(tokens, minlength=6).double()
    expected = torch.softmax(logits.double(), -1) * n
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


def test_top_p_never_samples_outside_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    n = 5_000
    tokens, logprobs = sample_tokens(logits.expand(n, -1), 0, torch.arange(n), torch.zeros(n, dtype=torch.long),
                                     1.0, 0.75)
    assert set(tokens.tolist()) == {0, 1}
    # drawn from the nucleus renormalised: 0.5 / 0.8 and 0.3 / 0.8
    expected = torch.log(torch.tensor([0.5 / 0.8, 0.3 / 0.8], dtype=torch.float64))[tokens]
    assert torch.allclose(logprobs, expected, atol=1e-9)


def test_sampled_log_probabilities_are_the_tempered_softmax_of_the_drawn_token() -> None:
    logits = torch.randn(4, 9, dtype=torch.float64)
    ids, pos = torch.arange(4), torch.zeros(4, dtype=torch.long)
    tokens, logprobs = sample_tokens(logits, 3, ids, pos, 0.7)
    assert torch.allclose(logprobs, torch.log_softmax(logits / 0.7, -1)[torch.arange(4), tokens])
    greedy, greedy_logprobs = sample_tokens(logits, 3, ids, pos, 0.0)
    assert torch.equal(greedy, logits.argmax(-1))
    assert torch.allclose(greedy_logprobs, torch.log_softmax(logits, -1)[torch.arange(4), greedy])


def _gumbel_max_reference(logits: torch.Tensor, seed: int, ids: torch.Tensor, pos: torch.Tensor, temperature: float,
                          top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Position-keyed Gumbel-max written out over the whole pass at once, one new tensor per operation."""
    m32 = 0xFFFFFFFF

    def mix(x: torch.Tensor) -> torch.Tensor:
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & m32
        x = x ^ (x >> 15)
        x = (x * 0x846CA68B) & m32
        return x ^ (x >> 16)

    h = mix(mix((ids & m32) ^ seed) ^ ((pos * 0x9E3779B1) & m32))
    h = mix(h.unsqueeze(-1) ^ ((torch.arange(logits.shape[-1]) * 0x85EBCA77) & m32))
    u = (h.to(torch.float64) + 0.5) / 4294967296.0
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        cum = sorted_lp.exp().cumsum(-1)
        drop = torch.zeros_like(sorted_lp, dtype=torch.bool).scatter(-1, order, (cum - sorted_lp.exp()) >= top_p)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    tokens = (logp - torch.log(-torch.log(u))).argmax(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.8, 0.9)])
def test_a_large_pass_sampled_in_blocks_draws_what_the_formula_draws_over_the_whole_pass(
        temperature: float, top_p: float) -> None:
    """SmolLM2's vocabulary, 37 rows: several blocks and a short last one; every row as the formula has it."""
    torch.manual_seed(0)
    logits = torch.randn(37, 49152) * 4
    ids, pos = torch.randint(0, 2**31 - 1, (37,)), torch.randint(0, 5000, (37,))
    tokens, logprobs = sample_tokens(logits, 77, ids, pos, temperature, top_p)
    want_tokens, want_logprobs = _gumbel_max_reference(logits, 77, ids, pos, temperature, top_p)
    assert torch.equal(tokens, want_tokens) and torch.equal(logprobs, want_logprobs)
    # a row draws the same wherever it sits in a pass
    some, some_logprobs = sample_tokens(logits[5:21], 77, ids[5:21], pos[5:21], temperature, top_p)
    assert torch.equal(some, tokens[5:21]) and torch.equal(some_logprobs, logprobs[5:21])
    none, none_logprobs = sample_tokens(logits[:0], 77, ids[:0], pos[:0], temperature, top_p)
    assert none.shape == none_logprobs.shape == (0,)


def test_the_same_key_always_draws_the_same_token() -> None:
    logits = torch.randn(3, 50)
    ids, pos = torch.tensor([5, 6, 7]), torch.tensor([0, 9, 100])
    assert torch.equal(sample_tokens(logits, 4, ids, pos, 1.0)[0], sample_tokens(logits, 4, ids, pos, 1.0)[0])


class OracleDrafts:
    """Drafts from a known continuation per request, corrupted on purpose at chosen offsets."""

    def __init__(self, truth: dict[int, list[int]], k: int, corrupt_every: int = 0) -> None:
        self.truth, self.k, self.corrupt_every = truth, k, corrupt_every
        self.pos: dict[int, tuple[int, int]] = {}  # slot -> (request sample id, tokens emitted)
        self.calls = 0

    def begin(self, slot: int, request: GenRequest) -> None:
        self.pos[slot] = (request.sample_id, 0)

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        out = []
        for s in slots:
            sid, done = self.pos[s]
            draft = list(self.truth[sid][done: done + self.k])
            self.calls += 1
            if self.corrupt_every and draft and self.calls % self.corrupt_every == 0:
                draft[len(draft) // 2] = 3 + (draft[len(draft) // 2] + 1) % 30
            out.append(draft)
        return out

    def settle(self, slots: list[int], drafted: list[int], accepted: list[int], emitted: list[list[int]]) -> None:
        for s, toks in zip(slots, emitted, strict=True):
            sid, done = self.pos[s]
            self.pos[s] = (sid, done + len(toks))

    def end(self, slot: int) -> None:
        del self.pos[slot]

    def move(self, src: list[int], dst: list[int]) -> None:
        moved = {d: self.pos[s] for s, d in zip(src, dst, strict=True)}
        self.pos = moved

    def source_of(self, slot: int) -> str:
        return "oracle"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize(("k", "corrupt_every"), [(4, 0), (3, 2), (8, 1)])
def test_speculative_generation_emits_exactly_the_plain_tokens(
        tiny_model: TinyLlama, temperature: float, batch: int, k: int, corrupt_every: int) -> None:
    reqs = _requests(10, seed=batch + k)
    params = SamplingParams(temperature=temperature, seed=9, max_response_length=40)
    engine = TorchEngine(tiny_model.double(), EOS, max_batch_size=batch)
    plain = engine.generate(reqs, params)
    truth = {r.sample_id: res.response_ids for r, res in zip(reqs, plain, strict=True)}
    oracle = OracleDrafts(truth, k, corrupt_every)
    spec = engine.generate(reqs, params, oracle)
    assert [r.response_ids for r in spec] == [r.response_ids for r in plain]
    accepted = sum(r.accepted for r in spec)
    assert accepted > 0
    assert sum(r.forward_passes for r in spec) < sum(r.forward_passes for r in plain)
    if corrupt_every == 0:
        # perfect drafts: every pass but the last of a sequence emits k + 1 tokens
        assert accepted == sum(r.drafted for r in spec)


@pytest.mark.parametrize("batch", [1, 5, 16])
def test_in_float32_speculation_and_batch_mates_change_no_token_and_no_logprob_bit(
        tiny_model: TinyLlama, batch: int) -> None:
    """On the native kernel every pass computes a token as every other pass would (batch
    invariance): drafts of any length and quality, and whoever shares the batch, leave the tokens
    and the behaviour log-probabilities the trainer corrects with exactly those of plain decoding."""
    model = tiny_model.float()
    reqs = _requests(10, seed=11)
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=12, max_response_length=40)
    engine = TorchEngine(model, EOS, max_batch_size=batch)
    plain = engine.generate(reqs, params)
    alone = [TorchEngine(model, EOS, max_batch_size=1).generate([r], params)[0] for r in reqs[:3]]
    truth = {r.sample_id: res.response_ids for r, res in zip(reqs, plain, strict=True)}
    spec = engine.generate(reqs, params, OracleDrafts(truth, 5, corrupt_every=3))
    assert sum(r.accepted for r in spec) > 0
    assert [(r.response_ids, r.logprobs) for r in spec] == [(r.response_ids, r.logprobs) for r in plain]
    assert [(r.response_ids, r.logprobs) for r in alone] == [(r.response_ids, r.logprobs) for r in plain[:3]]


def test_wrong_drafts_cost_passes_but_never_change_tokens(tiny_model: TinyLlama) -> None:
    reqs = _requests(6, seed=1)
    params = SamplingParams(temperature=1.0, seed=2, max_response_length=30)
    engine = TorchEngine(tiny_model.double(), EOS, max_batch_size=6)
    plain = engine.generate(reqs, params)
    wrong = {r.sample_id: [3 + (t + 7) % 30 for t in res.response_ids] for r, res in zip(reqs, plain, strict=True)}
    spec = engine.generate(reqs, params, OracleDrafts(wrong, 5))
    assert [r.response_ids for r in spec] == [r.response_ids for r in plain]
    assert sum(r.forward_passes for r in spec) == sum(r.forward_passes for r in plain)


@pytest.mark.parametrize("native", [True, False])
def test_drafts_reaching_past_the_length_limit_are_cut_to_fit_the_cache(
        tiny_model: TinyLlama, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    # float32 and head_dim 16: verify passes run the native kernel, which refuses positions past the cache
    monkeypatch.setattr(cached_attention, "usable", lambda *_: native)
    reqs = _requests(4, seed=5)
    params = SamplingParams(temperature=1.0, seed=4, max_response_length=24)
    engine = TorchEngine(tiny_model.float(), EOS, max_batch_size=4)
    plain = engine.generate(reqs, params)
    # the true continuation, then far more than any response has room for
    truth = {r.sample_id: res.response_ids + [5] * 64 for r, res in zip(reqs, plain, strict=True)}
    spec = engine.generate(reqs, params, OracleDrafts(truth, 40))
    assert any(len(r.response_ids) == params.max_response_length for r in plain)  # the limit is reached
    assert [r.response_ids for r in spec] == [r.response_ids for r in plain]
    assert sum(r.forward_passes for r in spec) < sum(r.forward_passes for r in plain)


def _drain(session: EngineSession) -> dict[int, GenResult]:
    out: dict[int, GenResult] = {}
    while session.busy:
        out.update(session.step())
    return out


@pytest.mark.parametrize("with_drafts", [False, True])
def test_a_sample_taken_mid_generation_and_resumed_elsewhere_continues_with_the_same_tokens(
        tiny_model: TinyLlama, with_drafts: bool) -> None:
    model = tiny_model.double()
    reqs = _requests(5, seed=7)
    params = SamplingParams(temperature=1.0, seed=5, max_response_length=30)
    engine = TorchEngine(model, EOS, max_batch_size=3)
    plain = engine.generate(reqs, params)
    truth = {r.sample_id: res.response_ids for r, res in zip(reqs, plain, strict=True)}
    longest = max(len(r.prompt_ids) for r in reqs)
    src = engine.session(params, OracleDrafts(truth, 3) if with_drafts else None, max_prompt_len=longest)
    dst = engine.session(params, OracleDrafts(truth, 3) if with_drafts else None, max_prompt_len=longest)
    for i, r in enumerate(reqs):
        src.add(i, r)
    done: dict[int, GenResult] = {}
    for _ in range(3):
        done.update(src.step())
    moved = [k for k in src.running() if src.generated(k) > 0] + src.waiting()
    assert moved and any(src.generated(k) > 0 for k in moved)
    for k in moved:  # running ones carry their tokens, waiting ones start from nothing
        dst.add(k, reqs[k], src.take(k))
    done.update(_drain(src))
    done.update(_drain(dst))
    assert sorted(done) == list(range(len(reqs)))
    assert [done[i].response_ids for i in range(len(reqs))] == [r.response_ids for r in plain]
    if not with_drafts:  # plain decoding: one pass per token, the recompute prefill included
        assert all(done[i].forward_passes == len(done[i].response_ids) for i in range(len(reqs)))


def test_requests_added_between_passes_join_the_running_batch(tiny_model: TinyLlama) -> None:
    reqs = _requests(6, seed=8)
    params = SamplingParams(temperature=1.0, seed=1, max_response_length=25)
    engine = TorchEngine(tiny_model.double(), EOS, max_batch_size=4)
    plain = engine.generate(reqs, params)
    session = engine.session(params, max_prompt_len=max(len(r.prompt_ids) for r in reqs))
    done: dict[int, GenResult] = {}
    for i, r in enumerate(reqs):
        session.add(i, r)
        done.update(session.step())  # one pass between arrivals, packing included
    done.update(_drain(session))
    assert [done[i].response_ids for i in range(len(reqs))] == [r.response_ids for r in plain]


def test_a_session_refuses_to_resume_a_finished_response(tiny_model: TinyLlama) -> None:
    params = SamplingParams(max_response_length=4)
    session = TorchEngine(tiny_model, EOS).session(params, max_prompt_len=5)
    with pytest.raises(ValueError, match="finished"):
        session.add(0, GenRequest([1, 5], 0), GenResult(response_ids=[7, EOS]))
    with pytest.raises(ValueError, match="finished"):
        session.add(1, GenRequest([1, 5], 1), GenResult(response_ids=[7, 8, 9, 10]))


@pytest.mark.parametrize("with_drafts", [False, True])
def test_every_stop_token_of_the_model_ends_a_response_not_only_eos(tiny_model: TinyLlama, with_drafts: bool) -> None:
    reqs = _requests(4, seed=6)
    params = SamplingParams(temperature=1.0, seed=5, max_response_length=30)
    free = TorchEngine(tiny_model.double(), EOS, max_batch_size=4).generate(reqs, params)
    turn = free[0].response_ids[5]  # as an instruct model's end of turn beside its eos
    engine = TorchEngine(tiny_model.double(), [EOS, turn], max_batch_size=4)
    truth = {r.sample_id: res.response_ids for r, res in zip(reqs, free, strict=True)}
    out = engine.generate(reqs, params, OracleDrafts(truth, 4) if with_drafts else None)
    for plain, ended in zip(free, out, strict=True):
        ids = plain.response_ids
        cut = next((i for i, t in enumerate(ids) if t in (EOS, turn)), None)
        assert ended.response_ids == (ids if cut is None else ids[: cut + 1])
        assert ended.finish_reason == ("stop" if cut is not None else plain.finish_reason)
    assert out[0].response_ids[-1] == turn and len(out[0].response_ids) <= 6
