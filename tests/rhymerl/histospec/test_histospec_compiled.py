"""rhymerl/histospec/compiled.py: numba's cache is dropped when any compiled module's source changes."""

from pathlib import Path

from rhymerl.histospec.compiled import COMPILED, STAMP, fresh_cache


def _package(tmp_path: Path) -> Path:
    for name in COMPILED:
        (tmp_path / f"{name}.py").write_text(f"# {name}\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    for name in COMPILED + ("other",):
        (cache / f"{name}.f-10.py311.nbi").write_text("index")
        (cache / f"{name}.f-10.py311.1.nbc").write_text("code")
    return tmp_path


def test_a_change_to_one_compiled_module_drops_every_compiled_modules_cache(tmp_path):
    # Rule: a caller compiled with a callee from another module goes stale when the callee's
    # module alone changes, so a change to any of them drops all of their cache files (not others').
    package = _package(tmp_path)
    cache = package / "__pycache__"
    assert fresh_cache(package) == 2 * len(COMPILED)  # no stamp yet: stale until proven fresh
    assert sorted(p.name for p in cache.glob("*.nb[ic]")) == ["other.f-10.py311.1.nbc", "other.f-10.py311.nbi"]
    (cache / "kernel.f-10.py311.nbi").write_text("recompiled")
    assert fresh_cache(package) == 0  # same sources: the cache stays
    assert (cache / "kernel.f-10.py311.nbi").exists() and (cache / STAMP).exists()
    (package / "side_search.py").write_text("# side_search, edited\n")
    assert fresh_cache(package) == 1  # the kernel's cache, compiled with the old side_search, goes
    assert not (cache / "kernel.f-10.py311.nbi").exists()


def test_an_unreadable_package_is_left_alone(tmp_path):
    # Rule: a missing source (a broken or partial install) raises nothing at import.
    assert fresh_cache(tmp_path / "absent") == 0


def test_the_list_names_exactly_the_modules_with_cached_compiled_functions():
    # Rule: a module that gains @njit(cache=True) and is not listed would go stale unseen.
    package = Path(fresh_cache.__code__.co_filename).parent
    cached = {p.stem for p in package.glob("*.py") if p.name != "compiled.py" and "njit(cache=True" in p.read_text()}
    assert cached == set(COMPILED)
