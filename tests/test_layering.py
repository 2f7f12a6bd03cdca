"""Dependencies point one way: flows -> tasks -> rhymerl, storage; the core stays orchestration-free."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# For each package, the top-level modules it must never import.
FORBIDDEN = {
    "rhymerl": {"prefect", "prefect_ray", "ray", "mlflow", "duckdb", "flows", "tasks", "storage", "s3fs"},
    "storage": {"prefect", "prefect_ray", "ray", "flows", "tasks"},
    "tasks": {"flows"},
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


def test_checker_sees_forbidden_import(tmp_path):
    # The rule has power: a module importing prefect is caught.
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom prefect import flow\n")
    assert imported_roots(f) & FORBIDDEN["rhymerl"] == {"prefect"}
