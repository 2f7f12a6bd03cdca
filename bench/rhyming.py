"""Seeded rhyming histories for HistoSpec's benchmarks (`rhymerl bench spec-scale`), and the
acceptance of a model that samples them.

`rhyming_group`: per prompt a base response of L uniform random token ids (vocab 151,936, Qwen's),
and every response of the prompt (its H history responses and its 16 live samples) a copy with each
token replaced by a uniform random one with probability 5%. Prompts are 64 random tokens.
`engine_rows` lays R requests (16 live samples per prompt) out as an engine's token rows beside the
bundle of their prompts' histories; `accept` is what a verification of their drafts keeps when the
model's choices are the rows' own next tokens. `Forward` is the engine's forward pass between two
drafting steps.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from rhymerl.histospec.bundle import HistoryBundle

VOCAB, PROMPT_LEN, SAMPLES, CHANGE = 151_936, 64, 16, 0.05


def rhyming_group(rng: np.random.Generator, length: int, history: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, responses): a prompt and `history + SAMPLES` responses of `length` tokens, rows 0..H-1
    the history, the rest the live samples; each a copy of one base response, 5% of tokens replaced."""
    base = rng.integers(0, VOCAB, length)
    rows = np.repeat(base[None], history + SAMPLES, axis=0)
    changed = rng.random(rows.shape) < CHANGE
    rows[changed] = rng.integers(0, VOCAB, int(changed.sum()))
    return rng.integers(0, VOCAB, PROMPT_LEN), rows


def engine_rows(rng, length: int, history: int, requests: int):
    """A HistoryBundle of R / 16 prompts and the engine's token rows: each request one live sample of
    its prompt, `pos` tokens in."""
    prompts = max(1, requests // SAMPLES)
    pos = min(length // 2, 8192)
    groups = [rhyming_group(rng, length, history) for _ in range(prompts)]
    arrays = {
        "prompt_lens": np.full(prompts, PROMPT_LEN), "num_responses": np.full(prompts, history),
        "prompt_tokens": np.concatenate([p for p, _ in groups]).astype(np.int32),
        "response_lens": np.full(prompts * history, length),
        "response_tokens": np.concatenate([r[:history].ravel() for _, r in groups]).astype(np.int32),
        "rewards": np.zeros(prompts * history)}
    live = np.stack([groups[i // SAMPLES][1][history + i % SAMPLES] for i in range(requests)])
    rows = np.zeros((requests, PROMPT_LEN + length), dtype=np.int32)
    for i in range(requests):
        rows[i, :PROMPT_LEN] = groups[i // SAMPLES][0]
        rows[i, PROMPT_LEN:] = live[i]
    return HistoryBundle(arrays), groups, rows, PROMPT_LEN + pos


def accept(rows: np.ndarray, num: np.ndarray, drafts: list[list[int]]) -> list[np.ndarray]:
    """Each row's tokens sampled by a step that verified `drafts`: the longest prefix of its draft
    equal to the row's next tokens, then one more token (`num` advances past them)."""
    sampled = []
    for i, draft in enumerate(drafts):
        n = int(num[i])
        ahead = rows[i, n:n + len(draft)].tolist()
        took = next((j for j, (a, b) in enumerate(zip(draft, ahead)) if a != b), len(ahead))
        sampled.append(rows[i, n:n + took + 1].copy())
        num[i] = n + took + 1
    return sampled


@dataclass(frozen=True)
class Forward:
    """The engine's forward pass between two drafting steps: `seconds` long (a GPU decode step at
    256 x 8K is 8-30 ms), the drafting thread spinning (`busy`) or sleeping.

    busy is what the thread does in a GPU engine: vLLM's worker waits for the step's sampled tokens
    in a CUDA copy, and CUDA spins while it waits when a process holds one context per device
    (`cudaDeviceScheduleAuto`), so the core keeps its caches. Idle lets the core sleep: a core idle
    for 10 ms can come back with cold caches, and the drafting step after it then costs more
    (docs/benchmarks.md). The spin releases the GIL, so the
    drafter's helper thread runs beside it as it would beside a GPU step."""

    seconds: float = 0.010
    busy: bool = True

    def wait(self) -> None:
        if not self.busy:
            time.sleep(self.seconds)
            return
        end = time.perf_counter() + self.seconds
        while (left := end - time.perf_counter()) > 0:  # ~1 ms a call: the GIL is taken back rarely
            _spin(max(1, int(min(left, 0.001) * _spin_rate())))


@functools.cache
def _spin_rate() -> float:
    """`_spin`'s iterations per second on this machine."""
    _spin(1)
    t0 = time.perf_counter()
    _spin(1_000_000)
    return 1_000_000 / max(time.perf_counter() - t0, 1e-6)


@njit(nogil=True, cache=True)
def _spin(n: int) -> int:
    """Integer work without memory traffic, the GIL released."""
    x = 1
    for _ in range(n):
        x = x * 6364136223846793005 + 1442695040888963407
    return x
