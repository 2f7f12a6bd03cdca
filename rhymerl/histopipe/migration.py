"""Straggler migration in the real run (HistoPipe tier 2): who moves, and joining the two parts.

In a step's tail, a request whose generated length already exceeds its prompt's forecast is
likely the step's straggler. If another worker sits idle, the request is stopped between engine
steps on its worker and resubmitted to the idle one with prompt + generated prefix as its prompt
and `max_tokens` reduced by the prefix. Both parts come from the same step's weights, so the
sample is strictly on-policy: the prefix is a sample of the policy, and the continuation is
sampled from the policy's conditional given that prefix, exactly as if it had never moved (the
decision to move depends only on tokens already generated). Tokens the first worker may have
computed after the last one it reported are discarded, never used.

`select_migrations` is the rule (pure, mirrors `simulator.MigrationSettings`): only once at most
`tail_fraction` of the step's requests are unfinished; a request qualifies when its generated
tokens reached `threshold` x its prompt's forecast peak and it still has tokens to go; a source
worker must keep other work (moving its lone request gains nothing); a request moves at most
once; the most overdue move first, each idle worker taking up to `per_worker`.

`join_prefix` builds the one lake row of a migrated request: prefix + continuation tokens, one
log-prob per token, the original sample index and first admission time.

HistoSpec and migration: the drafter recognises a request's prompt from the leading token ids of
its row, and a migrated request's row still starts with its prompt, so it drafts from the
prompt's history as before; its prefix joins the prompt's sibling index as a new sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from rhymerl.config.pipe import PipeConfig
from rhymerl.data.records import Partial, Sample


@dataclass(frozen=True)
class MigrationRule:
    """When a running request moves to an idle worker (see the module docstring)."""

    tail_fraction: float = 0.10  # act once at most this share of the step's requests is unfinished
    threshold: float = 1.0  # straggler: generated tokens >= threshold x forecast peak of its prompt
    per_worker: int = 1  # stragglers an idle worker takes per decision

    def __post_init__(self) -> None:
        if not 0.0 < self.tail_fraction <= 1.0:
            raise ValueError(f"MigrationRule.tail_fraction={self.tail_fraction}: must be in (0, 1] "
                             "(pipe.migrate_tail)")
        if not (self.threshold >= 0 and math.isfinite(self.threshold)):
            raise ValueError(f"MigrationRule.threshold={self.threshold}: must be a finite number >= 0 "
                             "(pipe.migrate_threshold)")
        if self.per_worker < 1:
            raise ValueError(f"MigrationRule.per_worker={self.per_worker}: must be >= 1 (pipe.migrate_per_worker)")

    @classmethod
    def from_settings(cls, pipe: PipeConfig) -> MigrationRule:
        """The rule a run's `pipe.*` settings describe."""
        return cls(tail_fraction=pipe.migrate_tail, threshold=pipe.migrate_threshold, per_worker=pipe.migrate_per_worker)


@dataclass(frozen=True)
class WorkerView:
    """What the driver last heard from one worker during a step."""

    running: Mapping[tuple[str, int], int] = field(default_factory=dict)  # (prompt_id, sample_idx) -> tokens so far
    queued: int = 0  # requests admitted to the engine but not yet reported running
    busy: bool = False  # its stream for this step is still open (or a migration is on its way to it)

    @property
    def work(self) -> int:
        return len(self.running) + self.queued


@dataclass(frozen=True)
class Move:
    """Stop `key` on worker `src` and continue it on worker `dest`."""

    key: tuple[str, int]
    src: int
    dest: int


def select_migrations(rule: MigrationRule, total: int, finished: int, workers: Sequence[WorkerView],
                      forecast_peak: Mapping[str, float], max_tokens: int,
                      moved: set[tuple[str, int]] | frozenset = frozenset()) -> list[Move]:
    """The moves to make now (possibly none). `total`/`finished`: the step's requests and how many
    have finished; `moved`: requests that already moved or are moving (they never move again).

    A prompt without a forecast never counts as a straggler.
    """
    if total <= 0 or total - finished > rule.tail_fraction * total:
        return []
    idle = [w for w, v in enumerate(workers) if not v.busy]
    if not idle:
        return []
    candidates: list[tuple[float, int, tuple[str, int]]] = []
    for src, view in enumerate(workers):
        if not view.busy:
            continue
        for key, generated in view.running.items():
            peak = forecast_peak.get(key[0])
            if key in moved or peak is None or generated < 1 or generated >= max_tokens:
                continue
            overdue = generated - rule.threshold * peak
            if overdue >= 0:
                candidates.append((overdue, src, key))
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    left = {src: view.work for src, view in enumerate(workers)}
    moves: list[Move] = []
    slots = [dest for dest in idle for _ in range(rule.per_worker)]
    for _, src, key in candidates:
        if not slots:
            break
        if left[src] < 2:  # the source keeps other work, or moving gains nothing
            continue
        left[src] -= 1
        moves.append(Move(key, src, slots.pop(0)))
    return moves


def join_prefix(prefix: Partial, continuation: Sample) -> Sample:
    """One sample from a migrated request's prefix and its continuation on the new worker.

    Texts are concatenated: vLLM detokenizes the continuation in the context of prompt + prefix,
    so characters spanning the boundary come out right. Raises if the parts belong to different
    requests or a part's log-probs do not match its tokens.
    """
    if (prefix.prompt_id, prefix.sample_idx) != (continuation.prompt_id, continuation.sample_idx):
        raise ValueError(f"join_prefix: prefix of {prefix.prompt_id}/{prefix.sample_idx} cannot join the "
                         f"continuation of {continuation.prompt_id}/{continuation.sample_idx}")
    for name, part in (("prefix", prefix), ("continuation", continuation)):
        if len(part.token_ids) != len(part.logprobs):
            raise ValueError(f"join_prefix: the {name} of {prefix.prompt_id}/{prefix.sample_idx} has "
                             f"{len(part.token_ids)} tokens but {len(part.logprobs)} log-probs")
    return replace(continuation, token_ids=prefix.token_ids + continuation.token_ids,
                   logprobs=prefix.logprobs + continuation.logprobs,
                   text=prefix.text + continuation.text, t_start=prefix.t_start,
                   migrated_from_worker=prefix.worker_id, migrated_at=continuation.t_start)
