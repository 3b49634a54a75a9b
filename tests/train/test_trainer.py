from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from rhymerl.api.algorithm import AlgorithmSpec
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.train.trainer import Trainer, TrainSample, micro_batches


def _samples() -> list[TrainSample]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(6):
        prompt = torch.randint(3, 40, (3 + i,), generator=g).tolist()
        resp = torch.randint(3, 40, (5 + 2 * i,), generator=g).tolist()
        out.append(TrainSample(prompt, resp, advantage=1.0 if i % 2 == 0 else -1.0))
    return out


def _response_logprob(model: TinyLlama, s: TrainSample) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([s.prompt_ids + s.response_ids]))[0]
        logp = torch.log_softmax(logits, -1)
        p = len(s.prompt_ids)
        return float(sum(logp[p - 1 + t, tok] for t, tok in enumerate(s.response_ids)))


def test_a_step_raises_positive_advantage_responses_and_lowers_negative_ones(tiny_model: TinyLlama) -> None:
    samples = _samples()
    before = [_response_logprob(tiny_model, s) for s in samples]
    trainer = Trainer(tiny_model, AlgorithmSpec(group_size=2, prompts_per_step=3, lr=1e-2), temperature=1.0)
    stats = trainer.step(samples)
    after = [_response_logprob(tiny_model, s) for s in samples]
    for s, b, a in zip(samples, before, after, strict=True):
        assert (a > b) == (s.advantage > 0)
    assert stats["grad_norm"] > 0 and stats["entropy"] > 0


def test_the_gradient_does_not_depend_on_the_micro_batch_size(tiny_model: TinyLlama) -> None:
    samples = _samples()
    grads = []
    for budget in (10_000, 20):
        model = copy.deepcopy(tiny_model)
        algo = AlgorithmSpec(group_size=2, prompts_per_step=3, lr=1e-3, max_grad_norm=1e9)
        trainer = Trainer(model, algo, temperature=1.0, micro_batch_tokens=budget)
        trainer.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        trainer.step(samples)
        grads.append(torch.cat([(p - q).flatten() for p, q in zip(model.parameters(), tiny_model.parameters(),
                                                                   strict=True)]))
    assert len(micro_batches(samples, list(range(6)), 20)) == 6
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_kl_to_the_reference_is_reported_after_the_first_update(tiny_model: TinyLlama) -> None:
    algo = AlgorithmSpec(group_size=2, prompts_per_step=3, lr=1e-2, kl_coef=0.1, ppo_epochs=2, mini_batch_size=3)
    trainer = Trainer(tiny_model, algo, temperature=1.0)
    stats = trainer.step(_samples())
    assert stats["kl"] > 0
    assert 0 <= stats["pg_clipfrac"] <= 1


def _with_behaviour(samples: list[TrainSample], logprobs: list[torch.Tensor]) -> list[TrainSample]:
    return [dataclasses.replace(s, behaviour_logprobs=lp.tolist()) for s, lp in zip(samples, logprobs, strict=True)]


def test_behaviour_log_probabilities_of_the_trainers_own_weights_give_ratios_of_one(tiny_model: TinyLlama) -> None:
    algo = AlgorithmSpec(group_size=2, prompts_per_step=3, lr=1e-2)
    samples = _samples()
    own = Trainer(copy.deepcopy(tiny_model), algo, temperature=1.0).logprobs(samples)
    stats = Trainer(copy.deepcopy(tiny_model), algo, temperature=1.0, correction="token").step(
        _with_behaviour(samples, own))
    assert stats["is_ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["is_ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert stats["is_capped_frac"] == 0.0
    assert stats["rollout_logprob_diff_max"] < 1e-6


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_a_truncated_importance_weight_scales_its_samples_policy_gradient(tiny_model: TinyLlama, level: str) -> None:
    """One update, old policy = current (ratio 1 in the clip): each token's loss is -A * w. A sample
    whose behaviour probabilities are 4x lower than the trainer's (ratio 4, over the cap of 2) counts
    twice; one 2x higher (ratio 1/2 per token) half at token level, 2^-n at sequence level."""
    algo = AlgorithmSpec(group_size=2, prompts_per_step=3, lr=1e-2, loss_agg_mode="seq-mean-token-mean",
                         importance_cap=2.0)
    samples = _samples()
    own = Trainer(copy.deepcopy(tiny_model), algo, temperature=1.0).logprobs(samples)
    shifted = [lp - math.log(4.0) if i == 0 else lp + math.log(2.0) if i == 1 else lp for i, lp in enumerate(own)]
    plain = Trainer(copy.deepcopy(tiny_model), algo, temperature=1.0).step(samples)["loss"]
    stats = Trainer(copy.deepcopy(tiny_model), algo, temperature=1.0, correction=level).step(
        _with_behaviour(samples, shifted))
    n1 = len(samples[1].response_ids)
    weights = [2.0, 0.5 if level == "token" else 0.5 ** n1, 1.0, 1.0, 1.0, 1.0]
    expected = sum(-s.advantage * w for s, w in zip(samples, weights, strict=True)) / len(samples)
    assert plain == pytest.approx(sum(-s.advantage for s in samples) / len(samples), abs=1e-6)
    assert stats["loss"] == pytest.approx(expected, abs=1e-5)
    tokens = sum(len(s.response_ids) for s in samples)
    assert stats["is_capped_frac"] == pytest.approx(len(samples[0].response_ids) / tokens)
    assert stats["is_ratio_max"] == pytest.approx(4.0, rel=1e-5)


def test_without_correction_the_ratios_are_measured_and_the_loss_is_unweighted(tiny_model: TinyLlama) -> None:
    algo = AlgorithmSpec(group_size=2, prompts_per_step=3, lr=1e-2)
    samples = _samples()
    own = Trainer(copy.deepcopy(tiny_model), algo, temperature=1.0).logprobs(samples)
    stats = Trainer(copy.deepcopy(tiny_model), algo, temperature=1.0).step(
        _with_behaviour(samples, [lp - math.log(4.0) for lp in own]))
    assert stats["loss"] == pytest.approx(sum(-s.advantage for s in samples) / len(samples), abs=1e-6)
    assert stats["is_ratio_mean"] == pytest.approx(4.0, rel=1e-5)
    assert stats["is_capped_frac"] == 1.0
