"""Start-up hook for per-step engine timing: `rhymerl.vllm.step_trace` (how to use it: its docstring).

Python imports `sitecustomize` at every start-up; with this folder first on PYTHONPATH and
RHYMERL_TRACE_STEPS set, each process (vLLM's spawned engine core among them) installs the tracer.
"""

import os

if os.environ.get("RHYMERL_TRACE_STEPS"):
    from rhymerl.vllm.step_trace import install

    install()
