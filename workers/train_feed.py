"""Streamed training from the driver's side: each prompt's group goes to the trainer the moment
its n samples are finished, so its forward/backward runs while the rollout's tail generates.

The rollout driver (`workers.stream`) calls `begin` once, `finished` for every sample that counts
and `discard` when a dead worker's samples are thrown away. A complete group is scored here
(`rhymerl.data.reward.score_batch`: a regex per response), given its GRPO advantages and examples
exactly as the batch path builds them (`rhymerl.run.rollout.train_examples`), and sent to the trainer
actor's `stream_add`, fire-and-forget (an actor runs one caller's calls in order). At train time
`finish` takes the update from the stream only when the trainer holds exactly the step's committed
samples with the step's rewards; anything else (a discarded sample, a retried rollout, rows the
lake held from before) aborts the stream and the caller trains the batch instead.
"""

from __future__ import annotations

from typing import Sequence

import ray

from rhymerl.data.reward import RewardResult, score_batch
from rhymerl.data.records import Prompt, Sample
from rhymerl.run.rollout import train_examples


class GroupFeed:
    """One step's stream of complete groups to `trainer` (a `TrainerWorker`)."""

    def __init__(self, trainer, prompts: Sequence[Prompt], n: int, scale: bool, eps: float) -> None:
        self.trainer, self.n, self.scale, self.eps = trainer, n, scale, eps
        self.prompts = {p.prompt_id: p for p in prompts}
        self.pending: dict[str, list[Sample]] = {}  # prompt_id -> its finished samples, group incomplete
        self.handed: dict[tuple[str, int], tuple[tuple[int, ...], float]] = {}  # key -> (tokens, reward) sent
        self.began = False
        self.broken = ""  # why the stream cannot give the step's update ("" while it can)

    def begin(self) -> None:
        """Start the trainer's stream (discarding any unfinished one). A second call means the
        rollout ran again (a retried task): its first attempt's groups may be in the trainer."""
        if self.began:
            self.invalidate("the rollout ran again (a retried rollout task)")
            return
        self.began = True
        self.trainer.stream_begin.remote()

    def finished(self, sample: Sample) -> None:
        """A sample that counts for the step; hands its group over once the group is complete."""
        if self.broken:
            return
        group = self.pending.setdefault(sample.prompt_id, [])
        group.append(sample)
        if len(group) == self.n:
            self._hand(self.pending.pop(sample.prompt_id))

    def discard(self, keys: Sequence[tuple[str, int]]) -> None:
        """Finished samples the driver threw away (their worker died): the stream may hold them."""
        if keys:
            self.invalidate(f"{len(keys)} finished sample(s) were discarded after their worker died")

    def invalidate(self, reason: str) -> None:
        """Hand nothing more; `finish` aborts the stream. The first reason is kept."""
        self.broken = self.broken or reason
        self.pending.clear()

    def _hand(self, group: list[Sample]) -> None:
        prompt = self.prompts[group[0].prompt_id]
        rewards = [r.reward for r in score_batch([s.text for s in group], [prompt.answer] * len(group))]
        self.trainer.stream_add.remote(train_examples([prompt], group, rewards, self.scale, self.eps))
        self.handed.update({(s.prompt_id, s.sample_idx): (s.token_ids, r) for s, r in zip(group, rewards)})

    def mismatch(self, samples: Sequence[Sample], scores: Sequence[RewardResult]) -> str:
        """Why the stream does not hold exactly these samples with these rewards ("" when it does)."""
        if self.broken or not self.began:
            return self.broken or "the stream never began"
        want = {(s.prompt_id, s.sample_idx): (s.token_ids, r.reward) for s, r in zip(samples, scores)}
        if want != self.handed:
            return (f"the trainer holds {len(self.handed)} streamed samples and the step trains on {len(want)}, "
                    "not the same samples and rewards (rows the lake held from before?)")
        return ""

    def finish(self, samples: Sequence[Sample], scores: Sequence[RewardResult]) -> dict | None:
        """The step's update from the stream (`Trainer.train_step`'s metrics) when the trainer holds
        exactly `samples` with `scores`' rewards; else the stream is aborted and None returned
        (the reason in `broken`): the caller trains the batch path on them."""
        why = self.mismatch(samples, scores)
        if not why:
            out = ray.get(self.trainer.stream_finish.remote(len(self.handed)))
            if out is not None:
                return out
            why = "the trainer's stream was incomplete (a stream_add failed)"
        self.invalidate(why)
        if self.began:
            self.trainer.stream_abort.remote()
        return None


__all__ = ["GroupFeed"]
