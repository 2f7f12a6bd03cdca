"""The sampling distribution: what vLLM's sampler draws from, as differentiable torch.

The trainer's log-probs must be those of the distribution the engines sampled from, or the policy
gradient, the PPO ratio and the KL are computed for a different policy than the one that produced
the data. vLLM's sampler divides the logits by the temperature and then applies the nucleus
(top-p): sorted ascending, every token whose cumulative probability is at most 1 - top_p is
dropped, the most likely token always stays (`vllm.v1.sample.ops.topk_topp_sampler`). This module
is that rule once, for the trainer and for the tests that check the engines against it; the
exact verifier's reference (`rhymerl.vllm.spec_verify.processed_probs`) calls it too.

Shapes: logits (..., V); the result has the same shape.
"""

from __future__ import annotations

import torch
from torch import Tensor


def nucleus_mask(scaled: Tensor, top_p: float | Tensor) -> Tensor:
    """True where a token is dropped by top-p, for logits already divided by the temperature.

    `top_p` is a float or a tensor broadcastable to `scaled.shape[:-1]`. The mask is computed
    without gradient (which tokens are in the nucleus is a selection, not a function to
    differentiate), in float64 so that float32 engines and trainers agree except at exact ties.
    """
    with torch.no_grad():
        ascending, order = scaled.double().sort(dim=-1)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        limit = 1 - (top_p.double()[..., None] if isinstance(top_p, Tensor) else float(top_p))
        drop_sorted = cumulative <= limit
        drop_sorted[..., -1] = False  # the most likely token always stays
        return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def sampling_logits(logits: Tensor, temperature: float, top_p: float = 1.0,
                    keep: Tensor | None = None) -> Tensor:
    """Logits of the sampling distribution: `logits / temperature`, -inf outside the nucleus.

    Differentiable in `logits`. `keep` (integer ids of shape logits.shape[:-1]) names one token
    per row that always stays in: the trainer passes the sampled tokens so that a token the
    engine sampled right at the nucleus' edge (float rounding differs by ~1e-7) never gets a
    log-prob of -inf and a NaN gradient. Temperature must be > 0 (greedy has no log-probs).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling log-probs, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    scaled = logits / temperature if temperature != 1.0 else logits
    if top_p >= 1.0:
        return scaled
    drop = nucleus_mask(scaled, top_p)
    if keep is not None:
        drop = drop.scatter(-1, keep.unsqueeze(-1), False)
    return scaled.masked_fill(drop, float("-inf"))


NUCLEUS_ROWS = 4096  # rows whose vocabulary is sorted at once: bounds the float64 sort's memory


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0, top_p: float = 1.0) -> Tensor:
    """Log-prob of `tokens` (shape logits.shape[:-1]) under the sampling distribution, float32.

    Equal to vLLM's `logprobs_mode="processed_logprobs"` for the sampled token. With a nucleus the
    rows are processed NUCLEUS_ROWS at a time (the sort needs ~24 bytes per vocabulary entry).
    """
    flat, ids = logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)
    parts = []
    step = flat.shape[0] if top_p >= 1.0 else NUCLEUS_ROWS
    for start in range(0, flat.shape[0], max(step, 1)):
        rows, want = flat[start:start + step].float(), ids[start:start + step]
        scaled = sampling_logits(rows, temperature, top_p, keep=want)
        parts.append(scaled.gather(-1, want.unsqueeze(-1)).squeeze(-1) - scaled.logsumexp(-1))
    return (torch.cat(parts) if parts else flat.new_zeros(0)).reshape(tokens.shape)


def sampling_probs(logits: Tensor, temperature: float = 1.0, top_p: float = 1.0) -> Tensor:
    """The full sampling distribution (float64), for exact goodness-of-fit references."""
    return sampling_logits(logits.double(), temperature, top_p).softmax(dim=-1)
