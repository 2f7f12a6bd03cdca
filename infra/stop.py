"""How `rhymerl run` stops on a signal: SIGTERM and SIGINT both take Ctrl-C's way out, once.

Kubernetes, Slurm, Prefect workers and process managers stop a job with SIGTERM; a terminal sends
SIGINT. While a `Stop` is installed, the first of either raises in the main thread wherever it is
(`KeyboardInterrupt`; for SIGTERM `Terminated`, its subclass), so every `finally` and context
manager of the run unwinds as for Ctrl-C: the run flow stops its actors and a Ray it started, and
the temporary Prefect API stops at exit. A later signal, up to the process's exit, only adds a line
on the console: the unwinding goes on, so a second SIGTERM cannot cut the stopping of the run's
processes short.
(SIGKILL can; what the run started dies with it all the same: Ray's processes and the temporary
Prefect API are bound to the run's process.)

What else in a run would get in the way:
- Prefect's flow engine installs its own SIGTERM handler around every flow and subflow, and puts
  back the one it found when the flow ends. Prefect's raises `TerminationSignal`, which is not a
  `KeyboardInterrupt`; a Ray call the main thread waits in (`ray.get`) does not pass such an
  exception on: the call goes on until its result is there and then fails with a `SystemError`.
  A flow body calls `reclaim()` first: the run's handler again.
- `ray.init` installs a SIGTERM handler of its own (`sys.exit(15)`, which would skip the cleanup
  and the exit code); `tasks.setup.init_ray` calls `reclaim()` after it. Ray's driver shutdown
  resets SIGTERM to the default action from C++ (its logging's failure handlers), then takes a
  second or more to stop Ray's processes; `tasks.setup.shutdown_ray` reclaims it at once.
- Ray turns any `KeyboardInterrupt` raised while the main thread waits in `ray.get` into a plain
  `KeyboardInterrupt`. Which signal stopped the run is therefore `Stop.signum`, never the type of
  the exception that arrives at the top.

`deferred()` holds a first signal until a block that must finish (stopping the actors) is done.

Python's own shutdown puts back the default action of every signal it had a handler for before the
process is gone, so a signal in that last stretch kills the process (a parent sees -15, not 143, and
the note is lost). A process stopped by a signal therefore ends with `exit_now`.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, NoReturn

# 128 + the signal's number: the exit status shells and process managers expect of a process
# that stopped on that signal.
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
STOP_SIGNALS = tuple(EXIT_CODES)

_active: "Stop | None" = None  # the installed Stop: what reclaim() and deferred() act on


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C's KeyboardInterrupt is, so one path unwinds both."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@dataclass
class Stop:
    """A process's stop on SIGTERM/SIGINT: the first signal (None before one came), how many came
    after it, and where those are noted (a file descriptor: writing to one is safe in a handler)."""

    note_fd: int | None = None
    on_first: Callable[[], None] | None = None  # told of the first signal (the console: quieter)
    signum: int | None = None
    later: int = 0
    raised: bool = False  # the first signal's exception was raised (not still held by deferred())
    holding: int = 0  # deferred() blocks the main thread is in

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "SIGINT"

    @property
    def exit_code(self) -> int:
        """The exit status for the signal that stopped the run (130 when none was recorded:
        a Ctrl-C before the handler was installed)."""
        return EXIT_CODES.get(self.signum, EXIT_CODES[signal.SIGINT])

    def handle(self, signum: int, frame: object) -> None:
        """The signal handler: the first signal raises (or is held by `deferred()`); later ones
        are noted."""
        if self.signum is None:
            self.signum = signum
            if self.on_first is not None:
                self.on_first()
            self._note(f"{self.name}: stopping the run (its engines, trainer, Ray and Prefect API); "
                       "another signal does not hurry it")
            if not self.holding:
                self.raise_now()
            return
        self.later += 1
        self._note(f"{signal.Signals(signum).name} again: already stopping; waiting for the run's "
                   "processes to stop")

    def raise_now(self) -> None:
        """Raise the first signal's exception (once)."""
        self.raised = True
        if self.signum == signal.SIGTERM:
            raise Terminated()
        raise KeyboardInterrupt()

    def _note(self, line: str) -> None:
        if self.note_fd is not None:
            try:
                os.write(self.note_fd, f"{line}\n".encode())
            except OSError:  # the terminal went away: nothing to tell
                pass

    @contextmanager
    def installed(self) -> Iterator[Stop]:
        """For the block, this Stop handles SIGTERM and SIGINT. After it the previous handlers come
        back, unless a stop signal came: the process is then on its way out (its exit stops the
        temporary Prefect API), and later signals stay notes until it is gone. Off the main thread
        (which alone receives signals) nothing is installed."""
        global _active
        if not _main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self.handle) for sig in STOP_SIGNALS}
        _active = self
        try:
            yield self
        finally:
            _active = None
            if self.signum is None:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)


def reclaim() -> None:
    """The installed Stop handles SIGTERM and SIGINT again, in place of whatever was installed
    since: the flow engine's SIGTERM handler (which it puts back as it found it when the flow ends),
    `ray.init`'s, or the default action that Ray's driver shutdown sets from C++, unseen by
    Python's record of the handler (so it is installed again even where that record names it).
    Nothing when no Stop is installed (a flow run by a Prefect worker, or a test) or off the main
    thread."""
    stop = _active
    if stop is None or not _main_thread():
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop.handle)


@contextmanager
def deferred() -> Iterator[None]:
    """A first stop signal that arrives in the block is held until the block is done and raised
    then, so cleanup that must finish (stopping the run's actors and Ray) does. Without an
    installed Stop, or off the main thread, the block just runs."""
    stop = _active
    if stop is None or not _main_thread():
        yield
        return
    reclaim()
    stop.holding += 1
    try:
        yield
    finally:
        stop.holding -= 1
    if not stop.holding and stop.signum is not None and not stop.raised:
        stop.raise_now()


def exit_now(code: int) -> NoReturn:
    """End the process with exit status `code`, with the installed handlers noting signals to the
    end: what Python's shutdown does before it restores the default signal actions (join the
    non-daemon threads, run the exit handlers: Ray's, the temporary Prefect API's, logging's; flush
    the standard streams), then `os._exit`, so no signal can land where its default action applies."""
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter's own shutdown calls first
    if shutdown is not None and _main_thread():
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to write
            pass
    os._exit(code)


__all__ = ["EXIT_CODES", "STOP_SIGNALS", "Stop", "Terminated", "deferred", "exit_now", "reclaim"]
