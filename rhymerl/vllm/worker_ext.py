"""vLLM worker extension: methods RhymeRL calls inside the engine's worker process.

vLLM mixes this class into its GPU/CPU worker when the engine is built with
`worker_extension_cls="rhymerl.vllm.worker_ext.WeightSyncExtension"`; the methods are invoked with
`LLM.collective_rpc(name, args=...)`. Weight updates go through `model_runner.reload_weights`,
which handles vLLM's packed/fused parameter layouts (a direct `model.load_weights` fails on CPU).
With speculation on, `rhymerl_install_exact_verifier` swaps RhymeRL's exact rejection-sampler
kernels in (why: `rhymerl.vllm.spec_verify`) and `rhymerl_spec_self_check` runs `rhymerl.vllm.spec_guard`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from typing import Iterable

import torch
from safetensors.torch import load as load_safetensors

from rhymerl.policy.weight_group import GroupAddress, open_group
from rhymerl.vllm.draft_gate import install_gate, take_gate_stats
from rhymerl.vllm.spec_guard import GuardReport, self_check, vllm_version
from rhymerl.vllm.spec_verify import KERNELS, skip_empty_verification

# Parameters that hold the same values in the engine as in the Hugging Face model. vLLM fuses
# q/k/v and gate/up, and on CPU repacks every linear layer's weight into its own kernel layout
# (leaving the parameter empty); norms keep their layout, and the embedding is only padded with
# zero rows, which leaves its sum unchanged.
_COMPARABLE_SUFFIXES = ("norm.weight", "embed_tokens.weight")


def weights_fingerprint(named_params: Iterable[tuple[str, torch.Tensor]]) -> float:
    """Float64 sum of the parameters that engine and trainer store identically.

    It changes whenever a training step changes those weights, and is equal (up to summation
    order) in an engine and a trainer that hold the same policy.
    """
    return float(sum(p.detach().double().sum().item() for name, p in named_params
                     if name.endswith(_COMPARABLE_SUFFIXES)))


def forget_requests(cache, keep: set) -> int:
    """Remove from an Arctic Inference `SuffixDecodingCache` every request not in `keep`: its prompt
    (still active until the drafter's next step notices it finished) and its cached response, which
    would otherwise draft later requests. Returns how many requests were dropped."""
    gone = 0
    for req_id in [r for r in cache.active_requests if r not in keep]:
        cache.stop_request(req_id)
        gone += 1
    for req_id in [r for r in cache.cached_requests if r not in keep]:
        cache.evict_cached_response(req_id)
        gone += 1
    return gone


def install_exact_verifier() -> None:
    """Register `rhymerl.vllm.spec_verify.KERNELS` through vLLM's kernel-override registry (this process).

    The registry is the plug-in point vLLM's platforms use for these very kernels; registering
    again replaces the CPU platform's versions (vLLM logs "already registered. Overwriting.").
    Each kernel's argument names are checked first, so a vLLM that changed a kernel's contract
    fails here, by name, instead of sampling wrongly.
    """
    from vllm.triton_utils.dispatcher import register_kernels

    for name, impl in KERNELS.items():
        module, attr = name.rsplit(".", 1)
        kernel = getattr(importlib.import_module(module), attr)
        have = getattr(kernel, "arg_names", None)
        if have is None:  # a plain function (no Triton): read its signature
            have = tuple(inspect.signature(getattr(kernel, "func", kernel)).parameters)
        want = tuple(inspect.signature(impl).parameters)
        if tuple(have) != want:
            raise RuntimeError(f"vLLM {vllm_version()} changed {name}'s arguments to {tuple(have)}; "
                               f"rhymerl.vllm.spec_verify implements {want}: update it before speculating")
    # vLLM 0.32's registration scans every attribute of every loaded module: `hasattr(x, "__dict__")`,
    # then `vars(x).get(...)`. Some attributes break that scan: llvmlite's ctypes wrappers (loaded by
    # numba) answer `vars` with a non-dict, and an unbound Flask/werkzeug proxy (loaded with MLflow)
    # raises on `hasattr`. No such module holds a sampler kernel, so they are hidden from the scan for
    # its duration (found by making the scan's own calls, guarded).
    hidden = {name: sys.modules.pop(name) for name in _unscannable_modules()}
    try:
        register_kernels(KERNELS)
    finally:
        sys.modules.update(hidden)


def _unscannable_modules() -> list[str]:
    """Names of loaded modules with an attribute on which vLLM's kernel scan would raise."""
    found = []
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        for value in list(namespace.values()) if namespace else ():
            try:
                if hasattr(value, "__dict__"):
                    vars(value).get("kernel")
            except Exception:  # noqa: BLE001 - whatever the attribute raises, the scan would too
                found.append(name)
                break
    return found


class WeightSyncExtension:
    """Mixed into vLLM's worker; `self.model_runner` is the worker's model runner."""

    def rhymerl_stage_weights(self, blob: bytes) -> int:
        """Keep one bucket of HF-named weights until `rhymerl_commit_weights`; returns how many
        tensors are staged now. The model is not touched yet.

        Weights travel as safetensors bytes because vLLM's RPC serializer turns raw tensors
        nested in argument lists into Python lists.
        """
        staged = self.__dict__.setdefault("_rhymerl_staged", {})
        staged.update(load_safetensors(blob))
        return len(staged)

    def rhymerl_commit_weights(self) -> int:
        """Load every staged tensor in place in one reload (vLLM's reload processes the weights
        as a whole: packed and fused parameters need all their parts); returns how many."""
        staged = self.__dict__.pop("_rhymerl_staged", {})
        if staged:
            self.model_runner.reload_weights(weights_iterator=iter(staged.items()))
        return len(staged)

    def rhymerl_receive_weights(self, host: str, port: int, world_size: int, backend: str,
                                first_rank: int) -> int:
        """Join the weight group at host:port as rank `first_rank` + this worker's rank in its
        engine, and load the weights rank 0 broadcasts in place as they arrive; returns how many
        tensors came (`rhymerl.policy.weight_group`: the process-group sync).

        The received tensors feed vLLM's layerwise reload as one iterator: each layer is
        processed and copied into its kernel tensors once all its parts have arrived, so no full
        copy of the weights is staged. Arguments are plain values: vLLM's RPC serializer."""
        address = GroupAddress(host, port, world_size, backend)
        group = open_group(address, first_rank + getattr(self, "rank", 0))
        count = 0

        def received():
            nonlocal count
            for named in group.receive():
                count += 1
                yield named

        stream = received()
        try:
            self.model_runner.reload_weights(weights_iterator=stream)
            for _ in stream:  # a loader that stopped early must not leave the sender waiting
                pass
        finally:
            group.close()
        return count

    def rhymerl_weights_fingerprint(self) -> float:
        """`weights_fingerprint` of the engine's model (comparable with the trainer's)."""
        return weights_fingerprint(self.model_runner.model.named_parameters())

    def rhymerl_install_exact_verifier(self) -> int:
        """Install RhymeRL's exact verifier in this worker; returns how many kernels were replaced.
        Steps without drafts then skip the rejection sampler (`skip_empty_verification`)."""
        install_exact_verifier()
        sampler = getattr(self.model_runner, "rejection_sampler", None)
        if sampler is not None:
            skip_empty_verification(sampler)
        return len(KERNELS)

    def rhymerl_spec_self_check(self, rows: int, alpha: float) -> dict:
        """Run the lossless self-check on this worker's rejection sampler; a `GuardReport` as a dict."""
        sampler = getattr(self.model_runner, "rejection_sampler", None)
        if sampler is None:
            error = "the model runner has no rejection sampler (speculation is off)"
            return GuardReport(passed=False, vllm_version=vllm_version(), error=error).to_dict()
        return self_check(sampler, rows, alpha, device=self.model_runner.device).to_dict()

    def rhymerl_suffix_requests(self) -> list | None:
        """The request ids vLLM's suffix drafter holds (active or cached); None for any other drafter."""
        cache = getattr(getattr(self.model_runner, "drafter", None), "suffix_cache", None)
        return None if cache is None else [*cache.active_requests, *cache.cached_requests]

    def rhymerl_suffix_forget(self, keep: list) -> int:
        """Drop every request but `keep` from vLLM's suffix drafter (see `forget_requests`)."""
        cache = getattr(getattr(self.model_runner, "drafter", None), "suffix_cache", None)
        return 0 if cache is None else forget_requests(cache, set(keep))

    def rhymerl_install_goodput(self, cost_memory: int, by_rows: bool = True, switch: bool = True) -> bool:
        """Put the goodput controller behind this worker's stock drafter (`draft_gate.install_gate`)."""
        return install_gate(self.model_runner, cost_memory, by_rows, switch)

    def rhymerl_goodput_stats(self) -> dict | None:
        """The stock drafter's goodput counters since the last call; None without the controller."""
        return take_gate_stats(self.model_runner)

    def rhymerl_spec_stats(self) -> dict | None:
        """HistoSpec's acceptance counters since the last call, as a dict of `SpecStats` fields;
        None when the worker's drafter is not HistoSpec's (off, or vLLM's n-gram)."""
        take = getattr(getattr(self.model_runner, "drafter", None), "take_stats", None)
        return dataclasses.asdict(take()) if take is not None else None
