"""GRPO math as pure tensor functions: group advantages, the clipped policy loss, the k3 KL.

Shapes are written as comments: `G` groups (prompts), `n` samples per group, `B` sequences,
`T` response tokens (right-padded; `mask` is 1.0 on real tokens and 0.0 on padding).

Loss aggregations are picked by name from `LOSS_AGG`. Each one is a `reduce` plus a `count`,
so the trainer can split a batch into micro-batches: it sums `count` over every micro-batch,
passes that total as `denominator` to each micro-batch loss, and the accumulated gradients equal
the gradient of the whole batch in one piece.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Sum of `x` over the positions where `mask` is 1 (a 0-dim tensor); padding may hold anything."""
    return torch.where(mask > 0, x, torch.zeros_like(x)).sum()


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of `x` over the positions where `mask` is 1; 0 when the mask is empty."""
    return masked_sum(x, mask) / mask.sum().clamp(min=1.0)


# ---------------------------------------------------------------- advantages


def group_advantages(rewards: Tensor, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO advantages of `rewards` (G, n): each reward minus its group's mean.

    With `scale=True` the difference is divided by (group std + eps), where std is the
    *unbiased* sample std (divisor n - 1, as `torch.std`, verl and TRL use). `scale=False` is
    Dr. GRPO: r - mean, which does not up-weight groups whose rewards barely differ.
    A group whose rewards are all equal gets exactly 0 (it carries no learning signal), even
    when rounding in the mean would leave a tiny residue.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (G, n) = (groups, samples per group), "
                         f"got shape {tuple(rewards.shape)}; reshape with rewards.view(G, n)")
    if rewards.shape[1] < 2:
        raise ValueError(f"each group needs at least 2 samples to normalise over, got n = "
                         f"{rewards.shape[1]}; sample n >= 2 responses per prompt")
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (G, n)
    if scale:
        centred = centred / (rewards.std(dim=1, keepdim=True) + eps)
    flat = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)  # (G, 1)
    return torch.where(flat, torch.zeros_like(centred), centred)


# ---------------------------------------------------------------- aggregation registry


@dataclass(frozen=True)
class Aggregation:
    """How per-token losses (B, T) become one scalar.

    `count(mask)` is this micro-batch's share of the normaliser; it is additive, so the total
    over all micro-batches of a batch is the denominator for each of them.
    `reduce(values, mask, denominator)` sums this micro-batch's contribution and divides by it.
    """

    count: Callable[[Tensor], float]
    reduce: Callable[[Tensor, Tensor, float], Tensor]


def _token_reduce(values: Tensor, mask: Tensor, denominator: float) -> Tensor:
    return masked_sum(values, mask) / max(denominator, 1.0)


def _sequence_reduce(values: Tensor, mask: Tensor, denominator: float) -> Tensor:
    kept = torch.where(mask > 0, values, torch.zeros_like(values))
    per_seq = kept.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B,)
    return per_seq.sum() / max(denominator, 1.0)


LOSS_AGG: dict[str, Aggregation] = {
    # DAPO: every valid token in the batch weighs the same, so long responses count more.
    "token": Aggregation(count=lambda mask: float(mask.sum().item()), reduce=_token_reduce),
    # GRPO paper: each sequence weighs the same (mean over its tokens, then over sequences).
    # A sequence with no valid tokens still counts as one sequence and contributes 0.
    "sequence": Aggregation(count=lambda mask: float(mask.shape[0]), reduce=_sequence_reduce),
}


def get_aggregation(name: str) -> Aggregation:
    """The aggregation registered under `name`, or a ValueError listing the known names."""
    if name not in LOSS_AGG:
        raise ValueError(f"unknown loss aggregation {name!r}; choose one of: {', '.join(LOSS_AGG)}")
    return LOSS_AGG[name]


# ---------------------------------------------------------------- losses


def _check_shapes(logp: Tensor, other: Tensor, mask: Tensor, other_name: str) -> None:
    if logp.dim() != 2 or logp.shape != other.shape or logp.shape != mask.shape:
        raise ValueError(f"logp, {other_name} and mask must all have the same (B, T) shape; got "
                         f"{tuple(logp.shape)}, {tuple(other.shape)}, {tuple(mask.shape)}")


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    agg: str = "token",
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO-clipped surrogate loss (scalar) and stats for one (micro-)batch.

    logp, old_logp, mask: (B, T); advantages: (B,), one per sequence, broadcast over its tokens.
    ratio = exp(logp - old_logp); per token: -min(ratio * A, clip(ratio, 1-clip_low, 1+clip_high) * A).
    `denominator` defaults to `LOSS_AGG[agg].count(mask)` (this batch alone); when a batch is
    split into micro-batches pass the count summed over all of them (see module docstring).

    Stats (over this batch's valid tokens): clip_frac, the share of tokens where the clipped
    branch is taken (their gradient is zero); ratio_mean; tokens, the number of valid tokens
    (to weight stats when combining micro-batches).
    """
    _check_shapes(logp, old_logp, mask, "old_logp")
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must have shape (B,) = ({logp.shape[0]},), one per "
                         f"sequence; got {tuple(advantages.shape)}")
    aggregation = get_aggregation(agg)
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    # Zero the log-ratio on padding before exp: garbage there must not overflow into NaN grads.
    log_ratio = torch.where(mask > 0, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio)  # (B, T)
    unclipped = -ratio * adv
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = torch.maximum(unclipped, clipped)  # = -min(ratio*A, clip(ratio)*A)
    if denominator is None:
        denominator = aggregation.count(mask)
    loss = aggregation.reduce(per_token, mask, denominator)
    with torch.no_grad():
        stats = {
            "clip_frac": float(masked_mean((clipped > unclipped).to(mask.dtype), mask)),
            "ratio_mean": float(masked_mean(ratio, mask)),
            "tokens": float(mask.sum()),
        }
    return loss, stats


def kl_k3(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(policy || reference), (B, T), zero on padding.

    k3 = exp(ref - logp) - (ref - logp) - 1, which is >= 0 everywhere (e^x >= 1 + x) and
    unbiased for the KL when tokens are sampled from the policy (Schulman's "Approximating KL").
    """
    _check_shapes(logp, ref_logp, mask, "ref_logp")
    diff = torch.where(mask > 0, ref_logp.detach() - logp, torch.zeros_like(logp))  # (B, T)
    return torch.exp(diff) - diff - 1.0  # 0 where diff is 0, so padding stays 0
