"""Shared by the infra tests: the settings table of docs/cluster.md and YAML loading."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# Names that belong to the switchboard; any variable with these prefixes in infra/ must be one
# docs/cluster.md documents (catches a typo such as RHYMERL_LAKE_URL, which RhymeRL would ignore).
SWITCHBOARD_PREFIXES = ("RHYMERL_", "MLFLOW_TRACKING", "MLFLOW_EXPERIMENT", "AWS_", "RAY_ADDRESS",
                        "PREFECT_API_URL")


SETTINGS_DOC = ROOT / "docs" / "cluster.md"


def settings_table() -> dict[str, str]:
    """{variable: row} from docs/cluster.md's "Settings: one table" (rows starting with a `NAME`)."""
    text = SETTINGS_DOC.read_text()
    assert "\n## Settings: one table" in text, "docs/cluster.md lost its 'Settings: one table' section"
    section = text.split("\n## Settings: one table", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): line for line in section.splitlines()
            if (m := re.match(r"\|\s*`([A-Z][A-Z0-9_]+)`", line))}


def undocumented(names) -> set[str]:
    """Switchboard-looking variable names the settings table does not list."""
    table = settings_table()
    return {n for n in names if n.startswith(SWITCHBOARD_PREFIXES) and n not in table}


def load_yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def image_pinned(image: str) -> bool:
    """name:tag (or @digest) with a tag other than latest."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")
