"""Small typed records that cross task and process boundaries.

Records hold plain Python values (ints, floats, strings, tuples) so they pickle cheaply through
Ray and can be turned into Arrow rows by `storage/` without touching tensors or engine objects.
"""

from __future__ import annotations

import hashlib
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence


def new_run_id(name: str) -> str:
    """Sortable, unique run id: name, UTC time and a random suffix."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"


def prompt_id_of(token_ids: Sequence[int]) -> str:
    """Stable 16-hex-digit id of a prompt from its token ids (same on every process and machine)."""
    packed = struct.pack(f"<{len(token_ids)}q", *token_ids)
    return hashlib.blake2b(packed, digest_size=8).hexdigest()


@dataclass(frozen=True)
class Problem:
    """One dataset row: its prompt cell, its gold answer (if the data has one) and every column.

    Reward functions get `row` (every column of the dataset row, as read); `question` is the prompt
    cell (text, or a list of chat messages) and `answer` the answer column as text ("" if none)."""

    index: int  # position in the dataset (stable for a given dataset and seed)
    question: Any  # the prompt column: text, or chat messages [{"role": ..., "content": ...}]
    answer: str  # gold final answer as text (e.g. "42"); "" when the data has no answer column
    solution: str = ""  # worked solution text ending in "#### <answer>", if known
    row: Mapping[str, Any] = field(default_factory=dict, hash=False)  # every column of the dataset row


@dataclass(frozen=True)
class Prompt:
    """A problem rendered with the prompt template and tokenized for the engine."""

    prompt_id: str  # prompt_id_of(token_ids)
    index: int
    text: str
    token_ids: tuple[int, ...]
    answer: str
    row: Mapping[str, Any] = field(default_factory=dict, hash=False)  # the problem's dataset row (reward functions read it)


@dataclass(frozen=True)
class Sample:
    """One generated response to a prompt, as the engine returned it."""

    prompt_id: str
    sample_idx: int  # 0..n-1 within the prompt's group
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # engine log-prob of each sampled token (same length as token_ids)
    text: str
    finish_reason: str  # "stop" (EOS/stop string) or "length"
    worker_id: int
    t_start: float  # unix seconds when the request was admitted (on its first worker if migrated)
    t_end: float  # unix seconds when the response finished
    migrated_from_worker: int | None = None  # worker that generated its prefix (HistoPipe migration)
    migrated_at: float | None = None  # unix seconds when the prefix moved to `worker_id`

    @property
    def migrations(self) -> int:
        """Times the request moved between workers (at most once in RhymeRL)."""
        return 0 if self.migrated_from_worker is None else 1


@dataclass(frozen=True)
class Partial:
    """The generated prefix of a request stopped on one worker, to be continued on another.

    Stopped between engine steps: every token was sampled by the step's weights, one log-prob each.
    """

    prompt_id: str
    sample_idx: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # one per token
    text: str  # detokenized prefix
    worker_id: int  # the worker that generated the prefix
    t_start: float  # unix seconds when the request was first admitted
    t_stop: float  # unix seconds when it was stopped


@dataclass(frozen=True)
class Request:
    """One sample to generate: `sample_idx` of `prompt`'s group, continuing `prefix` if migrated."""

    prompt: Prompt
    sample_idx: int
    prefix: Partial | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.prompt.prompt_id, self.sample_idx)
