"""Streamed training from the driver's side: each prompt's group goes to the trainer the moment
its n samples are finished, so its forward/backward runs while the rollout's tail generates.

The rollout driver (`workers.stream`) calls `begin` once, `finished` for every sample that counts
and `discard` when a dead worker's samples are thrown away. A complete group is scored by the run's
reward functions in a Ray task (`workers.stream.Scoring`: never on the driver's loop, so a slow
function holds neither the driver nor the engines), which also gives it its GRPO advantages and
examples exactly as the batch path builds them (`rhymerl.run.rollout.train_examples`); the trainer
actor's `stream_add` takes that task's result, fire-and-forget (Ray runs the call once the result is
ready; an actor runs one caller's calls in order). The step's own scoring (`workers.stream`) scores
the samples again: the feed's scores only serve the stream, and a group whose scoring failed stops
the stream, not the step. At train time
`finish` takes the update from the stream only when the trainer holds exactly the step's committed
samples with the step's rewards; anything else (a discarded sample, a retried rollout, rows the
lake held from before) aborts the stream and the caller trains the batch instead.
"""

from __future__ import annotations

from typing import Sequence

import ray

from rhymerl.data.rewards import RewardScore
from rhymerl.data.records import Prompt, Sample
from rhymerl.run.rollout import train_examples
from workers.stream import Scoring


@ray.remote(num_returns=2)
def _group_examples(scoring: Scoring, prompt: Prompt, group: list[Sample], scale: bool, eps: float):
    """A complete group's train examples and rewards (a Ray task: see the module docstring)."""
    rewards = [s.total for s in scoring.score(group)]
    return train_examples([prompt], group, rewards, scale, eps), rewards


class GroupFeed:
    """One step's stream of complete groups to `trainer` (a `TrainerWorker`)."""

    def __init__(self, trainer, prompts: Sequence[Prompt], n: int, scale: bool, eps: float, scoring: Scoring) -> None:
        self.trainer, self.n, self.scale, self.eps, self.scoring = trainer, n, scale, eps, scoring
        self.prompts = {p.prompt_id: p for p in prompts}
        self.pending: dict[str, list[Sample]] = {}  # prompt_id -> its finished samples, group incomplete
        self.sent: list[tuple[list[Sample], object]] = []  # each handed group and the ObjectRef of its rewards
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
        examples, rewards = _group_examples.remote(self.scoring.only(group), prompt, group, self.scale, self.eps)
        self.trainer.stream_add.remote(examples)
        self.sent.append((group, rewards))

    def handed(self) -> dict[tuple[str, int], tuple[tuple[int, ...], float]]:
        """(tokens, reward) of every sample sent, by key; waits for the groups' scoring (done by
        the time the step trains: the step's own scoring has finished)."""
        rewards = ray.get([ref for _, ref in self.sent])
        return {(s.prompt_id, s.sample_idx): (s.token_ids, r)
                for (group, _), values in zip(self.sent, rewards) for s, r in zip(group, values)}

    def mismatch(self, samples: Sequence[Sample], scores: Sequence[RewardScore]) -> str:
        """Why the stream does not hold exactly these samples with these rewards ("" when it does)."""
        if self.broken or not self.began:
            return self.broken or "the stream never began"
        try:
            handed = self.handed()
        except ray.exceptions.RayError as exc:
            return f"scoring a streamed group failed: {str(exc).strip().splitlines()[0]}"
        want = {(s.prompt_id, s.sample_idx): (s.token_ids, r.total) for s, r in zip(samples, scores)}
        if want != handed:
            return (f"the trainer holds {len(handed)} streamed samples and the step trains on {len(want)}, "
                    "not the same samples and rewards (rows the lake held from before?)")
        return ""

    def finish(self, samples: Sequence[Sample], scores: Sequence[RewardScore]) -> dict | None:
        """The step's update from the stream (`Trainer.train_step`'s metrics) when the trainer holds
        exactly `samples` with `scores`' rewards; else the stream is aborted and None returned
        (the reason in `broken`): the caller trains the batch path on them."""
        why = self.mismatch(samples, scores)
        if not why:
            out = ray.get(self.trainer.stream_finish.remote(sum(len(group) for group, _ in self.sent)))
            if out is not None:
                return out
            why = "the trainer's stream was incomplete (a stream_add failed)"
        self.invalidate(why)
        if self.began:
            self.trainer.stream_abort.remote()
        return None


__all__ = ["GroupFeed"]
