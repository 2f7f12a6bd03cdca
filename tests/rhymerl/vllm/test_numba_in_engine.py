"""HistoSpec's compiled drafting (numba) can live in a vLLM engine process: vLLM's kernel registry
scans every loaded module, and llvmlite's library handle used to crash that scan."""

from __future__ import annotations

import pytest


def test_vllm_kernel_scan_survives_the_numba_kernels():
    # Rule: after importing the numba kernels, the registry's scan over sys.modules (the pass
    # register_kernels makes at engine start-up and when the exact verifier is installed) runs.
    dispatcher = pytest.importorskip("vllm.triton_utils.dispatcher")
    import rhymerl.histospec.kernel  # noqa: F401  (loads numba and llvmlite)

    dispatcher._rebind_kernels([])
