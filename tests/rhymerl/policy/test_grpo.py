"""GRPO math on tiny hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from rhymerl.policy import grpo


def test_group_advantages_normalise_each_group_with_unbiased_std() -> None:
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]])
    adv = grpo.group_advantages(rewards, eps=0.0)
    # [1,2,3]: mean 2, unbiased std sqrt((1+0+1)/2) = 1 -> [-1, 0, 1]
    # [0,1,0]: mean 1/3, unbiased std sqrt((1/9+4/9+1/9)/2) = sqrt(1/3) -> (r - 1/3) * sqrt(3)
    s3 = math.sqrt(3.0)
    expected = torch.tensor([[-1.0, 0.0, 1.0], [-s3 / 3, 2 * s3 / 3, -s3 / 3]])
    torch.testing.assert_close(adv, expected)


def test_group_advantages_equal_rewards_give_zero() -> None:
    # a group with one reward value carries no signal: exactly 0, not 0/eps noise
    rewards = torch.tensor([[0.1, 0.1, 0.1], [1.0, 0.0, 1.0]], dtype=torch.float64)
    adv = grpo.group_advantages(rewards)
    assert adv[0].tolist() == [0.0, 0.0, 0.0]
    assert adv[1].abs().sum() > 0


def test_group_advantages_unscaled_is_reward_minus_mean() -> None:
    # Dr. GRPO: r - mean, mean of [1,2,4] is 7/3
    adv = grpo.group_advantages(torch.tensor([[1.0, 2.0, 4.0]]), scale=False)
    torch.testing.assert_close(adv, torch.tensor([[-4 / 3, -1 / 3, 5 / 3]]))


def test_group_advantages_reject_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"\(G, n\)"):
        grpo.group_advantages(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="at least 2 samples"):
        grpo.group_advantages(torch.tensor([[1.0], [0.0]]))


def _one_by_three(advantage: float) -> tuple[torch.Tensor, tuple[torch.Tensor, dict[str, float]]]:
    """ratios [1.5, 1.0, 0.5] with clip range [0.8, 1.28]."""
    logp = torch.log(torch.tensor([[1.5, 1.0, 0.5]])).requires_grad_(True)
    old = torch.zeros(1, 3)
    out = grpo.policy_loss(logp, old, torch.tensor([advantage]), torch.ones(1, 3),
                           clip_low=0.2, clip_high=0.28, agg="token")
    return logp, out


def test_policy_loss_clips_high_ratio_for_positive_advantage() -> None:
    logp, (loss, stats) = _one_by_three(+1.0)
    # A=+1: min(r, clip(r)) = [min(1.5,1.28), 1.0, min(0.5,0.8)] = [1.28, 1.0, 0.5]; loss = -mean
    assert loss.item() == pytest.approx(-(1.28 + 1.0 + 0.5) / 3)
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    loss.backward()
    # d/dlogp of -r*A/3 is -r/3 where unclipped; 0 on the clipped token 0
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.0 / 3, -0.5 / 3]]))


def test_policy_loss_clips_low_ratio_for_negative_advantage() -> None:
    logp, (loss, stats) = _one_by_three(-1.0)
    # A=-1: min(-r, -clip(r)) = [min(-1.5,-1.28), -1.0, min(-0.5,-0.8)] = [-1.5, -1.0, -0.8]
    assert loss.item() == pytest.approx((1.5 + 1.0 + 0.8) / 3)
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    loss.backward()
    # gradient +r/3 where unclipped; 0 on the clipped token 2
    torch.testing.assert_close(logp.grad, torch.tensor([[1.5 / 3, 1.0 / 3, 0.0]]))


def test_token_and_sequence_aggregation_differ_on_unequal_lengths() -> None:
    # ratio 1 everywhere, so the per-token loss is -A: seq0 = [-3] (1 token), seq1 = [0, 0, 0]
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([3.0, 0.0])
    token, _ = grpo.policy_loss(logp, logp, adv, mask, 0.2, 0.2, agg="token")
    seq, _ = grpo.policy_loss(logp, logp, adv, mask, 0.2, 0.2, agg="sequence")
    assert token.item() == pytest.approx(-3.0 / 4)  # sum over 4 valid tokens / 4
    assert seq.item() == pytest.approx((-3.0 + 0.0) / 2)  # mean of per-sequence means


def test_policy_loss_ignores_garbage_on_padding() -> None:
    # padded positions may hold anything (even inf); they change neither loss nor gradient
    logp = torch.tensor([[0.0, float("inf")]], requires_grad=True)
    loss, stats = grpo.policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]),
                                   torch.tensor([[1.0, 0.0]]), 0.2, 0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert stats["tokens"] == 1.0
    assert logp.grad.tolist() == [[-1.0, 0.0]]


def test_policy_loss_rejects_unknown_aggregation_and_bad_shapes() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="token, sequence"):
        grpo.policy_loss(x, x, torch.zeros(1), torch.ones(1, 2), 0.2, 0.2, agg="mean")
    with pytest.raises(ValueError, match=r"advantages must have shape \(B,\)"):
        grpo.policy_loss(x, x, torch.zeros(1, 1), torch.ones(1, 2), 0.2, 0.2)
    with pytest.raises(ValueError, match="same"):
        grpo.policy_loss(x, torch.zeros(1, 3), torch.zeros(1), torch.ones(1, 2), 0.2, 0.2)


def test_kl_k3_hand_values_zero_when_equal_and_masked() -> None:
    logp = torch.log(torch.tensor([[0.5, 1.0, 0.25, 0.3]]))
    ref = torch.log(torch.tensor([[1.0, 0.5, 0.25, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    kl = grpo.kl_k3(logp, ref, mask)
    # d = ref - logp: ln2 -> 2 - ln2 - 1; -ln2 -> 0.5 + ln2 - 1; 0 -> 0; padding -> 0
    ln2 = math.log(2.0)
    torch.testing.assert_close(kl, torch.tensor([[1.0 - ln2, ln2 - 0.5, 0.0, 0.0]]))


def test_kl_k3_is_non_negative() -> None:
    g = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(8, 16, generator=g) * 3, torch.randn(8, 16, generator=g) * 3
    assert (grpo.kl_k3(logp, ref, torch.ones(8, 16)) >= 0).all()  # e^x >= 1 + x


def test_masked_mean_counts_only_valid_positions() -> None:
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert grpo.masked_mean(x, mask).item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert grpo.masked_mean(x, torch.zeros_like(x)).item() == 0.0  # empty mask -> 0


def _random_batch(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 5
    logp = (-torch.rand(B, T, generator=g)).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g)  # ratios both sides of the clip
    adv = torch.randn(B, generator=g)
    lengths = torch.tensor([1, 5, 2, 4, 3, 5])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return logp, old, adv, mask


@pytest.mark.parametrize("agg", ["token", "sequence"])
def test_micro_batch_accumulation_equals_full_batch_gradient(agg: str) -> None:
    logp, old, adv, mask = _random_batch(0)
    full, _ = grpo.policy_loss(logp, old, adv, mask, 0.2, 0.28, agg=agg)
    (full_grad,) = torch.autograd.grad(full, logp)

    aggregation = grpo.get_aggregation(agg)
    parts = [slice(0, 2), slice(2, 3), slice(3, 6)]
    denominator = sum(aggregation.count(mask[s]) for s in parts)
    total = sum(grpo.policy_loss(logp[s], old[s], adv[s], mask[s], 0.2, 0.28, agg=agg,
                                 denominator=denominator)[0] for s in parts)
    (acc_grad,) = torch.autograd.grad(total, logp)
    # passing the whole-batch count as denominator makes the sum of micro-losses the full loss
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(acc_grad, full_grad)

    # normalising each micro-batch by itself instead would weight tokens unequally
    naive = sum(grpo.policy_loss(logp[s], old[s], adv[s], mask[s], 0.2, 0.28, agg=agg)[0]
                for s in parts) / len(parts)
    (naive_grad,) = torch.autograd.grad(naive, logp)
    assert not torch.allclose(naive_grad, full_grad)
