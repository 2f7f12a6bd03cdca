"""A vLLM general plugin: an idle engine worker sleeps instead of spinning a core for a second.

vLLM's engine core sends work to its worker processes through a shared-memory queue whose reader
(`vllm.distributed.device_communicators.shm_broadcast.SpinCondition`) busy-polls with `sched_yield`
for `busy_loop_s` = 1 s after every message before it sleeps on a socket. In an RL step the engines
go idle after every rollout and every weight sync, exactly when reward, training and logging start,
so each worker burns ~1 CPU second then (`scripts/engine-idle-cpu.py`): on a small CPU machine that
slows the training that follows every engine call (the drafter's counters are one more call after
the rollout), and on a GPU node it is a core per engine taken from the trainer's data loading and
the driver.

`quiet_idle_spin` (registered under `vllm.general_plugins` in pyproject.toml, so vLLM loads it in
every process it starts, before the worker's queue exists) shortens the spin to `IDLE_SPIN_S`. While
an engine generates, its worker reads a message every step (milliseconds apart), so it keeps
spinning and no step waits on the socket; only a pause longer than `IDLE_SPIN_S` sends it to sleep,
and the next message wakes it through the socket vLLM already uses for that (~0.1 ms). vLLM has no
setting for this; the plugin changes only the default of that one argument and leaves vLLM alone if
the signature is not the one it was written for.
"""

from __future__ import annotations

import inspect

IDLE_SPIN_S = 0.05  # longer than a decode step (CPU: ~15-40 ms), far shorter than the 1 s vLLM spins


def quiet_idle_spin() -> bool:
    """Make new shared-memory queue readers spin at most IDLE_SPIN_S when idle; True if applied."""
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:  # a vLLM without it: nothing to change
        return False
    init = SpinCondition.__init__
    params = list(inspect.signature(init).parameters)
    if params[-1:] != ["busy_loop_s"] or init.__defaults__ is None or len(init.__defaults__) != 1:
        return False  # not the vLLM this was written for (0.32): leave it as it is
    init.__defaults__ = (IDLE_SPIN_S,)
    return True
