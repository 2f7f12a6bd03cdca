"""A vLLM general plugin: a step's draft tokens travel back with its sampled tokens.

With speculation on and async scheduling off (vLLM's CPU backend; GPU engines where a method
cannot schedule asynchronously), vLLM's engine core asks the worker for the step's draft tokens in
a call of its own after every step (`EngineCore.post_step` -> `take_draft_token_ids`): one more
round trip through the worker's shared-memory queue per decode step, drafts or none. On a 2-core
machine that round trip (two processes waking and spinning) made an engine that drafted almost
nothing a fifth slower than plain sampling, the price of speculation paid on every step before any
draft token pays it back.

The drafts are ready when the worker's `sample_tokens` returns (the drafter ran inside it), so:
- in the worker, the model runner's `sample_tokens` attaches `take_draft_token_ids()` to the
  output it returns (`DRAFTS_ATTR`; the output is pickled whole onto the queue);
- in the engine core, the executor keeps what came attached, and its `take_draft_token_ids`
  hands that over instead of calling the worker.
Each side alone changes nothing: an output without drafts attached (async outputs, vLLM's shared
empty output, an aggregated one) leaves the executor's call to the worker in place, and a worker
still answers that call. The drafts are the same tokens either way: the sampled distribution is
untouched.

Registered under `vllm.general_plugins` in pyproject.toml (vLLM loads it in every process it
starts); leaves vLLM alone where its classes are not the ones this was written for (0.32), or with
`RHYMERL_DRAFT_DELIVERY=0` in the environment (vLLM's own round trip, for a side-by-side timing).
"""

from __future__ import annotations

import os
from typing import Any

SWITCH_ENV = "RHYMERL_DRAFT_DELIVERY"  # "0": leave vLLM's round trip in place
DRAFTS_ATTR = "rhymerl_draft_token_ids"  # on a ModelRunnerOutput: the step's DraftTokenIds (or None)
_STASH_ATTR = "_rhymerl_drafts"  # on the engine core's executor: what the last step brought back
_PATCHED = "_rhymerl_delivers_drafts"
_NOTHING = object()  # no drafts came back with the step: ask the worker


def deliver_drafts_with_samples() -> bool:
    """Patch the model runner (worker side) and the multiprocess executor (engine core side);
    True if both were patched (or already were)."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return False
    try:
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:  # a vLLM without these: nothing to change
        return False
    needed = (GPUModelRunner, ("sample_tokens", "take_draft_token_ids")), \
        (MultiprocExecutor, ("execute_model", "sample_tokens", "take_draft_token_ids"))
    if not all(callable(getattr(cls, name, None)) for cls, names in needed for name in names):
        return False
    if not getattr(GPUModelRunner, _PATCHED, False):
        _patch_runner(GPUModelRunner, ModelRunnerOutput, EMPTY_MODEL_RUNNER_OUTPUT)
    if not getattr(MultiprocExecutor, _PATCHED, False):
        _patch_executor(MultiprocExecutor, ModelRunnerOutput)
    return True


def _patch_runner(runner_cls: type, output_cls: type, empty: object) -> None:
    """The runner's `sample_tokens` returns its step's drafts with the sampled tokens."""
    sample_tokens = runner_cls.sample_tokens

    def sample_tokens_with_drafts(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = sample_tokens(self, *args, **kwargs)
        # Only a plain output of this step (vLLM shares one empty output between steps: never
        # written to), and only where the engine core would ask for drafts after the step.
        if type(out) is output_cls and out is not empty and getattr(self, "speculative_config", None) \
                and not getattr(self, "use_async_scheduling", False):
            setattr(out, DRAFTS_ATTR, self.take_draft_token_ids())
        return out

    runner_cls.sample_tokens = sample_tokens_with_drafts
    setattr(runner_cls, _PATCHED, True)


def _patch_executor(executor_cls: type, output_cls: type) -> None:
    """The executor's `take_draft_token_ids` hands over the drafts its last `sample_tokens` brought
    back; a step whose output came without them (or from `execute_model`) asks the worker."""
    execute_model, sample_tokens, take = (executor_cls.execute_model, executor_cls.sample_tokens,
                                          executor_cls.take_draft_token_ids)

    def execute_model_forgetting(self: Any, *args: Any, **kwargs: Any) -> Any:
        setattr(self, _STASH_ATTR, _NOTHING)  # a new step: the last one's drafts are spent
        return execute_model(self, *args, **kwargs)

    def sample_tokens_keeping(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = sample_tokens(self, *args, **kwargs)  # a Future when non-blocking: nothing kept
        setattr(self, _STASH_ATTR, getattr(out, DRAFTS_ATTR, _NOTHING) if isinstance(out, output_cls) else _NOTHING)
        return out

    def take_kept(self: Any) -> Any:
        kept = getattr(self, _STASH_ATTR, _NOTHING)
        setattr(self, _STASH_ATTR, _NOTHING)
        return take(self) if kept is _NOTHING else kept

    executor_cls.execute_model = execute_model_forgetting
    executor_cls.sample_tokens = sample_tokens_keeping
    executor_cls.take_draft_token_ids = take_kept
    setattr(executor_cls, _PATCHED, True)


__all__ = ["DRAFTS_ATTR", "deliver_drafts_with_samples"]
