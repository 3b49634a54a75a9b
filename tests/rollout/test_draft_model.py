"""A draft model as the torch engine's draft source: its drafts never change the tokens, its KV cache
follows what verification accepted, and it must speak the policy's tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from rhymerl.algorithms.drafting.adaptive_cap import AcceptanceTracker, CostProfile
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.model.folder import ModelConfig, ModelError, model_dir, read_config
from rhymerl.workers.model.policy import save_model
from rhymerl.workers.model.tokenizer import CharTokenizer
from rhymerl.workers.model.transformer import TinyLlama, load_model
from rhymerl.workers.rollout.draft_model import DraftModelDrafts, draft_folder, load_draft_model
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.rollout.speculators import DraftCapController
from rhymerl.workers.task import arith_chain

EOS = 2
SPEC = SpeculationSpec(method="draft-model", draft_model="builtin:tiny-arith-draft")


def _requests(n: int, group: int = 3) -> list[GenRequest]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        prompt = [1] + [rng.randrange(3, 40) for _ in range(rng.randrange(2, 10))]
        out += [GenRequest(prompt, sample_key(f"p{i}", 1, k), f"p{i}") for k in range(group)]
    return out


@pytest.fixture
def model(tiny_model: TinyLlama) -> TinyLlama:
    return tiny_model.double()


def test_a_draft_model_that_is_the_policy_has_every_greedy_draft_accepted() -> None:
    # the draft's cache must hold exactly the verified context for its greedy drafts to be the
    # policy's, also after two sequences are taken mid-way and the engine packs the other two into
    # the lowest slots (the draft's cache moves with them)
    policy = load_model(model_dir("builtin:tiny-arith"), torch.float64)
    tok = CharTokenizer()
    reqs = [GenRequest(tok.prompt_ids(p.prompt), sample_key(f"a{i}", 1, 0), f"a{i}")
            for i, p in enumerate(arith_chain.generate(4, seed=11))]
    params = SamplingParams(temperature=0.0, seed=1, max_response_length=40)
    engine = TorchEngine(policy, tok.eos_id, max_batch_size=4)
    plain = engine.generate(reqs, params)
    moves: list[tuple[list[int], list[int]]] = []

    class Watched(DraftModelDrafts):
        def move(self, src: list[int], dst: list[int]) -> None:
            moves.append((src, dst))
            super().move(src, dst)

    session = engine.session(params, Watched(SPEC, policy, DraftCapController(SPEC)),
                             max_prompt_len=max(len(r.prompt_ids) for r in reqs))
    for key, req in enumerate(reqs):
        session.add(key, req)
    done = dict(session.step() + session.step() + session.step())
    session.take(0)
    session.take(2)
    while session.busy:
        done.update(session.step())
    assert moves == [([1, 3], [0, 1])]
    assert [done[k].response_ids for k in (1, 3)] == [plain[k].response_ids for k in (1, 3)]
    drafted = sum(done[k].drafted for k in (1, 3))
    assert drafted > 0 and sum(done[k].accepted for k in (1, 3)) == drafted


def test_after_rejections_each_draft_is_the_draft_models_greedy_continuation() -> None:
    # at temperature 1 the policy rejects many drafts: whatever the draft's cache kept or rolled back,
    # every draft must be what the draft model says from scratch on the verified context
    policy = load_model(model_dir("builtin:tiny-arith"), torch.float64)
    draft = load_draft_model("builtin:tiny-arith-draft", model_dir("builtin:tiny-arith"), torch.float64)
    tok = CharTokenizer()
    reqs = [GenRequest(tok.prompt_ids(p.prompt), sample_key(f"a{i}", 1, 0), f"a{i}")
            for i, p in enumerate(arith_chain.generate(3, seed=5))]
    checked: list[bool] = []

    class Checked(DraftModelDrafts):
        def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
            out = super().propose(slots, batch_size)
            for s, tokens in zip(slots, out, strict=True):
                context = list(self.context[s])
                for t in tokens:
                    checked.append(int(draft(torch.tensor([context]))[0, -1].argmax()) == t)
                    context.append(t)
            return out

    engine = TorchEngine(policy, tok.eos_id, max_batch_size=3)
    out = engine.generate(reqs, SamplingParams(temperature=1.0, seed=8, max_response_length=40),
                          Checked(SPEC, draft, DraftCapController(SPEC)))
    assert sum(r.accepted for r in out) < sum(r.drafted for r in out)  # there were rejections
    assert len(checked) > 20 and all(checked)


def test_poor_drafts_parked_and_caught_up_change_nothing(model: TinyLlama) -> None:
    torch.manual_seed(5)
    other = TinyLlama(model.cfg).double().eval()  # another random model: its drafts are mostly wrong
    # verifying costs in proportion to the tokens appended: poor drafts do not pay, so the controller
    # parks speculation, and the draft's cache falls behind and catches up when it probes
    profile = CostProfile((1, 64), (1, 33), ((1.0, 33.0), (64.0, 64.0 * 33)))
    control = DraftCapController(SPEC, profile, AcceptanceTracker(prior=0.05))
    reqs = _requests(4)
    params = SamplingParams(temperature=1.0, seed=2, max_response_length=60)
    engine = TorchEngine(model, EOS, max_batch_size=5)
    plain = engine.generate(reqs, params)
    out = engine.generate(reqs, params, DraftModelDrafts(SPEC, other, control))
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    assert control.off_passes > 0 and sum(r.drafted for r in out) > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_shipped_draft_model_keeps_plain_decodings_tokens_on_arith_chains(temperature: float) -> None:
    policy = load_model(model_dir("builtin:tiny-arith"), torch.float64)
    draft = load_draft_model("builtin:tiny-arith-draft", model_dir("builtin:tiny-arith"), torch.float64)
    tok = CharTokenizer()
    problems = arith_chain.generate(3, seed=7)
    reqs = [GenRequest(tok.prompt_ids(p.prompt), sample_key(f"a{i}", 1, k), f"a{i}")
            for i, p in enumerate(problems) for k in range(2)]
    params = SamplingParams(temperature=temperature, seed=3, max_response_length=48)
    engine = TorchEngine(policy, tok.eos_id, max_batch_size=len(reqs))
    plain = engine.generate(reqs, params)
    out = engine.generate(reqs, params, DraftModelDrafts(SPEC, draft, DraftCapController(SPEC)))
    assert [r.response_ids for r in out] == [r.response_ids for r in plain]
    assert sum(r.accepted for r in out) > 0.3 * sum(r.drafted for r in out) > 0


def test_the_shipped_draft_model_speaks_the_embedded_policys_tokenizer() -> None:
    policy = model_dir("builtin:tiny-arith")
    folder = draft_folder("builtin:tiny-arith-draft", policy)
    mine, theirs = read_config(folder), read_config(policy)
    assert mine.vocab_size == theirs.vocab_size == CharTokenizer().vocab_size
    assert mine.num_hidden_layers < theirs.num_hidden_layers
    assert (folder / "tokenizer.json").read_text() == (policy / "tokenizer.json").read_text()


def test_a_draft_model_of_another_vocabulary_is_refused_naming_the_field(tmp_path: Path) -> None:
    small = ModelConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    save_model(TinyLlama(small), tmp_path / "draft")
    with pytest.raises(ModelError, match=r"^spec\.rollout\.speculation\.draft_model: .* 40 tokens, the policy .* 99"):
        draft_folder(str(tmp_path / "draft"), model_dir("builtin:tiny-arith"))
    with pytest.raises(ModelError, match=r"^spec\.rollout\.speculation\.draft_model: .* is not a folder"):
        draft_folder(str(tmp_path / "nowhere"), model_dir("builtin:tiny-arith"))


def test_drafting_is_priced_with_the_draft_models_own_steps(model: TinyLlama) -> None:
    # verifying a longer block costs nothing extra, and drafts are accepted: only the draft steps can
    # make drafting unpaid
    profile = CostProfile((1, 64), (1, 33), ((1.0, 1.0), (1.0, 1.0)))
    control = DraftCapController(SPEC, profile, AcceptanceTracker(prior=0.9))
    source = DraftModelDrafts(SPEC, model, control)
    for slot in range(4):
        source.begin(slot, GenRequest([1, 5, 9, 11], slot, "p"))
        source.settle([slot], [0], [0], [[7]])
    source.step_cost = 0.01  # a draft step costs a hundredth of a plain pass: draft at the window
    assert [len(d) for d in source.propose(list(range(4)), 4)] == [SPEC.window.initial] * 4
    source.settle(list(range(4)), [2] * 4, [0] * 4, [[3]] * 4)
    source.step_cost = 10.0  # ten plain passes per step: nothing is offered, so nothing is drafted
    assert source.propose(list(range(4)), 4) == [[]] * 4
    assert control.caps_chosen[0] == 1
    # the step's metrics say the draft model's price turned drafting off, not that no draft was there
    assert control.take_decisions().summary()["4-7"]["reasons"] == {"priced": 1, "priced-off": 1}


def test_a_probe_drafts_at_most_the_initial_window_whatever_the_windows_grew_to(model: TinyLlama) -> None:
    def grown() -> DraftModelDrafts:
        source = DraftModelDrafts(SPEC, model, None)
        for slot in range(2):
            source.begin(slot, GenRequest([1, 5, 9, 11], slot, "p"))
            source.settle([slot], [0], [0], [[7]])
        source.windows.windows[:] = SPEC.window.max
        return source

    assert [len(d) for d in grown().probe([0, 1], 2)] == [SPEC.window.initial] * 2
    assert [len(d) for d in grown().propose([0, 1], 2)] == [SPEC.window.max] * 2
