"""`option(default, help)`: a config field that carries its one-line help.

Every setting of the run's config dataclasses (`rhymerl.config.run`, `SpecConfig`) is declared with
`option`, so its type, default and help sit on one line, and `rhymerl.config.reference` writes the
configuration reference (docs/configuration.md) from them.
"""

from __future__ import annotations

from dataclasses import Field, field
from typing import Any


def option(default: Any, help: str, allowed: str = "") -> Any:
    """A dataclass field with `default`, its `help` line and, where the type does not say it, the
    `allowed` values (e.g. ">= 1"; a Literal type or bool lists its own)."""
    return field(default=default, metadata={"help": help, "allowed": allowed})


def help_of(f: Field) -> str:
    """The help line of a field declared with `option` ("" for any other field)."""
    return f.metadata.get("help", "")
