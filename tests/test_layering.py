"""Dependencies point one way: cli -> flows -> tasks -> workers -> rhymerl, storage; the core stays
orchestration-free; only rhymerl/vllm/ talks to vLLM; only command lines parse arguments."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# For each package, the top-level modules it must never import.
FORBIDDEN = {
    "rhymerl": {"prefect", "prefect_ray", "ray", "mlflow", "duckdb", "flows", "tasks", "workers", "storage", "s3fs",
                "cli"},
    "storage": {"prefect", "prefect_ray", "ray", "flows", "tasks", "workers", "cli"},
    "workers": {"prefect", "prefect_ray", "flows", "tasks", "cli"},
    "tasks": {"flows", "cli"},
    "flows": {"cli"},
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_one_way(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    bad = {str(f.relative_to(ROOT)): sorted(imported_roots(f) & FORBIDDEN[package]) for f in files}
    assert {k: v for k, v in bad.items() if v} == {}


ADAPTER = ROOT / "rhymerl" / "vllm"  # the one package that talks to vLLM


def test_only_the_adapter_package_imports_vllm():
    files = [f for pkg in PROJECT for f in (ROOT / pkg).rglob("*.py")]
    outside = sorted(str(f.relative_to(ROOT)) for f in files
                     if ADAPTER not in f.parents and "vllm" in imported_roots(f))
    assert outside == []
    assert any("vllm" in imported_roots(f) for f in ADAPTER.rglob("*.py"))  # the rule sees its imports


# Command lines: cli/, plus each benchmark's entry module (`rhymerl bench NAME` hands it the rest of
# the arguments) and the standalone local S3 server. Nothing else reads arguments.
ARG_PARSERS = {"bench/spec_bench.py", "bench/pipe_bench.py", "bench/lake_bench.py", "bench/e2e/bench.py",
               "bench/sharded_bench.py", "bench/spec_scale_bench.py", "bench/history_bytes_bench.py", "bench/step_table.py",
               "infra/local_s3.py"}


def test_only_command_lines_parse_arguments():
    files = [f for pkg in PROJECT for f in (ROOT / pkg).rglob("*.py")]
    parsing = {str(f.relative_to(ROOT)) for f in files
               if "argparse" in imported_roots(f) or "sys.argv" in f.read_text()}
    assert {p for p in parsing if not p.startswith("cli/")} <= ARG_PARSERS
    assert "cli/main.py" in parsing  # the rule sees the real command line


def test_checker_sees_forbidden_import(tmp_path):
    # The rule has power: a module importing prefect is caught.
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom prefect import flow\n")
    assert imported_roots(f) & FORBIDDEN["rhymerl"] == {"prefect"}


PROJECT = ("rhymerl", "storage", "workers", "tasks", "flows", "cli", "bench", "infra")


def _loaded_by_name(tree: ast.AST, modules: set[str]) -> set[str]:
    """Project modules a file loads by name (`importlib.import_module`, `__import__`).

    A literal name counts; an f-string with a literal prefix counts every module under that
    prefix; a name looked up at run time (`import_module(TABLE[key])`) counts every string literal
    of the file that names a project module (the table it looks up).
    """
    found: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called not in ("import_module", "__import__"):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.add(arg.value)
        elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            found.update(m for m in modules if m.startswith(arg.values[0].value))
        else:
            found.update(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in modules)
    return found


def module_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports anywhere (module level or in a function),
    or loads by name through importlib."""
    files = {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
             for pkg in PROJECT for f in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = _loaded_by_name(tree, set(files))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import module`
        graph[name] = {t for t in targets if t in files and t != name}
    packages = {name for name, path in files.items() if path.name == "__init__.py"}
    for name in graph:  # a member importing its own package's __init__ (re-exports) is no circle
        graph[name] -= {pkg for pkg in packages if name.startswith(pkg + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    # Rule: no two modules import each other, directly or around a loop, not even inside a
    # function (a deferred import that only hides a circle still ties the two modules together).
    # A package's __init__ re-exporting its modules is not a circle.
    assert cycles(module_graph()) == []


def test_cycle_finder_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_graph_sees_modules_loaded_by_name(tmp_path):
    # Rule: a load through importlib ties two modules as an import does (a literal, an f-string's
    # literal prefix, or a table of names looked up at run time).
    mods = {"bench.a", "bench.b", "cli.main"}
    src = ("import importlib\nT = {'a': 'bench.a'}\nimportlib.import_module(T[k])\n"
           "importlib.import_module('cli.main')\nimportlib.import_module(f'bench.{x}')\n")
    assert _loaded_by_name(ast.parse(src), mods) == {"bench.a", "bench.b", "cli.main"}
    assert _loaded_by_name(ast.parse("T = 'bench.a'\n"), mods) == set()  # a string alone loads nothing
