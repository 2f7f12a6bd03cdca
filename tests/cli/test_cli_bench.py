"""`rhymerl bench` where the benchmarks are not installed (the images leave bench/ out): one line
saying so and where to run them, exit 2; a benchmark that is there but fails to import still shows
its own error.

Each case runs the CLI in a fresh interpreter without site-packages (`python -S`: no editable
install, which would find the repository's bench/) on a folder holding links to the installed
packages (pyproject.toml's list) and, or not, a bench/ of its own: the import fails as it does in
an image, not through a stand-in.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [p.rstrip("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
            ["tool"]["setuptools"]["packages"]["find"]["include"]]


def bench_in(install: Path) -> subprocess.CompletedProcess:
    """`rhymerl bench spec` with `install` (plus the repository's packages but bench) as its only packages."""
    for name in PACKAGES:
        if name != "bench":
            (install / name).symlink_to(ROOT / name)
    code = "import sys; from cli.main import main; sys.exit(main(['bench', 'spec']))"
    work = install / "work"  # where the command runs: project_env() points caches here
    work.mkdir()
    return subprocess.run([sys.executable, "-S", "-c", code], cwd=work, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(install)})


def test_without_the_benchmarks_bench_says_where_to_run_them(tmp_path):
    from cli.main import EXIT_BAD_INPUT

    out = bench_in(tmp_path)
    assert out.returncode == EXIT_BAD_INPUT == 2, out.stderr
    assert out.stdout == "" and out.stderr.count("\n") == 1, out.stderr  # one line, no traceback
    assert out.stderr.startswith("error: the benchmarks are not in this install") and "`make bench`" in out.stderr


def test_a_benchmark_that_fails_to_import_is_not_disguised(tmp_path):
    # bench/ is there without the benchmark's module: its own error, with the traceback.
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("")
    out = bench_in(tmp_path)
    assert out.returncode == 1 and "ModuleNotFoundError: No module named 'bench.spec_bench'" in out.stderr
    assert "not in this install" not in out.stderr
