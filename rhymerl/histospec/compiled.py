"""Numba's on-disk cache of HistoSpec's compiled functions, kept in step with all their sources.

Numba caches a compiled function beside its module (`__pycache__/<module>.<function>-<line>.py311.nbi`
and `.nbc`) and checks only that module's own source stamp. A function that calls into another
module is compiled with the callee inside it (`kernel.draft_rows` holds `side_search.sibling_match`), so after
a change to the callee's module alone (an edit, a `git pull`) the caller's cache still loads, running
the old callee against the new arrays. On 2026-12-05 that drafted from the wrong positions without an
error (acceptance 0.60 -> 0.40 in `rhymerl bench spec-scale --spec engine`) until kernel.py was touched.

`fresh_cache()` (run when `rhymerl.histospec` is imported, before any compiled module) hashes the
sources of every module with compiled functions and, when the hash differs from the one recorded
beside the cache, deletes those modules' cache files: they compile again on first use (~20 s, once).
An installed copy whose `__pycache__` numba cannot write caches elsewhere and is re-stamped by the
install itself: nothing to do there.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# modules with @njit(cache=True) (a test checks)
COMPILED = ("flat", "growth", "kernel", "ledger", "requests", "search", "side_arrays", "side_search", "stats",
            "step_budget", "step_pass", "tree_asks")
STAMP = "numba-sources.sha1"  # the sources' hash the cache files were compiled from


def sources_digest(package: Path) -> str:
    """The hash of the compiled modules' sources, in a fixed order."""
    digest = hashlib.sha1()
    for name in COMPILED:
        digest.update((package / f"{name}.py").read_bytes())
    return digest.hexdigest()


def fresh_cache(package: Path = Path(__file__).parent) -> int:
    """Delete the compiled modules' numba cache files in `package`/__pycache__ if their sources
    changed since the cache was stamped, and stamp it; the number of files deleted."""
    cache = package / "__pycache__"
    try:
        digest = sources_digest(package)
        stamp = cache / STAMP
        if stamp.exists() and stamp.read_text().strip() == digest:
            return 0
        stale = [p for p in cache.glob("*.nb[ic]") if p.name.split(".", 1)[0] in COMPILED] if cache.is_dir() else []
        for path in stale:
            path.unlink(missing_ok=True)  # another process starting now may have deleted it first
        cache.mkdir(exist_ok=True)
        tmp = cache / f"{STAMP}.{os.getpid()}"
        tmp.write_text(digest + "\n")
        os.replace(tmp, stamp)  # whole or absent, for processes starting side by side
        return len(stale)
    except OSError:  # a read-only install: numba caches elsewhere, keyed by the installed files
        return 0
