"""Sizes a reader can hold: no product module over 400 lines, no function over 80, `rhymerl/`'s
top level at most 8 entries besides `__init__.py` (one concern per folder), and HistoSpec (all its
subfolders) at most 3,500 lines in at most 18 files."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("rhymerl", "storage", "tasks", "flows", "workers", "cli", "infra")
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_TOP_ENTRIES = 400, 80, 8
# HistoSpec's three parts, with the goodput controller that judges every method's drafts (`goodput.py`).
MAX_HISTOSPEC_LINES, MAX_HISTOSPEC_FILES = 3800, 18


def product_modules(root: Path) -> list[Path]:
    return sorted(p for pkg in PRODUCT for p in (root / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def long_modules(files: list[Path]) -> dict[str, int]:
    """Modules over the limit -> their line count."""
    counts = {str(f): len(f.read_text().splitlines()) for f in files}
    return {f: n for f, n in counts.items() if n > MAX_MODULE_LINES}


def long_functions(files: list[Path]) -> dict[str, int]:
    """`file:function` over the limit -> its line count (nested functions count on their own too)."""
    found = {}
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found[f"{f}:{node.name}"] = lines
    return found


def top_entries(package: Path) -> list[str]:
    return sorted(p.name for p in package.iterdir() if p.name not in ("__init__.py", "__pycache__"))


def test_product_modules_and_functions_fit_on_a_screen():
    files = product_modules(ROOT)
    assert len(files) > 100  # the rule sees the product
    assert long_modules(files) == {}
    assert long_functions(files) == {}


def test_rhymerl_top_level_is_grouped_by_concern():
    entries = top_entries(ROOT / "rhymerl")
    assert len(entries) <= MAX_TOP_ENTRIES, entries


def test_histospec_stays_in_three_small_parts():
    files = sorted((ROOT / "rhymerl" / "histospec").rglob("*.py"))
    lines = sum(len(f.read_text().splitlines()) for f in files)
    assert len(files) <= MAX_HISTOSPEC_FILES and lines <= MAX_HISTOSPEC_LINES, (len(files), lines)


def test_size_rules_have_power(tmp_path):
    # Rule: a 401-line module and an 81-line function are caught; 400 and 80 pass.
    def module(function_lines: int, total_lines: int) -> str:
        body = ["def f():"] + [f"    x{i} = {i}" for i in range(function_lines - 1)]
        return "\n".join(body + ["pass"] * (total_lines - function_lines)) + "\n"

    ok, bad = tmp_path / "ok.py", tmp_path / "bad.py"
    ok.write_text(module(80, 400))
    bad.write_text(module(81, 401))
    assert long_functions([ok]) == {} and long_modules([ok]) == {}
    assert long_functions([bad]) == {f"{bad}:f": 81} and long_modules([bad]) == {str(bad): 401}
    for i in range(7):
        (tmp_path / f"m{i}.py").write_text("")
    assert len(top_entries(tmp_path)) == 9  # ok.py, bad.py and seven more: one over the limit
