"""vLLM worker extension: methods RhymeRL calls inside the engine's worker process.

vLLM mixes this class into its GPU/CPU worker when the engine is built with
`worker_extension_cls="rhymerl.vllm_ext.WeightSyncExtension"`; the methods are invoked with
`LLM.collective_rpc(name, args=...)`. Weight updates go through `model_runner.reload_weights`,
which handles vLLM's packed/fused parameter layouts (a direct `model.load_weights` fails on CPU).
"""

from __future__ import annotations

import torch


class WeightSyncExtension:
    """Mixed into vLLM's worker; `self.model_runner` is the worker's model runner."""

    def rhymerl_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named weights in place; returns how many tensors were given."""
        self.model_runner.reload_weights(weights_iterator=iter(named_tensors))
        return len(named_tensors)

    def rhymerl_weights_fingerprint(self) -> float:
        """Sum of all parameters in float64: changes whenever any weight changes."""
        model = self.model_runner.model
        return float(sum(p.detach().double().sum().item() for p in model.parameters()))
