"""Run checkpoints next to the lake: trainer state and counters, committed by a marker written last.

    <root>/<run_id>/step-<global_step:08d>/trainer.pt    the trainer's state (opaque bytes)
    <root>/<run_id>/step-<global_step:08d>/state.json    counters, history, MLflow run id (JSON)
    <root>/<run_id>/step-<global_step:08d>/COMMITTED     size and SHA-256 of both; written LAST

`<root>` is `checkpoint.dir`, or `<lake.url>/_checkpoints` by default; any fsspec URL works. A
checkpoint exists only once its COMMITTED marker does (a create-only put), so a writer that dies
mid-write leaves a folder that readers ignore and the next prune removes. Pruning deletes a
checkpoint's marker before its files, so no reader ever sees a marker without its files. The
store only moves bytes and JSON: what the trainer state holds is the trainer's business.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping

from storage.fs import LakeError, lake_io, list_files, open_filesystem, put_atomic
from storage.layout import check_key

__all__ = ["Checkpoint", "CheckpointStore", "checkpoint_url"]

MARKER = "COMMITTED"
STATE_FILE = "trainer.pt"
META_FILE = "state.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def checkpoint_url(lake_url: str, dir: str = "") -> str:
    """Where a run's checkpoints live: `dir` if set, else `_checkpoints` inside the lake root."""
    return dir or f"{lake_url.rstrip('/')}/_checkpoints"


def step_key(run_id: str, global_step: int) -> str:
    return f"{run_id}/step-{global_step:08d}"


def _digest(blob: bytes) -> dict[str, Any]:
    return {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}


@dataclass(frozen=True)
class Checkpoint:
    """One committed checkpoint: the trainer's state bytes and the run's counters."""

    run_id: str
    global_step: int  # the last step whose training the state includes
    trainer_state: bytes
    meta: Mapping[str, Any]
    committed_at: float


class CheckpointStore:
    """Writes, lists, loads and prunes the checkpoints under one root URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.root = open_filesystem(url)

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def save(self, run_id: str, global_step: int, trainer_state: bytes, meta: Mapping[str, Any],
             keep: int | None = None) -> bool:
        """Write a checkpoint and commit it (marker last); then keep only the newest `keep`.

        Returns False if this step already had a committed checkpoint (it stands unchanged).
        `meta` must be JSON values. Files of an earlier torn attempt at the same step are
        overwritten before the marker is written.
        """
        check_key(run_id, global_step, 0)
        if not isinstance(trainer_state, bytes):
            raise TypeError(f"trainer_state must be bytes, got {type(trainer_state).__name__}")
        try:
            meta_blob = json.dumps(dict(meta), indent=1).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint meta must be JSON values: {exc}") from exc
        key = step_key(run_id, global_step)
        if global_step in self.steps(run_id):
            return False
        marker = {"run_id": run_id, "global_step": global_step, "committed_at": time.time(),
                  "files": {STATE_FILE: _digest(trainer_state), META_FILE: _digest(meta_blob)}}
        with lake_io(self.url, f"write checkpoint {key}"):
            put_atomic(self.fs, self._path(f"{key}/{STATE_FILE}"), trainer_state, exclusive=False)
            put_atomic(self.fs, self._path(f"{key}/{META_FILE}"), meta_blob, exclusive=False)
            committed = put_atomic(self.fs, self._path(f"{key}/{MARKER}"),
                                   json.dumps(marker, indent=1).encode(), exclusive=True)
        if keep is not None:
            self.prune(run_id, keep)
        return committed

    def _listing(self, run_id: str) -> dict[int, set[str]]:
        """global step -> names of the files in its folder (committed or not)."""
        check_key(run_id, 0, 0)
        found: dict[int, set[str]] = {}
        for key in list_files(self.fs, self.root, self.url, run_id):
            parts = key.split("/")
            match = _STEP_DIR.match(parts[1]) if len(parts) == 3 else None
            if match:
                found.setdefault(int(match.group(1)), set()).add(parts[2])
        return found

    def steps(self, run_id: str) -> list[int]:
        """Global steps of the run's committed checkpoints, oldest first."""
        return sorted(s for s, names in self._listing(run_id).items() if MARKER in names)

    def load(self, run_id: str, global_step: int) -> Checkpoint:
        """Read a committed checkpoint; LakeError if it is absent or its files fail their digests."""
        key = step_key(run_id, global_step)
        paths = [self._path(f"{key}/{name}") for name in (MARKER, STATE_FILE, META_FILE)]
        with lake_io(self.url, f"read checkpoint {key}"):
            blobs = self.fs.cat(paths, on_error="return")
        marker_blob = blobs.get(paths[0])
        if not isinstance(marker_blob, bytes):
            raise LakeError(f"checkpoint {self.url}/{key} is not committed (no {MARKER} marker)")
        marker = json.loads(marker_blob)
        for name, path in zip((STATE_FILE, META_FILE), paths[1:]):
            blob = blobs.get(path)
            if not isinstance(blob, bytes) or _digest(blob) != marker["files"][name]:
                raise LakeError(f"checkpoint {self.url}/{key}: {name} is missing or damaged; delete "
                                f"the folder's {MARKER} to fall back to the checkpoint before it")
        return Checkpoint(run_id=run_id, global_step=global_step, trainer_state=blobs[paths[1]],
                          meta=json.loads(blobs[paths[2]]), committed_at=float(marker["committed_at"]))

    def latest_meta(self, run_id: str) -> tuple[int, dict[str, Any]] | None:
        """(global step, state.json) of the run's newest committed checkpoint, without reading
        its trainer state (gigabytes for a real model); None if the run has none."""
        steps = self.steps(run_id)
        if not steps:
            return None
        key = step_key(run_id, steps[-1])
        marker_path, meta_path = self._path(f"{key}/{MARKER}"), self._path(f"{key}/{META_FILE}")
        with lake_io(self.url, f"read checkpoint {key}"):
            blobs = self.fs.cat([marker_path, meta_path], on_error="return")
        meta = blobs.get(meta_path)
        if not isinstance(meta, bytes) or _digest(meta) != json.loads(blobs[marker_path])["files"][META_FILE]:
            raise LakeError(f"checkpoint {self.url}/{key}: {META_FILE} is missing or damaged; delete "
                            f"the folder's {MARKER} to fall back to the checkpoint before it")
        return steps[-1], json.loads(meta)

    def latest(self, run_id: str) -> Checkpoint | None:
        """The run's newest committed checkpoint, or None if it has none."""
        steps = self.steps(run_id)
        return self.load(run_id, steps[-1]) if steps else None

    def prune(self, run_id: str, keep: int) -> list[int]:
        """Delete all but the newest `keep` committed checkpoints, and every uncommitted folder
        older than the newest committed one (torn writes); returns the global steps deleted."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        listing = self._listing(run_id)
        committed = sorted(s for s, names in listing.items() if MARKER in names)
        if not committed:
            return []
        doomed = set(committed[:-keep]) | {s for s, names in listing.items()
                                           if MARKER not in names and s < committed[-1]}
        for step in sorted(doomed):
            folder = self._path(step_key(run_id, step))
            with lake_io(self.url, f"delete checkpoint {step_key(run_id, step)}"):
                if MARKER in listing[step]:  # uncommit first: never a marker without its files
                    self.fs.rm_file(f"{folder}/{MARKER}")
                self.fs.rm(folder, recursive=True)
        return sorted(doomed)
