"""Named wall-clock laps: how a step's time splits into its parts, written once.

    watch = Stopwatch()
    with watch("plan_s"):
        plan = ...
    watch.seconds  # {"plan_s": 0.12}

`on_lap(listener)` lets a profiler see every lap's start and end in this process (the end-to-end
benchmark charges each process's CPU seconds to the step's parts this way) without the code that
times the parts knowing about it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

LapListener = Callable[[str, bool], None]  # (part name, True at its start / False at its end)
_listeners: list[LapListener] = []


def on_lap(listener: LapListener) -> Callable[[], None]:
    """Call `listener(name, started)` at the start and the end of every Stopwatch part in this
    process, until the returned function is called. A listener must be quick and must not raise."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener)


class Stopwatch:
    """Seconds per named part (`with watch("name"): ...`; a part timed twice adds up) and the
    total since the watch was made."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        for listener in _listeners:
            listener(name, True)
        t = time.perf_counter()
        try:
            yield
        finally:  # a part that raised still counts, so a failed step's record says where time went
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t
            for listener in _listeners:
                listener(name, False)

    def total(self) -> float:
        """Seconds since the watch was made."""
        return time.perf_counter() - self.start
