"""numba's on-disk cache of HistoSpec's compiled functions is dropped whenever any compiled module's
source changes, since a kernel compiled with another module's function inside it would run stale."""

from pathlib import Path

import rhymerl.histospec
from rhymerl.histospec import _fresh_numba_cache


def _package(root: Path) -> Path:
    (root / "engine" / "__pycache__").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "table.py").write_text("@njit(cache=True)\ndef f(): return 1\n")
    (root / "engine" / "kernel.py").write_text("@njit(cache=True)\ndef g(): return f()\n")
    (root / "plain.py").write_text("def h(): return 2\n")
    return root


def _cache_files(root: Path) -> list[Path]:
    for name in ("engine/__pycache__/kernel.g-1.py311.nbi", "engine/__pycache__/kernel.g-1.py311.1.nbc",
                 "__pycache__/table.f-1.py311.nbi"):
        (root / name).write_bytes(b"x")
    return sorted(root.rglob("*.nb[ic]"))


def test_cache_is_dropped_when_a_callee_module_changes(tmp_path):
    # Rule: no stamp yet -> stale until proven fresh; same sources -> kept; the callee's module
    # changed (the caller's own did not) -> every cache file of the package goes.
    root = _package(tmp_path)
    _cache_files(root)
    _fresh_numba_cache(root)
    assert list(root.rglob("*.nb[ic]")) == []
    files = _cache_files(root)
    _fresh_numba_cache(root)
    assert sorted(root.rglob("*.nb[ic]")) == files
    (root / "table.py").write_text("@njit(cache=True)\ndef f(): return 3\n")
    _fresh_numba_cache(root)
    assert list(root.rglob("*.nb[ic]")) == []


def test_a_module_without_compiled_functions_does_not_count(tmp_path):
    root = _package(tmp_path)
    _fresh_numba_cache(root)
    files = _cache_files(root)
    (root / "plain.py").write_text("def h(): return 4\n")
    _fresh_numba_cache(root)
    assert sorted(root.rglob("*.nb[ic]")) == files


def test_the_package_itself_is_stamped_on_import():
    package = Path(rhymerl.histospec.__file__).parent
    assert (package / "__pycache__" / "numba-sources.sha1").read_text().strip()
