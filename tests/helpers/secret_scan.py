"""Scanning what a run wrote for secrets (the ops tests plant fake ones and look for them)."""

from __future__ import annotations

from pathlib import Path


def files_containing(root: Path, secrets: list[str]) -> list[str]:
    """Every file under `root` (logs, SQLite databases, artifacts) whose bytes hold a secret."""
    wanted = [s.encode() for s in secrets]
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and any(w in p.read_bytes() for w in wanted))
