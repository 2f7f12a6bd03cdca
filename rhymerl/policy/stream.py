"""Training while the rollout's tail generates: a step's gradients accumulated group by group.

GRPO's advantages are normalised within a prompt's group, so a group's examples are final as soon
as the group is complete and scored, while other groups still generate. `StreamedStep` runs each
such group's forward and backward at once and makes the step's one optimizer update after the
last group, with the same result as `Trainer.train_step` on the whole batch:

- every group is taken at the same weights (nothing steps the optimizer before `finish`), so its
  "old" log-probs, and with them the PPO ratio of the first update, are what the batch path sees;
- the loss normaliser of token-level (DAPO) aggregation is the whole batch's token count, unknown
  until the last group: each group adds its *un-normalised* sum (normaliser 1) and `finish` scales
  the accumulated gradients by 1 / count once; gradients are linear in that factor, so this equals
  dividing every micro-batch's loss by the count (sequence-level aggregation likewise, by sequences);
- clipping and the AdamW step (at the schedule's rate, which then moves on) follow, on the scaled
  gradients, as in the batch path.

Only the first update of a step can stream: with `train.updates_per_step > 1` the later updates
need the first one's weights, so they are refused here. The order of micro-batches aside, the
gradients equal the batch path's to float tolerance (tests/rhymerl/policy/test_stream.py).
"""

from __future__ import annotations

import time

import torch

from rhymerl.policy.trainer import TrainExample, Trainer


class StreamedStep:
    """One GRPO step fed a group at a time: `add` each complete group, then `finish` once."""

    def __init__(self, trainer: Trainer) -> None:
        if trainer.cfg.updates_per_step != 1:
            raise ValueError(f"train.updates_per_step={trainer.cfg.updates_per_step}: only a step's first "
                             "update can stream (the later ones need its weights); use 1, or train the batch")
        self.trainer = trainer
        self.count = 0.0  # the aggregation's normaliser so far (tokens, or sequences)
        self.sums = {"loss": 0.0, "kl": 0.0, "clip": 0.0, "ratio": 0.0, "tokens": 0.0, "diff": 0.0}
        self.missing = 0  # micro-batches without the engine's log-probs
        self.examples = 0
        self.busy = 0.0  # seconds in add and finish: the waits between groups are the rollout's
        self.done = False
        trainer.optimizer.zero_grad(set_to_none=True)

    def add(self, group: list[TrainExample]) -> None:
        """Forward and backward on one complete group's examples (their advantages final)."""
        if self.done:
            raise RuntimeError("StreamedStep.add after finish: start a new StreamedStep for the next step")
        t, start = self.trainer, time.perf_counter()
        for mb in t._micro_batches(group):
            with torch.no_grad():
                old = t._logprobs(t.model, mb)
                ref = t._logprobs(t.ref_model, mb) if t.ref_model is not None else None
            self.count += t.aggregation.count(mb.mask)
            part = t._backward(mb, old, ref, 1.0)  # a sum: scaled once in finish
            for key, value in zip(("loss", "kl", "clip", "ratio", "tokens"), part):
                self.sums[key] += value
            if mb.sampler is None:
                self.missing += 1
            else:
                self.sums["diff"] += float(((old - mb.sampler).abs() * mb.mask).sum())
        self.examples += len(group)
        self.busy += time.perf_counter() - start

    def finish(self) -> dict[str, float]:
        """Scale the accumulated gradients by 1 / the batch's normaliser, clip, step; the metrics
        `Trainer.train_step` returns, over everything added (`seconds`: the compute in `add` and
        `finish`, not the waits for groups)."""
        if self.done or self.examples == 0:
            raise ValueError("StreamedStep.finish needs at least one group added, and runs once")
        t, start = self.trainer, time.perf_counter()
        scale = 1.0 / max(self.count, 1.0)  # what reduce() divides by in the batch path
        for p in t.model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
        lr = float(t.optimizer.param_groups[0]["lr"])  # the update's; stepping moves the schedule on
        grad_norm = t._clip_and_step()
        t.policy_version += 1
        self.done = True
        s, seconds = self.sums, self.busy + time.perf_counter() - start
        n = max(s["tokens"], 1.0)
        out = {"loss": s["loss"] * scale, "grad_norm": grad_norm, "clip_frac": s["clip"] / n,
               "ratio_mean": s["ratio"] / n, "kl": s["kl"] * scale, "tokens": s["tokens"],
               "seconds": seconds, "tokens_per_s": s["tokens"] / max(seconds, 1e-9), "lr": lr}
        if self.missing == 0:
            out["logprob_abs_diff"] = s["diff"] / n
        return out


__all__ = ["StreamedStep"]
