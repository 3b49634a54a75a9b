"""Hand-computed checks of the GRPO/DAPO advantage and loss math."""

from __future__ import annotations

import math

import pytest
import torch

from rhymerl.algorithms import objectives as obj


def test_group_advantages_are_centred_and_scaled_by_the_unbiased_std() -> None:
    adv = obj.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]), group_size=4)
    # group 1: mean 0.25, std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    assert adv[:4].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert adv[4:].tolist() == pytest.approx([-1.5, 0.5, 0.5, 0.5], abs=1e-5)


def test_group_advantages_without_std_are_only_centred() -> None:
    adv = obj.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, norm_by_std=False)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_a_group_with_equal_rewards_gets_zero_advantage() -> None:
    assert obj.group_advantages(torch.tensor([1.0, 1.0, 1.0]), group_size=3).abs().max() == 0


def test_rewards_that_do_not_split_into_groups_are_an_error() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        obj.group_advantages(torch.zeros(6), group_size=4)


@pytest.mark.parametrize(("ratio", "adv", "high", "loss", "clipped"), [
    (1.5, 1.0, 0.2, -1.2, 1.0),    # positive advantage: capped at 1 + eps_high
    (1.5, 1.0, 0.28, -1.28, 1.0),  # DAPO clip-higher raises the cap
    (1.5, -1.0, 0.2, 1.5, 0.0),    # negative advantage, ratio up: unclipped is the pessimistic bound
    (0.5, -1.0, 0.2, 0.8, 1.0),    # negative advantage, ratio down: floored at 1 - eps_low
    (0.5, 1.0, 0.2, -0.5, 0.0),    # positive advantage, ratio down: no clipping
    (1.0, 2.0, 0.2, -2.0, 0.0),    # on-policy: plain policy gradient
])
def test_clipped_surrogate_matches_hand_values(ratio: float, adv: float, high: float, loss: float,
                                               clipped: float) -> None:
    logp = torch.tensor([[math.log(ratio)]])
    out, flag = obj.clipped_policy_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), 0.2, high)
    assert out.item() == pytest.approx(loss, rel=1e-6)
    assert flag.item() == clipped


def test_the_on_policy_gradient_is_minus_the_advantage() -> None:
    logp = torch.zeros(1, 1, requires_grad=True)
    loss, _ = obj.clipped_policy_loss(logp, logp.detach(), torch.tensor([3.0]), 0.2, 0.2)
    loss.sum().backward()
    assert logp.grad is not None and logp.grad.item() == pytest.approx(-3.0)


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(("mode", "expected"), [
    ("token-mean", (1 + 2 + 3 + 4) / 4),
    ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),
    ("seq-mean-token-sum-norm", (1 + 2 + 3 + 4) / (2 * 5)),
])
def test_loss_aggregation_modes(mode: str, expected: float) -> None:
    den = obj.denominators(MASK, mode, max_response_length=5)
    assert obj.aggregate(PER_TOKEN, MASK, den).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_splitting_a_mini_batch_into_micro_batches_does_not_change_the_loss(mode: str) -> None:
    den = obj.denominators(MASK, mode, max_response_length=5)
    whole = obj.aggregate(PER_TOKEN, MASK, den)
    parts = obj.aggregate(PER_TOKEN[:1], MASK[:1], den) + obj.aggregate(PER_TOKEN[1:], MASK[1:], den)
    assert parts.item() == pytest.approx(whole.item())


def test_k3_kl_is_zero_on_policy_and_matches_hand_value() -> None:
    assert obj.kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0
    # delta = log(0.25) - log(0.5) = -log 2: 0.5 + log 2 - 1
    kl = obj.kl_k3(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))
    assert kl.item() == pytest.approx(0.5 + math.log(2) - 1)


def test_overlong_penalty_ramps_linearly_inside_the_buffer() -> None:
    pen = obj.overlong_penalty(torch.tensor([50, 80, 90, 100]), max_len=100, buffer_len=20, factor=1.0)
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0])


def test_token_logprobs_and_entropy_of_a_uniform_distribution() -> None:
    logp, ent = obj.token_logprobs_and_entropy(torch.zeros(1, 2, 4), torch.tensor([[0, 3]]))
    assert logp[0].tolist() == pytest.approx([-math.log(4)] * 2)
    assert ent[0].tolist() == pytest.approx([math.log(4)] * 2)


def test_importance_ratios_per_token_and_per_sequence_by_hand() -> None:
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    behaviour = torch.tensor([[-1.5, -1.0, 9.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    token = obj.importance_ratios(old, behaviour, mask, "token")
    assert torch.allclose(token, torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0], [1.0, 1.0, 1.0]]))
    sequence = obj.importance_ratios(old, behaviour, mask, "sequence")
    assert torch.allclose(sequence, torch.tensor([[math.exp(-0.5), math.exp(-0.5), 1.0], [1.0, 1.0, 1.0]]))
    capped = obj.truncated(torch.tensor([0.5, 3.0], requires_grad=True), 2.0)
    assert capped.tolist() == [0.5, 2.0] and not capped.requires_grad
