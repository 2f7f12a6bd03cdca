"""HistoSpec: lossless speculative rollouts drafted from each prompt's own earlier responses.

Modules (no engine imports; settings: `rhymerl.config.spec.SpecConfig`): `bundle` (the history a
worker's drafter reads), `index` and `siblings` / `sibling_table` (a prompt's index), `drafter` (the
reference drafter, tree, budget rules), `goodput` (the goodput controller: which draft tokens a step
verifies, for every method), `stats` (`SpecStats`). Subpackages: `engine` (the batch path
inside vLLM), `offline` (replay, tuning). Import the module you need: this package only keeps numba's
cache of its compiled modules in step with their sources (below) and imports nothing of its own.
"""

import hashlib
import os
from pathlib import Path


def _fresh_numba_cache(package: Path) -> None:
    """Drop numba's cache files under `package` when any compiled module's source changed.

    numba checks a cached function against its own module's source only, but a function compiled
    with another module's function inside it (the engine's kernel holds the siblings' search) would
    then run stale code after an edit or an upgrade, drafting wrong without an error. So every
    module with `cache=True` is hashed together; on a change all their cache files go (they compile
    again on first use). A read-only install has nothing to drop: numba caches elsewhere."""
    sources = sorted(p for p in package.rglob("*.py") if "cache=True" in p.read_text())
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in sources)).hexdigest()
    stamp = package / "__pycache__" / "numba-sources.sha1"
    try:
        if stamp.exists() and stamp.read_text().strip() == digest:
            return
        for cached in package.rglob("__pycache__/*.nb[ic]"):
            cached.unlink(missing_ok=True)  # a process starting beside this one may have taken it
        stamp.parent.mkdir(exist_ok=True)
        tmp = stamp.with_suffix(f".{os.getpid()}")
        tmp.write_text(digest + "\n")
        os.replace(tmp, stamp)  # whole or absent for processes starting side by side
    except OSError:
        return


_fresh_numba_cache(Path(__file__).parent)  # before any compiled module of the package loads its cache
