"""Pure helpers around one RL step's rollouts: splitting work, grouping, advantages, metrics.

Everything here works on plain records (`Prompt`, `Sample`, rewards as floats) so it runs the
same in a Prefect task, a Ray actor or a unit test.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from rhymerl.data.rewards import RewardScore
from rhymerl.policy.grpo import group_advantages
from rhymerl.policy.trainer import TrainExample
from rhymerl.data.records import Prompt, Sample


def epoch_order(prompts: Sequence[Prompt], epoch: int, seed: int) -> list[Prompt]:
    """The epoch's prompt order: every prompt once, shuffled by (seed, epoch) reproducibly."""
    order = list(prompts)
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def step_batches(prompts: Sequence[Prompt], per_step: int) -> list[list[Prompt]]:
    """Consecutive batches of `per_step` prompts (the last may be smaller)."""
    return [list(prompts[i:i + per_step]) for i in range(0, len(prompts), per_step)]


def check_groups(prompts: Sequence[Prompt], samples: Sequence[Sample], n: int) -> None:
    """Raise unless the samples are exactly sample indices 0..n-1 of every prompt, each once
    (a lost, duplicated or misnumbered response; tier 2 splits groups over workers)."""
    got: dict[str, list[int]] = {}
    for s in samples:
        got.setdefault(s.prompt_id, []).append(s.sample_idx)
    want = list(range(n))
    bad = {p.prompt_id: sorted(got.get(p.prompt_id, [])) for p in prompts
           if sorted(got.get(p.prompt_id, [])) != want}
    extra = set(got) - {p.prompt_id for p in prompts}
    if bad or extra or len(samples) != len(prompts) * n:
        raise RuntimeError(f"expected sample indices 0..{n - 1} once for each of {len(prompts)} prompts, got "
                           f"{len(samples)} samples; mismatched groups (their indices): "
                           f"{dict(list(bad.items())[:5])}; unknown prompts: {sorted(extra)[:5]}")


def advantages_for(samples: Sequence[Sample], rewards: Sequence[float], scale: bool, eps: float) -> list[float]:
    """GRPO advantages of each sample, normalised within its prompt's group.

    Samples may arrive in any order; groups are formed by prompt_id and every group must have
    the same size (the rollout's n).
    """
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.prompt_id, []).append(i)
    index = list(groups.values())
    r = torch.tensor([[rewards[i] for i in g] for g in index], dtype=torch.float64)  # (G, n)
    adv = group_advantages(r, scale=scale, eps=eps)
    out = [0.0] * len(samples)
    for g, row in zip(index, adv.tolist()):
        for i, a in zip(g, row):
            out[i] = float(a)
    return out


def train_examples(prompts: Sequence[Prompt], samples: Sequence[Sample], rewards: Sequence[float], scale: bool,
                   eps: float) -> list[TrainExample]:
    """What the trainer gets for these samples, in their order: each with its group-normalised
    advantage (`advantages_for`) and the engine's log-probs. Whole groups only: the same
    examples whether a step's groups come all at once or one at a time (streamed training)."""
    adv = advantages_for(samples, rewards, scale=scale, eps=eps)
    by_id = {p.prompt_id: p for p in prompts}
    return [TrainExample(by_id[s.prompt_id].token_ids, s.token_ids, a, s.logprobs) for s, a in zip(samples, adv)]


@dataclass(frozen=True)
class StepStats:
    """Summary of one step's rollouts (what the progress line and MLflow show)."""

    reward_mean: float  # of the weighted total
    reward_std: float
    accuracy: float | None  # None when no reward function judges correctness (then left out, not 0)
    length_mean: float
    length_max: int
    tokens: int
    truncated: int  # responses that hit max_tokens
    reward_values: Mapping[str, float] = field(default_factory=dict)  # each function's mean value, by name

    def as_metrics(self) -> dict[str, float]:
        """Flat metrics: every number, each function's mean as `reward/<name>`; no accuracy when None."""
        out = {k: float(v) for k, v in self.__dict__.items() if k != "reward_values" and v is not None}
        out.update({f"reward/{name}": float(v) for name, v in self.reward_values.items()})
        return out


def step_stats(samples: Sequence[Sample], scores: Sequence[RewardScore]) -> StepStats:
    """Reward (total and each function's), accuracy and length statistics over a step's samples.

    Accuracy is the share of correct samples among those some function judged; None when none was."""
    r = torch.tensor([s.total for s in scores], dtype=torch.float64)
    judged = [s.correct for s in scores if s.correct is not None]
    per_fn: dict[str, list[float]] = {}  # function name -> its values, in spec order of first sight
    for s in scores:
        for name, value in s.values.items():
            per_fn.setdefault(name, []).append(value)
    lengths = [len(s.token_ids) for s in samples]
    return StepStats(
        reward_mean=float(r.mean()),
        reward_std=float(r.std(unbiased=False)),
        accuracy=sum(judged) / len(judged) if judged else None,
        length_mean=sum(lengths) / len(lengths),
        length_max=max(lengths),
        tokens=sum(lengths),
        truncated=sum(1 for s in samples if s.finish_reason == "length"),
        reward_values={name: sum(v) / len(v) for name, v in per_fn.items()},
    )


def rollout_rows(run_id: str, epoch: int, step: int, prompts: Sequence[Prompt], samples: Sequence[Sample],
                 scores: Sequence[RewardScore], policy_version: int) -> list[dict]:
    """One lake row per sample (the column names of `storage.schema.ROLLOUTS_SCHEMA`): `reward` is
    the weighted total, `reward_values` each function's value, `correct` None when no function
    judged it. `formatted` is left NULL: it was the GSM8K rule's own (now the gsm8k function's value)."""
    by_id = {p.prompt_id: p for p in prompts}
    rows = []
    for s, r in zip(samples, scores):
        p = by_id[s.prompt_id]
        rows.append({
            "run_id": run_id, "epoch": epoch, "step": step,
            "prompt_id": s.prompt_id, "prompt_index": p.index, "prompt_text": p.text,
            "sample_idx": s.sample_idx, "response_token_ids": list(s.token_ids),
            "response_text": s.text, "logprobs": list(s.logprobs),
            "reward": r.total, "correct": r.correct,
            "reward_values": list(r.values.items()),
            "length": len(s.token_ids), "finish_reason": s.finish_reason,
            "policy_version": policy_version, "worker_id": s.worker_id,
            "gen_start": s.t_start, "gen_end": s.t_end,
            "migrations": s.migrations, "migrated_from_worker": s.migrated_from_worker,
            "migrated_at": s.migrated_at,
        })
    return rows
