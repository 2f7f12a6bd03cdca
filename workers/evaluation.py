"""The driver side of a held-out evaluation: the eval prompts split over the rollout workers, each
share generated with `RolloutWorker.evaluate` (no trace in the engines' drafting state), and each
share scored by the run's reward functions in a Ray task as soon as it arrives, as a step's
scoring runs off the driver (`workers.stream`).
"""

from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.exceptions import RayActorError

from rhymerl.data.records import Prompt, Sample
from rhymerl.data.rewards import RewardScore, RewardSet
from rhymerl.run.evaluation import split_prompts
from rhymerl.vllm.engine import SamplingSettings
from workers.stream import Scoring


def _score(scoring: Scoring, samples: list[Sample]) -> list[RewardScore]:
    return scoring.score(samples)


score_share = ray.remote(_score)  # a share's scores, as a step's chunks are scored (workers.stream)


@dataclass(frozen=True)
class EvalResult:
    """Every sample of an evaluation, grouped by prompt in the eval set's order, and its score."""

    samples: list[Sample]
    scores: list[RewardScore]


def run_eval(workers: list, prompts: list[Prompt], spec: SamplingSettings, rewards: RewardSet,
             guard=None) -> EvalResult:
    """Generate `spec.n` samples of every prompt on `workers` (contiguous shares) and score them.

    With `guard` (`workers.guard.WorkerGuard`), workers that restarted are brought up to date first,
    and a worker that dies during its share is restarted and runs the share again (an evaluation
    keeps no partial result); without one, the actor error is raised.
    """
    if guard is not None:
        guard.ensure_current()
    shares = split_prompts(prompts, len(workers))
    pending = {workers[w].evaluate.remote(share, spec): w for w, share in enumerate(shares) if share}
    scoring: dict[int, tuple[list[Sample], ray.ObjectRef]] = {}  # worker -> its samples, their scoring
    while pending:
        [ready], _ = ray.wait(list(pending), num_returns=1)
        w = pending.pop(ready)
        try:
            samples = ray.get(ready)
        except RayActorError as exc:
            if guard is None:
                raise
            guard.recover(w, exc)
            pending[workers[w].evaluate.remote(shares[w], spec)] = w
            continue
        scoring[w] = (samples, score_share.remote(Scoring.of(rewards, shares[w]), samples))
    out_samples: list[Sample] = []
    out_scores: list[RewardScore] = []
    for w in sorted(scoring):  # shares are contiguous: worker order is the eval set's order
        samples, ref = scoring[w]
        out_samples += samples
        out_scores += ray.get(ref)
    return EvalResult(out_samples, out_scores)
