"""What the streamed-training tests share: a trainer stand-in that records the feed's calls."""

from __future__ import annotations

import ray


class _Method:
    """`actor.method` as the feed calls it: `.remote(*args)` is recorded and answers `result`."""

    def __init__(self, calls: list, name: str, result=None) -> None:
        self.calls, self.name, self.result = calls, name, result

    def remote(self, *args):
        self.calls.append((self.name, *args))
        return ray.put(self.result)


class FakeTrainer:
    """The `TrainerWorker` stream methods, in this process: `calls` lists them in order;
    `stream_finish` answers {"loss": 0.5}, or None with `incomplete` (a failed add)."""

    def __init__(self, incomplete: bool = False) -> None:
        self.calls: list[tuple] = []
        self.stream_begin = _Method(self.calls, "begin")
        self.stream_add = _Method(self.calls, "add")
        self.stream_abort = _Method(self.calls, "abort")
        self.stream_finish = _Method(self.calls, "finish", None if incomplete else {"loss": 0.5})

    def added(self) -> list[list]:
        """The groups handed over, in order (lists of TrainExamples; the feed hands an ObjectRef)."""
        return [ray.get(c[1]) if isinstance(c[1], ray.ObjectRef) else c[1] for c in self.calls if c[0] == "add"]

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]
