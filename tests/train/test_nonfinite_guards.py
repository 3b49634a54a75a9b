"""A nan or inf never reaches the weights: `fail` stops before any change, `skip` leaves it out."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from rhymerl.api.algorithm import AlgorithmSpec
from rhymerl.errors import NonFiniteError
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.train.trainer import Trainer, TrainSample, _Packed


def _samples() -> list[TrainSample]:
    g = torch.Generator().manual_seed(3)
    return [TrainSample(torch.randint(3, 40, (4,), generator=g).tolist(),
                        torch.randint(3, 40, (6 + i,), generator=g).tolist(),
                        advantage=1.0 if i % 2 else -1.0, label=f"prompt p{i // 2} sample {i % 2}") for i in range(6)]


def _weights(model: TinyLlama) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _algo(**kw: object) -> AlgorithmSpec:
    return AlgorithmSpec(group_size=2, prompts_per_step=3, lr=1e-2, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_advantage_fails_the_step_naming_the_sample_and_changes_no_weight(
        tiny_model: TinyLlama, bad: float) -> None:
    samples = _samples()
    samples[3] = dataclasses.replace(samples[3], advantage=bad)
    before = _weights(tiny_model)
    with pytest.raises(NonFiniteError, match=rf"prompt p1 sample 1: advantage {bad}.*on_nonfinite: skip"):
        Trainer(tiny_model, _algo(), temperature=1.0).step(samples)
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(tiny_model), strict=True))


def test_skip_trains_exactly_as_if_the_non_finite_sample_were_not_in_the_batch(tiny_model: TinyLlama) -> None:
    samples = _samples()
    poisoned = [*samples[:3], dataclasses.replace(samples[3], advantage=float("nan")), *samples[4:]]
    skipped_model, clean_model = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    trainer = Trainer(skipped_model, _algo(on_nonfinite="skip"), temperature=1.0)
    stats = trainer.step(poisoned)
    Trainer(clean_model, _algo(), temperature=1.0).step(samples[:3] + samples[4:])
    assert stats["skipped_samples"] == 1 and trainer.skipped_samples == ["prompt p1 sample 1"]
    for a, b in zip(_weights(skipped_model), _weights(clean_model), strict=True):
        assert torch.allclose(a, b, atol=1e-7)
    assert all(torch.isfinite(p).all() for p in skipped_model.parameters())


def _poison_scores(monkeypatch: pytest.MonkeyPatch, poisoned: TrainSample) -> None:
    """Make the model score nan on one sample's row only (as an overflow in its forward would)."""
    original = Trainer._score
    width = len(poisoned.prompt_ids) + len(poisoned.response_ids)

    def score(self: Trainer, model: TinyLlama, batch: _Packed) -> tuple[torch.Tensor, torch.Tensor]:
        logp, entropy = original(self, model, batch)
        target = torch.tensor(poisoned.prompt_ids + poisoned.response_ids)
        rows = [r for r in range(batch.tokens.shape[0]) if torch.equal(batch.tokens[r, :width], target)]
        logp = logp.clone()
        logp[rows] = float("nan")
        return logp, entropy

    monkeypatch.setattr(Trainer, "_score", score)


def test_a_non_finite_loss_fails_naming_the_sample_and_changes_no_weight(
        tiny_model: TinyLlama, monkeypatch: pytest.MonkeyPatch) -> None:
    samples = _samples()
    _poison_scores(monkeypatch, samples[4])
    before = _weights(tiny_model)
    with pytest.raises(NonFiniteError, match=r"prompt p2 sample 0: its loss is nan"):
        Trainer(tiny_model, _algo(), temperature=1.0).step(samples)
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(tiny_model), strict=True))


def test_skip_leaves_out_a_sample_whose_loss_is_not_finite_and_keeps_every_weight_finite(
        tiny_model: TinyLlama, monkeypatch: pytest.MonkeyPatch) -> None:
    samples = _samples()
    _poison_scores(monkeypatch, samples[4])
    before = _weights(tiny_model)
    trainer = Trainer(tiny_model, _algo(on_nonfinite="skip"), temperature=1.0)
    stats = trainer.step(samples)
    assert trainer.skipped_samples == ["prompt p2 sample 0"] and stats["skipped_samples"] == 1
    assert all(torch.isfinite(p).all() for p in tiny_model.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(before, _weights(tiny_model), strict=True))


def test_a_non_finite_gradient_norm_skips_the_update_under_skip_and_fails_under_fail(
        tiny_model: TinyLlama, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: torch.tensor(float("inf")))
    before = _weights(tiny_model)
    with pytest.raises(NonFiniteError, match="gradient norm is inf"):
        Trainer(tiny_model, _algo(), temperature=1.0).step(_samples())
    trainer = Trainer(tiny_model, _algo(on_nonfinite="skip"), temperature=1.0)
    stats = trainer.step(_samples())
    assert stats["skipped_updates"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(tiny_model), strict=True))
