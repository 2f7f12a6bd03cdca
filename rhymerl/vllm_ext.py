"""vLLM worker extension: methods RhymeRL calls inside the engine's worker process.

vLLM mixes this class into its GPU/CPU worker when the engine is built with
`worker_extension_cls="rhymerl.vllm_ext.WeightSyncExtension"`; the methods are invoked with
`LLM.collective_rpc(name, args=...)`. Weight updates go through `model_runner.reload_weights`,
which handles vLLM's packed/fused parameter layouts (a direct `model.load_weights` fails on CPU).
"""

from __future__ import annotations

from safetensors.torch import load as load_safetensors


class WeightSyncExtension:
    """Mixed into vLLM's worker; `self.model_runner` is the worker's model runner."""

    def rhymerl_load_weights(self, blob: bytes) -> int:
        """Load HF-named weights (a safetensors blob) in place; returns how many tensors.

        Weights travel as safetensors bytes because vLLM's RPC serializer turns raw tensors
        nested in argument lists into Python lists.
        """
        tensors = load_safetensors(blob)
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()))
        return len(tensors)

    def rhymerl_weights_fingerprint(self) -> float:
        """Sum of all parameters in float64: changes whenever any weight changes."""
        model = self.model_runner.model
        return float(sum(p.detach().double().sum().item() for p in model.parameters()))
