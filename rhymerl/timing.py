"""Named wall-clock laps: how a step's time splits into its parts, written once.

    watch = Stopwatch()
    with watch("plan_s"):
        plan = ...
    watch.seconds  # {"plan_s": 0.12}
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


class Stopwatch:
    """Seconds per named part (`with watch("name"): ...`; a part timed twice adds up) and the
    total since the watch was made."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:  # a part that raised still counts, so a failed step's record says where time went
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

    def total(self) -> float:
        """Seconds since the watch was made."""
        return time.perf_counter() - self.start
