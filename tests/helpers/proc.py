"""Process helpers shared by the tests that kill real actor processes."""

from __future__ import annotations

import os
import signal
import time


def kill_and_wait(pid: int) -> None:
    """SIGKILL `pid` and wait until it is gone."""
    os.kill(pid, signal.SIGKILL)
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
