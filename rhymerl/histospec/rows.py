"""Which prompt and which request an engine's token row is (the proposer sees no request ids).

`PromptTable` finds the known prompt a row starts with; `request_keys` gives each row its
request's state key (its length and last `KEY_TAIL` tokens), for all rows in one gather. See
`rhymerl.vllm.histospec_proposer` for how the drafter uses them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

KEY_TAIL = 16  # tokens of a request's tail in its state key (with its length)


class PromptTable:
    """Which known prompt a token row starts with (longest known prompt first)."""

    def __init__(self, prompts: Sequence[Sequence[int]], dtype: Any = np.int32) -> None:
        self.dtype = np.dtype(dtype)
        self.by_len: dict[int, dict[bytes, int]] = {}
        for k, p in enumerate(prompts):
            self.by_len.setdefault(len(p), {})[np.asarray(p, dtype=self.dtype).tobytes()] = k
        self.lengths = sorted(self.by_len, reverse=True)

    def lookup(self, row: np.ndarray, n: int) -> int | None:
        """Index of the prompt that `row[:n]` starts with, if any; needs n > prompt length."""
        if row.dtype != self.dtype:
            row = row.astype(self.dtype)
        for length in self.lengths:
            if length < n:
                k = self.by_len[length].get(row[:length].tobytes())
                if k is not None:
                    return k
        return None


def request_keys(tokens: np.ndarray, rows: Sequence[int], ends: np.ndarray) -> list[tuple[int, bytes]]:
    """State keys of requests in `rows` holding `ends` tokens: (n, the bytes of its last KEY_TAIL
    tokens; positions before 0 read token 0), for all rows in one gather."""
    if not len(rows):
        return []
    cols = np.maximum(ends[:, None] - KEY_TAIL + np.arange(KEY_TAIL), 0)
    tails = np.ascontiguousarray(tokens[np.asarray(rows)[:, None], cols])
    blobs = tails.view(np.dtype((np.void, tails.dtype.itemsize * KEY_TAIL))).ravel().tolist()
    return list(zip(ends.tolist(), blobs))
