"""`infra.stop`: the first SIGTERM or SIGINT raises as Ctrl-C does, later ones are only noted, a block
that must finish holds a first signal until it is done, and a flow body takes SIGTERM back from
Prefect's handler. Real signals, sent to this process."""

from __future__ import annotations

import os
import signal
import time

import pytest

from infra.stop import Stop, Terminated, deferred, reclaim


@pytest.fixture(autouse=True)
def handlers_back():
    """pytest's own SIGTERM and SIGINT handlers after each test (a stopped Stop keeps its own)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def _deliver(sig: int) -> None:
    """Send `sig` to this process and give the main thread the moments it needs to run the handler
    (another thread may take the signal; the handler still runs in the main thread)."""
    os.kill(os.getpid(), sig)
    for _ in range(50):
        time.sleep(0.01)


def _notes(read_fd: int) -> list[str]:
    os.set_blocking(read_fd, False)
    try:
        return os.read(read_fd, 65536).decode().splitlines()
    except BlockingIOError:
        return []


def test_the_first_sigterm_raises_later_signals_are_noted():
    # Rule: SIGTERM takes Ctrl-C's way out once (exit 143); signals during the unwinding only add a line.
    read_fd, write_fd = os.pipe()
    stop = Stop(note_fd=write_fd)
    with stop.installed():
        assert signal.getsignal(signal.SIGTERM) == stop.handle  # never SIG_DFL here: it would end pytest
        with pytest.raises(Terminated) as raised:
            _deliver(signal.SIGTERM)
        assert isinstance(raised.value, KeyboardInterrupt)  # the same unwinding as Ctrl-C
        _deliver(signal.SIGTERM)  # no second exception: the unwinding goes on
    _deliver(signal.SIGINT)  # after the block too: the process is on its way out
    assert signal.getsignal(signal.SIGINT) == stop.handle
    assert (stop.signum, stop.later, stop.name, stop.exit_code) == (signal.SIGTERM, 2, "SIGTERM", 143)
    notes = _notes(read_fd)
    assert notes[0].startswith("SIGTERM: stopping the run") and len(notes) == 3
    assert notes[1].startswith("SIGTERM again: already stopping") and notes[2].startswith("SIGINT again")
    os.close(read_fd)
    os.close(write_fd)


def test_ctrl_c_raises_a_plain_keyboard_interrupt_and_exits_130():
    stop = Stop()
    with stop.installed():
        with pytest.raises(KeyboardInterrupt) as raised:
            _deliver(signal.SIGINT)
    assert not isinstance(raised.value, Terminated)
    assert (stop.name, stop.exit_code) == ("SIGINT", 130)
    assert Stop().exit_code == 130  # a Ctrl-C that came before any handler recorded it


def test_without_a_signal_the_previous_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with Stop().installed():
        pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_deferred_holds_a_first_signal_until_its_block_is_done():
    # Rule: cleanup that must finish (stopping the actors) runs to its end; the stop is raised after it.
    stop, done = Stop(), []
    with stop.installed():
        with pytest.raises(Terminated):
            with deferred():
                _deliver(signal.SIGTERM)
                done.append("cleanup finished")
        assert done == ["cleanup finished"] and stop.raised
    with deferred():  # no Stop installed: the block just runs
        done.append("again")
    assert done[-1] == "again"


def test_reclaim_takes_sigterm_back_from_another_handler():
    # Prefect's flow engine installs its own SIGTERM handler around every flow; a flow body takes it back.
    def foreign(signum, frame):  # stands in for Prefect's bridge
        raise AssertionError("not reached")

    stop = Stop()
    with stop.installed():
        signal.signal(signal.SIGTERM, foreign)
        reclaim()
        assert signal.getsignal(signal.SIGTERM) == stop.handle
    before = signal.signal(signal.SIGTERM, foreign)
    try:
        reclaim()  # no Stop installed (a flow a Prefect worker runs): Prefect's handler stays
        assert signal.getsignal(signal.SIGTERM) is foreign
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_run_keeps_sigterm_when_it_starts_ray(monkeypatch):
    # `ray.init` installs its own SIGTERM handler (sys.exit(15): the run would die with exit 15, its
    # actors and the Prefect API left to atexit). Rule: `init_ray` hands SIGTERM back to the run's Stop.
    import sys

    import ray

    from tasks.setup import init_ray

    def ray_init(**kwargs):  # what ray.init does to the driver's SIGTERM, and nothing else
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", ray_init)
    stop = Stop()
    with stop.installed():
        assert init_ray(1) is True
        assert signal.getsignal(signal.SIGTERM) == stop.handle


_STOPPED_CHILD = """
import sys, time
from infra.stop import Stop, exit_now
import numpy, pyarrow  # modules to tear down: Python's shutdown takes a while, as a run's does
stop = Stop(note_fd=2)
try:
    with stop.installed():
        print("ready", flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    pass
{leave}(stop.exit_code)
"""


def _barraged(leave: str) -> tuple[int, str]:
    """A child process that installs a Stop and, once stopped, exits through `leave`, sent SIGTERM
    every half millisecond from its first one until it is gone; its exit status and notes."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", _STOPPED_CHILD.format(leave=leave)], cwd=root,
                             env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n", child.stderr.read()
    while child.poll() is None:
        try:
            os.kill(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            break
        time.sleep(0.0005)
    return child.wait(), child.stderr.read()


def test_a_stopped_process_exits_143_however_many_signals_follow():
    # Python's shutdown restores the default action of the signals it handled before the process is
    # gone; a SIGTERM landing then killed a stopped run (a parent saw -15, not 143, and no note).
    # Rule: `exit_now` leaves no such stretch. Sensitivity: with `sys.exit` in its place every one of
    # 8 tries here died of the signal; one death in the 3 tries below fails the test.
    for _ in range(3):
        code, notes = _barraged("exit_now")
        assert code == 143, notes[-2000:]
        first, *later = notes.splitlines()
        assert first.startswith("SIGTERM: stopping the run")
        assert all(line.startswith("SIGTERM again: already stopping") for line in later), later


_RAY_CHILD = """
import signal
from infra.stop import Stop
import ray
from tasks.setup import init_ray, {shutdown}

def caught() -> bool:  # the kernel's view: Python's record of the handler cannot see C++ resetting it
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("SigCgt:"))
    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)

seen = []
disconnect = ray._private.state.state.disconnect
def disconnect_noting():  # what ray.shutdown calls next after the driver's core worker shut down
    seen.append(caught())
    disconnect()
ray._private.state.state.disconnect = disconnect_noting
stop = Stop()
with stop.installed():
    init_ray(0)
    seen.append(caught())
    {shutdown}()
    seen.append(caught() and signal.getsignal(signal.SIGTERM) == stop.handle)
print(seen)
"""


@pytest.mark.slow
def test_sigterm_stays_the_runs_while_ray_stops_its_processes():
    # Ray's driver shutdown resets SIGTERM to the default action from C++ (unseen by Python), then
    # takes a second or more to stop Ray's processes: a second SIGTERM then killed the stopping run
    # (no exit 143, no resume line). Rule: `shutdown_ray` has the run's handler back from the moment
    # the driver shut down. (ray.shutdown in its place: [True, False, False].)
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", _RAY_CHILD.format(shutdown="shutdown_ray")], cwd=root,
                          env={**env, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "[True, True, True]", done.stdout[-2000:]
