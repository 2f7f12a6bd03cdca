"""The process environment every RhymeRL entry point sets before Prefect, Ray or vLLM import.

`rhymerl run`, `rhymerl bench NAME` and each benchmark's child runs call `project_env()` first, so
state lands in the project and not in the user's home. It imports nothing from the project, so the
command line (cli/) and the benchmarks (bench/) can both call it without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_env() -> None:
    """Keep Prefect's and vLLM's state inside the project (under the working directory) unless the
    user chose otherwise: each variable is set only where it is unset.

    Prefect's home, vLLM's and TorchInductor's caches go under the working directory; Ray runs
    without its token authentication (a local cluster); the tokenizers' thread pool stays off (the
    processes fork); Prefect sends no analytics (no network is assumed).
    """
    cwd = Path.cwd()
    os.environ.setdefault("PREFECT_HOME", str(cwd / ".prefect"))
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cwd / ".cache" / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cwd / ".cache" / "inductor"))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Prefect's temporary local API can take longer than its 20 s default to start on a loaded machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
