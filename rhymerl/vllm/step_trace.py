"""Per-step timing of vLLM's engine core, for `bench/step_table.py` (a measuring aid, not a product path).

Put `bench/step_trace` first on PYTHONPATH and name a tag in RHYMERL_TRACE_STEPS: every Python process
then runs that folder's `sitecustomize.py` at start-up, which calls `install()`, and the process that
loads vLLM's engine core (vLLM spawns it) writes one line per engine step to
`$RHYMERL_TRACE_DIR/<tag>-<pid>.txt` (default /tmp/rhymerl-steps):

    start_s  step_s  post_step_s  running_requests  scheduled_tokens  emitted_tokens

`step_s` is `EngineCore.step` (schedule, the model's forward and sampling in the worker, the output's
update); `post_step_s` is `EngineCore.post_step` (with speculation: the extra call that fetches the
drafts from the worker, unless they came with the sampled tokens); `emitted_tokens` the tokens the
step added to the responses (scheduled tokens count the drafts verified, emitted ones those
accepted). Example, the long task in one engine per arm:

    RHYMERL_TRACE_STEPS=run1 PYTHONPATH=bench/step_trace rhymerl bench spec --dataset builtin-long \\
        --prompts 32 --max-tokens 2048 --arms plain,siblings
    rhymerl bench steps run1

Without RHYMERL_TRACE_STEPS `install()` does nothing. It patches two methods of vLLM 0.32's EngineCore
once the module is imported (an import hook, since the engine process imports it while unpickling).
"""

from __future__ import annotations

import builtins
import os
import sys
import time

MODULE = "vllm.v1.engine.core"


def _patch(core, tag: str) -> None:
    """Wrap `core.EngineCore.step`, `.post_step` and the scheduler's `schedule` to write one line per step."""
    from vllm.v1.core.sched import scheduler as sched_mod

    out_dir = os.environ.get("RHYMERL_TRACE_DIR", "/tmp/rhymerl-steps")
    os.makedirs(out_dir, exist_ok=True)
    out = open(os.path.join(out_dir, f"{tag}-{os.getpid()}.txt"), "w", buffering=1 << 16)
    step, post, schedule = core.EngineCore.step, core.EngineCore.post_step, sched_mod.Scheduler.schedule

    def traced_schedule(self, *args, **kwargs):
        result = schedule(self, *args, **kwargs)
        self._rhymerl_tokens = result.total_num_scheduled_tokens
        return result

    def traced_step(self):
        t0 = time.perf_counter()
        result = step(self)
        emitted = sum(len(o.new_token_ids) for outs in (result[0] or {}).values() for o in outs.outputs)
        self._rhymerl_step = (t0, time.perf_counter() - t0, emitted)
        return result

    def traced_post(self, model_executed):
        t0 = time.perf_counter()
        post(self, model_executed)
        spent = time.perf_counter() - t0
        start, seconds, emitted = getattr(self, "_rhymerl_step", (t0, 0.0, 0))
        running = len(self.scheduler.running)
        out.write(f"{start:.6f} {seconds:.6f} {spent:.6f} {running} {getattr(self.scheduler, '_rhymerl_tokens', -1)} "
                  f"{emitted}\n")
        if running == 0:  # the engine went idle: a generate call ended, make its lines readable
            out.flush()

    sched_mod.Scheduler.schedule = traced_schedule
    core.EngineCore.step, core.EngineCore.post_step = traced_step, traced_post


def install() -> None:
    """Patch the engine core when this process imports it (the tag: RHYMERL_TRACE_STEPS; no tag, no-op)."""
    tag = os.environ.get("RHYMERL_TRACE_STEPS", "")
    if not tag:
        return
    _import = builtins.__import__

    def _hook(name, *args, **kwargs):
        module = _import(name, *args, **kwargs)
        core = sys.modules.get(MODULE)
        if core is not None and hasattr(core, "EngineCore") and not getattr(core, "_rhymerl_traced", False):
            core._rhymerl_traced = True
            builtins.__import__ = _import  # patched once; stop hooking
            _patch(core, tag)
        return module

    builtins.__import__ = _hook
