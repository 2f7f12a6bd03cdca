"""Goodness of fit of sampled tokens against the exact conditional distributions of the model.

Each sampled response is checked position by position against the distribution the policy
defines at that position given the response's own prefix (`rhymerl.policy.sampling.sampling_probs` of
the Hugging Face model's logits). Because the conditionals differ from sample to sample, tokens
are binned by their rank under their own conditional (the most likely token, the 2nd, ... the
8th, the rest). Under the null hypothesis the count in bin b is a sum of independent
Bernoulli(pi_ib) draws: mean E_b = sum pi_ib, variance V_b = sum pi_ib (1 - pi_ib), so
z_b = (O_b - E_b) / sqrt(V_b) is standard normal (tens of thousands of samples). A verifier that
favours drafts (which are the most likely tokens here) moves mass into the rank-0 bin; a wrong
temperature or nucleus moves it between all bins; a token outside the nucleus is impossible.

Power: with N samples at a position, a shift of delta in the probability of a bin whose samples
have mean pi (1 - pi) = v is found with 80% power at two-sided level ALPHA when
delta >= (z_{1-ALPHA/2} + z_{0.8}) * sqrt(v / N)  (`PositionFit.detectable`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import norm

from rhymerl.policy.sampling import sampling_probs

ALPHA = 2e-5  # per bin test; ~100 such tests in the lossless module: < 0.2% of sound runs fail
Z_ALPHA = float(norm.isf(ALPHA / 2))  # 4.26
Z_POWER = float(norm.isf(0.2))  # 0.84: 80% power
# [start, end) ranks under the sample's own conditional: the 8 most likely tokens one by one, then the rest
RANK_BINS = tuple((r, r + 1) for r in range(8)) + ((8, None),)
BIN_NAMES = tuple(f"rank {r + 1}" for r in range(8)) + ("rank 9+",)


@dataclass
class PositionFit:
    """Observed vs expected counts per rank bin at one output position."""

    position: int
    n: int
    observed: np.ndarray
    expected: np.ndarray
    variance: np.ndarray
    impossible: int  # samples whose token has probability 0 under the reference (outside the nucleus)

    def z(self) -> np.ndarray:
        return (self.observed - self.expected) / np.sqrt(np.maximum(self.variance, 1e-12))

    def mean_prob(self) -> np.ndarray:
        return self.expected / max(self.n, 1)

    def detectable(self) -> np.ndarray:
        """Smallest shift of each bin's probability found with 80% power at ALPHA."""
        return (Z_ALPHA + Z_POWER) * np.sqrt(self.variance) / max(self.n, 1)

    def passes(self) -> bool:
        return bool(np.all(np.abs(self.z()) <= Z_ALPHA)) and self.impossible <= max(2, self.n // 10_000)

    def line(self) -> str:
        cells = " ".join(f"{name} {p:.3f} z={z:+.1f} (finds {d * 100:.2f} pt)" for name, p, z, d in
                         zip(BIN_NAMES, self.mean_prob(), self.z(), self.detectable()))
        return f"  position {self.position}: n={self.n} impossible={self.impossible} | {cells}"


def bin_probs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row bin probabilities (N, B), per-row descending order of the vocabulary (N, V))."""
    ordered, order = q.sort(dim=-1, descending=True)
    cols = [ordered[:, a:b].sum(-1) if b is not None else ordered[:, a:].sum(-1) for a, b in RANK_BINS]
    return torch.stack(cols, dim=-1), order


def rank_bin(order: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Which rank bin each row's token falls in, (N,)."""
    rank = (order == tokens[:, None]).float().argmax(dim=-1)
    edges = torch.tensor([a for a, _ in RANK_BINS[1:]])
    return torch.bucketize(rank, edges, right=True)


def fit_positions(model, prompt_ids: list[tuple[int, ...]], responses: list[tuple[int, ...]], positions: int,
                  temperature: float, top_p: float, chunk: int = 4096) -> list[PositionFit]:
    """Fit every sampled response (`responses[i]` after `prompt_ids[i]`, all prompts one length)
    at output positions 0..positions-1 against `model`'s sampling distribution."""
    plen = len(prompt_ids[0])
    assert all(len(p) == plen for p in prompt_ids), "prompts of one length keep the batch unpadded"
    bins = len(RANK_BINS)
    acc = [dict(n=0, o=np.zeros(bins), e=np.zeros(bins), v=np.zeros(bins), bad=0) for _ in range(positions)]
    for start in range(0, len(responses), chunk):
        resp = responses[start:start + chunk]
        ids = torch.tensor([list(p) + list(r[:positions]) + [0] * (positions - len(r[:positions]))
                            for p, r in zip(prompt_ids[start:start + chunk], resp)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, plen - 1: plen - 1 + positions]
        lengths = torch.tensor([len(r) for r in resp])
        for t in range(positions):
            rows = lengths > t
            q = sampling_probs(logits[rows, t], temperature, top_p)
            tokens = ids[rows, plen + t]
            possible = q.gather(1, tokens[:, None])[:, 0] > 0
            pi, order = bin_probs(q[possible])
            hit = rank_bin(order, tokens[possible])
            a = acc[t]
            a["n"] += int(possible.sum())
            a["bad"] += int((~possible).sum())
            a["o"] += np.bincount(hit.numpy(), minlength=bins)
            a["e"] += pi.sum(0).numpy()
            a["v"] += (pi * (1 - pi)).sum(0).numpy()
    return [PositionFit(t, a["n"], a["o"], a["e"], a["v"], a["bad"]) for t, a in enumerate(acc)]


SYNTHETIC = np.array([0.45, 0.30, 0.15, 0.05] + [0.05 / 36] * 36)  # tokens of 30%, 15% and 5% at ranks 2-4


def synthetic_flagged(rng: np.random.Generator, n: int, token_prob: float, shift: float) -> bool:
    """One trial of the test on synthetic data: n samples of a conditional (`SYNTHETIC`) whose
    token of probability `token_prob` is drawn `shift` more often (taken proportionally from the
    others). Samples whose conditionals differ only lower each bin's variance, so one fixed
    conditional is the hardest case for a given bin probability. True when some |z| > Z_ALPHA."""
    j = int(np.argmin(np.abs(SYNTHETIC - token_prob)))
    true = SYNTHETIC * (1 - SYNTHETIC[j] - shift) / (1 - SYNTHETIC[j])
    true[j] = SYNTHETIC[j] + shift
    counts = rng.multinomial(n, true / true.sum())  # SYNTHETIC is sorted: index = rank
    pi, _ = bin_probs(torch.tensor(SYNTHETIC[None].copy()))
    o = np.array([counts[a:b].sum() for a, b in RANK_BINS])
    e, v = n * pi[0].numpy(), n * (pi[0] * (1 - pi[0])).numpy()
    return bool(np.any(np.abs((o - e) / np.sqrt(v)) > Z_ALPHA))
