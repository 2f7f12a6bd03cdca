"""infra.environment: the process environment every entry point sets."""

import os

from infra.environment import project_env

NAMES = ("PREFECT_HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "RAY_AUTH_MODE", "TOKENIZERS_PARALLELISM",
         "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "PREFECT_SERVER_ANALYTICS_ENABLED")


def test_project_env_fills_only_unset_variables(tmp_path, monkeypatch):
    # Rule: state goes under the working directory, and a variable the user set is kept.
    monkeypatch.chdir(tmp_path)
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    project_env()
    assert os.environ["PREFECT_HOME"] == str(tmp_path / ".prefect")
    assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path / ".cache" / "vllm")
    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert all(name in os.environ for name in NAMES)
