"""Run checkpoints next to the lake: trainer state and counters, committed by a marker written last.

    <root>/<run_id>/step-<global_step:08d>/trainer.pt    the trainer's state (opaque bytes)
    <root>/<run_id>/step-<global_step:08d>/state.json    counters, history, MLflow run id (JSON)
    <root>/<run_id>/step-<global_step:08d>/COMMITTED     size and SHA-256 of both; written LAST

A sharded trainer (train.world_size > 1, or any trainer through `sharded_url`) writes a
torch.distributed.checkpoint folder instead of trainer.pt, each rank its own files:

    <root>/<run_id>/step-<global_step:08d>/trainer/      .metadata and one .distcp per rank
    <root>/<run_id>/step-<global_step:08d>/COMMITTED     state.json's digest, every trainer/ file's size

`commit_sharded` writes state.json and the marker once every rank has written (DCP's .metadata
is there); the marker is the commit as above, and it is the same for either kind.

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

from storage.fs import LakeError, is_local, lake_io, list_files, open_filesystem, put_atomic, s3_options
from storage.layout import check_key

__all__ = ["Checkpoint", "CheckpointStore", "checkpoint_url"]

MARKER = "COMMITTED"
STATE_FILE = "trainer.pt"
SHARDED_DIR = "trainer"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint writes it after every rank's files
META_FILE = "state.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def checkpoint_url(lake_url: str, dir: str = "") -> str:
    """Where a run's checkpoints live: `dir` if set, else `_checkpoints` inside the lake root."""
    return dir or f"{lake_url.rstrip('/')}/_checkpoints"


def step_key(run_id: str, global_step: int) -> str:
    return f"{run_id}/step-{global_step:08d}"


def _meta_blob(meta: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(dict(meta), indent=1).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"checkpoint meta must be JSON values: {exc}") from exc


def _digest(blob: bytes) -> dict[str, Any]:
    return {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}


@dataclass(frozen=True)
class Checkpoint:
    """One committed checkpoint: the trainer's state (bytes, or a sharded folder's URL) and the
    run's counters."""

    run_id: str
    global_step: int  # the last step whose training the state includes
    trainer_state: bytes  # b"" for a sharded checkpoint
    meta: Mapping[str, Any]
    committed_at: float
    trainer_url: str = ""  # the torch.distributed.checkpoint folder of a sharded checkpoint

    @property
    def sharded(self) -> bool:
        return bool(self.trainer_url)


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
        meta_blob = _meta_blob(meta)
        key = step_key(run_id, global_step)
        if global_step in self.steps(run_id):
            return False
        marker = {"run_id": run_id, "global_step": global_step, "committed_at": time.time(),
                  "files": {STATE_FILE: _digest(trainer_state), META_FILE: _digest(meta_blob)}}
        with lake_io(self.url, f"write checkpoint {key}"):
            put_atomic(self.fs, self._path(f"{key}/{STATE_FILE}"), trainer_state, exclusive=False)
        return self._commit(run_id, key, meta_blob, marker, keep)

    def sharded_url(self, run_id: str, global_step: int) -> str:
        """The URL every rank of a sharded trainer writes its checkpoint files under."""
        check_key(run_id, global_step, 0)
        return self.fs.unstrip_protocol(self._path(f"{step_key(run_id, global_step)}/{SHARDED_DIR}"))

    def storage_options(self) -> dict[str, Any]:
        """fsspec options for writers of `sharded_url` (the store's own S3 settings; none locally)."""
        return {} if is_local(self.fs) else s3_options()

    def commit_sharded(self, run_id: str, global_step: int, meta: Mapping[str, Any],
                       keep: int | None = None) -> bool:
        """Commit a sharded checkpoint whose ranks have all written under `sharded_url`: write
        state.json, then the marker (sizes of every trainer file) last; then keep the newest `keep`.

        Returns False if the step already had a committed checkpoint. LakeError when the trainer
        folder lacks DCP's .metadata (a rank has not finished: nothing is committed)."""
        check_key(run_id, global_step, 0)
        meta_blob = _meta_blob(meta)
        key = step_key(run_id, global_step)
        if global_step in self.steps(run_id):
            return False
        files = self._sharded_files(key)
        if DCP_METADATA not in files:
            raise LakeError(f"checkpoint {self.url}/{key}/{SHARDED_DIR} has no {DCP_METADATA}: the trainer "
                            "ranks have not all finished writing; not committed")
        listed = {f"{SHARDED_DIR}/{name}": {"bytes": size} for name, size in sorted(files.items())}
        marker = {"run_id": run_id, "global_step": global_step, "committed_at": time.time(),
                  "files": {**listed, META_FILE: _digest(meta_blob)}}
        return self._commit(run_id, key, meta_blob, marker, keep)

    def _commit(self, run_id: str, key: str, meta_blob: bytes, marker: dict, keep: int | None) -> bool:
        """state.json, then the marker last (create-only: a checkpoint exists once it is there);
        then keep the newest `keep`. False if another writer committed the step first."""
        with lake_io(self.url, f"commit checkpoint {key}"):
            put_atomic(self.fs, self._path(f"{key}/{META_FILE}"), meta_blob, exclusive=False)
            committed = put_atomic(self.fs, self._path(f"{key}/{MARKER}"),
                                   json.dumps(marker, indent=1).encode(), exclusive=True)
        if keep is not None:
            self.prune(run_id, keep)
        return committed

    def _sharded_files(self, key: str) -> dict[str, int]:
        """Name -> size of the files in a checkpoint's trainer folder."""
        found = list_files(self.fs, self.root, self.url, f"{key}/{SHARDED_DIR}")
        start = len(f"{key}/{SHARDED_DIR}/")
        return {name[start:]: int(info.get("size", 0)) for name, info in found.items()}

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
        """Read a committed checkpoint; LakeError if it is absent or its files fail their digests.

        A sharded checkpoint's trainer files are checked by size and not read: `trainer_url`
        names them for the ranks to load."""
        key = step_key(run_id, global_step)
        paths = [self._path(f"{key}/{name}") for name in (MARKER, STATE_FILE, META_FILE)]
        with lake_io(self.url, f"read checkpoint {key}"):
            marker_blob = self.fs.cat([paths[0]], on_error="return").get(paths[0])
            if not isinstance(marker_blob, bytes):
                raise LakeError(f"checkpoint {self.url}/{key} is not committed (no {MARKER} marker)")
            marker = json.loads(marker_blob)
            sharded = STATE_FILE not in marker["files"]
            blobs = self.fs.cat(paths[2:] if sharded else paths[1:], on_error="return")
        damaged = [name for name, path in zip((STATE_FILE, META_FILE), paths[1:])
                   if name in marker["files"] and (not isinstance(blobs.get(path), bytes)
                                                   or _digest(blobs[path]) != marker["files"][name])]
        if sharded:
            sizes = {f"{SHARDED_DIR}/{name}": {"bytes": size} for name, size in self._sharded_files(key).items()}
            damaged += [name for name, want in marker["files"].items()
                        if name.startswith(f"{SHARDED_DIR}/") and sizes.get(name) != want]
        if damaged:
            raise LakeError(f"checkpoint {self.url}/{key}: {', '.join(damaged)} is missing or damaged; delete "
                            f"the folder's {MARKER} to fall back to the checkpoint before it")
        return Checkpoint(run_id=run_id, global_step=global_step,
                          trainer_state=b"" if sharded else blobs[paths[1]],
                          meta=json.loads(blobs[paths[2]]), committed_at=float(marker["committed_at"]),
                          trainer_url=self.sharded_url(run_id, global_step) if sharded else "")

    def latest_meta(self, run_id: str) -> tuple[int, dict[str, Any]] | None:
        """(global step, state.json) of the run's newest committed checkpoint, without reading
        its trainer state (gigabytes for a real model); None if the run has none."""
        steps = self.steps(run_id)
        return (steps[-1], self.meta(run_id, steps[-1])) if steps else None

    def meta(self, run_id: str, global_step: int) -> dict[str, Any]:
        """state.json of a committed checkpoint (its counters: epoch, step, ...), checked against
        its marker, without reading the trainer state; LakeError if it is missing or damaged."""
        key = step_key(run_id, global_step)
        marker_path, meta_path = self._path(f"{key}/{MARKER}"), self._path(f"{key}/{META_FILE}")
        with lake_io(self.url, f"read checkpoint {key}"):
            blobs = self.fs.cat([marker_path, meta_path], on_error="return")
        meta, marker = blobs.get(meta_path), blobs.get(marker_path)
        if not isinstance(marker, bytes):
            raise LakeError(f"checkpoint {self.url}/{key} is not committed (no {MARKER} marker)")
        if not isinstance(meta, bytes) or _digest(meta) != json.loads(marker)["files"][META_FILE]:
            raise LakeError(f"checkpoint {self.url}/{key}: {META_FILE} is missing or damaged; delete "
                            f"the folder's {MARKER} to fall back to the checkpoint before it")
        return json.loads(meta)

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
