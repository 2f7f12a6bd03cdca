"""Dependencies point one way: cli -> flows -> tasks -> workers -> rhymerl, storage; the core stays
orchestration-free; only rhymerl/vllm/ talks to vLLM; only command lines parse arguments."""

import ast
import json
import os
import subprocess
import sys
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


def dynamic_import(node: ast.AST) -> tuple[str, bool] | None:
    """(name, is_prefix) of `importlib.import_module(...)` / `import_module(...)` / `__import__(...)`
    called with a literal name, or with an f-string whose literal start is a prefix of the name."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__"):
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value, False
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return arg.values[0].value, True
    return None


def imported_names(path: Path, modules: set[str]) -> set[str]:
    """The project modules (of `modules`) that `path` imports, statically or by a literal dynamic name."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets.add(node.module)
            targets.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import module`
        elif (loaded := dynamic_import(node)) is not None:
            name, is_prefix = loaded
            if is_prefix:  # an f-string's name may be any module under its literal start (`f"bench.{x}"`)
                targets.update(m for m in modules if m.startswith(name))
            else:
                targets.add(name)
    return targets & modules


def module_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports anywhere (module level or in a function,
    with an import statement or by a literal name handed to `importlib.import_module`/`__import__`)."""
    files = {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
             for pkg in PROJECT for f in (ROOT / pkg).rglob("*.py")}
    graph = {name: imported_names(path, set(files)) - {name} for name, path in files.items()}
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


def test_module_graph_sees_literal_dynamic_imports(tmp_path):
    # Rule: a module loaded by a literal name (or an f-string's literal start) is an edge like an import.
    f = tmp_path / "m.py"
    f.write_text("import importlib\n"
                 "def load(name):\n"
                 "    importlib.import_module('pkg.a')\n"
                 "    __import__('pkg.b')\n"
                 "    return importlib.import_module(f'tools.{name}')\n"
                 "importlib.import_module(name_from_elsewhere)\n")
    modules = {"pkg.a", "pkg.b", "pkg.c", "tools.x", "tools.y", "toolsmith"}
    assert imported_names(f, modules) == {"pkg.a", "pkg.b", "tools.x", "tools.y"}


def test_module_graph_sees_the_benchmarks_the_command_line_loads():
    assert "bench.spec_bench" in module_graph()["cli.main"]


# Settings modules: a config class is imported by command lines, tasks and tests that never run an
# engine, so importing one must stay cheap and side-effect free.
SETTINGS = ("rhymerl.config.run", "rhymerl.config.options", "rhymerl.config.fields", "rhymerl.config.pipe",
            "rhymerl.config.spec")
HEAVY = ("numba", "torch", "vllm", "ray", "prefect")
# Run in a fresh interpreter: which HEAVY roots the import loaded, and for each the chain of modules
# (outermost first) whose top-level code was importing when it was first asked for.
LEAF_PROBE = """
import json, sys
HEAVY, chains = set(sys.argv[2:]), {}
class Watch:
    def find_spec(self, name, path=None, target=None):
        root = name.split(".")[0]
        if root in HEAVY and root not in chains:
            frame, chain = sys._getframe(1), []
            while frame is not None:
                mod = frame.f_globals.get("__name__")
                if frame.f_code.co_name == "<module>" and mod not in (None, "__main__") and mod not in chain:
                    chain.append(mod)
                frame = frame.f_back
            chains[root] = chain[::-1]
        return None
sys.meta_path.insert(0, Watch())
__import__(sys.argv[1])
print(json.dumps({"loaded": sorted(r for r in HEAVY if r in sys.modules), "via": chains}))
"""


def import_fresh(module: str, heavy: tuple[str, ...], cwd: Path) -> dict:
    """`import module` in a new interpreter in `cwd`; the probe's report."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", LEAF_PROBE, module, *heavy], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


def tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")}


@pytest.mark.parametrize("module", SETTINGS)
def test_settings_are_leaves(module, tmp_path):
    # Rule: importing a settings module loads no kernel compiler, engine or orchestrator (nothing of
    # HEAVY), and creates or deletes no file where it runs.
    (tmp_path / "keep.txt").write_text("a file the import must leave alone\n")
    before = tree(tmp_path)
    report = import_fresh(module, HEAVY, tmp_path)
    assert report["loaded"] == [], f"importing {module} loads {report['loaded']}, via {report['via']}"
    assert tree(tmp_path) == before


def test_leaf_probe_sees_a_heavy_import(tmp_path):
    # The rule has power: a module that imports a "heavy" one is caught, with the chain that did it.
    (tmp_path / "leaf_outer.py").write_text("import leaf_inner\n")
    (tmp_path / "leaf_inner.py").write_text("import csv\n")
    report = import_fresh("leaf_outer", ("csv",), tmp_path)
    assert report == {"loaded": ["csv"], "via": {"csv": ["leaf_outer", "leaf_inner"]}}
