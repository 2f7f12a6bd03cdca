"""HistoSpec's compiled drafting (numba) can live in a vLLM engine process: vLLM's kernel registry
scans every loaded module, and llvmlite's library handle used to crash that scan."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from helpers.marks import needs_vllm

# An engine worker's modules, not this test session's (which holds Flask proxies and other objects
# that no engine process imports and that a scan of sys.modules trips over for unrelated reasons).
SCAN = ("import vllm.triton_utils.dispatcher as d; import rhymerl.histospec.engine.kernel; "
        "from rhymerl.vllm.histospec_proposer import tolerate_kernel_scans; tolerate_kernel_scans(); "
        "d._rebind_kernels([]); print('scanned')")


@needs_vllm
def test_vllm_kernel_scan_survives_the_numba_kernels():
    # Rule: after importing the numba kernels, the registry's scan over sys.modules (the pass
    # register_kernels makes at engine start-up and when the exact verifier is installed) runs.
    done = subprocess.run([sys.executable, "-c", SCAN], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "scanned" in done.stdout, done.stderr[-2000:]


@needs_vllm
def test_the_exact_verifier_installs_beside_modules_the_scan_trips_over(monkeypatch):
    # Rule: a loaded module holding an attribute the registry's scan raises on (here an unbound
    # werkzeug proxy, as Flask holds once MLflow is imported) does not stop the install; the module
    # is back in sys.modules afterwards.
    from contextvars import ContextVar

    from werkzeug.local import LocalProxy

    from rhymerl.vllm.worker_ext import install_exact_verifier

    module = types.ModuleType("rhymerl_test_unbound_proxy")
    module.proxy = LocalProxy(ContextVar("rhymerl_test_unbound"), unbound_message="unbound")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(RuntimeError, match="unbound"):
        hasattr(module.proxy, "__dict__")  # the scan's own first call on it
    install_exact_verifier()
    assert sys.modules[module.__name__] is module
