"""Small typed records that cross task and process boundaries.

Records hold plain Python values (ints, floats, strings, tuples) so they pickle cheaply through
Ray and can be turned into Arrow rows by `storage/` without touching tensors or engine objects.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Sequence


def prompt_id_of(token_ids: Sequence[int]) -> str:
    """Stable 16-hex-digit id of a prompt from its token ids (same on every process and machine)."""
    packed = struct.pack(f"<{len(token_ids)}q", *token_ids)
    return hashlib.blake2b(packed, digest_size=8).hexdigest()


@dataclass(frozen=True)
class Problem:
    """One dataset row: a question with a checkable final answer."""

    index: int  # position in the dataset (stable for a given dataset and seed)
    question: str
    answer: str  # gold final answer, normalised (e.g. "42")
    solution: str = ""  # worked solution text ending in "#### <answer>", if known


@dataclass(frozen=True)
class Prompt:
    """A problem rendered with the prompt template and tokenized for the engine."""

    prompt_id: str  # prompt_id_of(token_ids)
    index: int
    text: str
    token_ids: tuple[int, ...]
    answer: str


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
    t_start: float  # unix seconds when the request was admitted
    t_end: float  # unix seconds when the response finished
