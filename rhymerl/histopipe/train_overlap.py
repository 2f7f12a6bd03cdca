"""Streamed training on a trainer with devices of its own, estimated from a simulated rollout step.

A prompt's group can train as soon as its last sample finishes (`rhymerl.policy.stream`: the
forward/backward of each complete group, one optimizer step after the last). With the trainer on
GPUs of its own it works while the rollout's tail generates, so the step's train part shrinks from
every group's cost (the batch path, after the rollout) to what is left when the rollout ends.

Model: the trainer takes groups one at a time in the order they finish; a group costs
`s_per_token` x its response tokens (forward/backward scale with tokens; prompts, padding and
the optimizer step, which both paths pay once, are left out); the trainer is idle otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from rhymerl.histopipe.simulator import RequestSpan


@dataclass(frozen=True)
class StreamedTrain:
    """Seconds of training after the rollout's end, batch path vs streamed groups."""

    batch_s: float  # every group's forward/backward, after the rollout
    tail_s: float  # what streaming leaves after the rollout: the groups that finish last, queued


def group_finish(spans: Sequence[RequestSpan]) -> dict[str, float]:
    """Each prompt's group finish time: when its last sample's last span ends."""
    out: dict[str, float] = {}
    for s in spans:
        out[s.prompt_id] = max(out.get(s.prompt_id, 0.0), s.end)
    return out


def streamed_train(spans: Sequence[RequestSpan], tokens: Mapping[tuple[str, int], int],
                   s_per_token: float) -> StreamedTrain:
    """Train time after the rollout of the step whose requests ran as `spans`, where
    `tokens[(prompt_id, sample_idx)]` are each response's tokens (module docstring: the model)."""
    finish = group_finish(spans)
    cost = dict.fromkeys(finish, 0.0)
    for (pid, _), n in tokens.items():
        cost[pid] += s_per_token * n
    free = 0.0  # when the trainer is done with the groups taken so far
    for pid in sorted(finish, key=finish.__getitem__):
        free = max(free, finish[pid]) + cost[pid]
    end = max(finish.values(), default=0.0)
    return StreamedTrain(batch_s=sum(cost.values()), tail_s=max(0.0, free - end))


__all__ = ["StreamedTrain", "group_finish", "streamed_train"]
