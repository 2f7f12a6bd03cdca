"""Which prompt an engine's token row starts with (the proposer sees no request ids).

`PromptTable` finds the known prompt a row starts with (which request a row is:
`rhymerl.histospec.requests`). See `rhymerl.histospec.engine_step` for how the drafter uses it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


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
