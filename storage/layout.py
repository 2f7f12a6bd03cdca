"""Where things live in a lake, and the step manifests and quarantine records that describe them.

    rollouts/run_id=R/epoch=E/step=S/part-w{worker}-a{attempt}-{uuid}.parquet   data, never overwritten
    _manifests/run_id=R/epoch=E/step=S.json     commit record of one step, written LAST
    steps/run_id=R/epoch=E/step=S.parquet       one steps row, written only if absent
    runs/run_id=R/{updated_at_ns}-{status}.parquet   one run state, immutable; latest wins
    evals/run_id=R/{before-training | after-epoch-E}.parquet   one evaluation's rows, written only if absent
    _quarantine/<original key>                  a damaged or leftover file moved aside by verify
    _quarantine/<original key>.reason.json      why it was moved; readers skip such keys loudly
    _checkpoints/R/step-G/                      run checkpoints by default (storage/checkpoints.py)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any, Mapping

import fsspec

from storage.fs import LakeError, lake_io, list_files

MANIFEST_VERSION = 1
QUARANTINE = "_quarantine"
REASON_SUFFIX = ".reason.json"
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
VERIFY_HINT = "run `rhymerl lake verify --lake {url}` to list damaged files (add --quarantine to move them aside)"


def check_key(run_id: str, epoch: int, step: int) -> None:
    """Refuse a run id that is unsafe in paths, or a negative / non-integer epoch or step."""
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        raise ValueError(f"run_id {run_id!r} is not usable in lake paths; use 1-128 characters "
                         "from letters, digits, '.', '_' and '-', starting with a letter or digit")
    for name, value in (("epoch", epoch), ("step", step)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def eval_key(run_id: str, epoch: int) -> str:
    """The file of one evaluation's rows: `epoch` -1 is the one before the first epoch. The name holds
    no `name=value` part, so DuckDB's hive partitioning reads only run_id from the path."""
    check_key(run_id, max(epoch, 0), 0)
    if not isinstance(epoch, int) or epoch < -1:
        raise ValueError(f"an evaluation's epoch must be -1 (before the first) or an epoch >= 0, got {epoch!r}")
    return f"evals/run_id={run_id}/{'before-training' if epoch < 0 else f'after-epoch-{epoch}'}.parquet"


def step_dir(run_id: str, epoch: int, step: int) -> str:
    return f"rollouts/run_id={run_id}/epoch={epoch}/step={step}"


def manifest_key(run_id: str, epoch: int, step: int) -> str:
    return f"_manifests/run_id={run_id}/epoch={epoch}/step={step}.json"


def files_checksum(files: list[dict[str, Any]]) -> str:
    canonical = json.dumps(files, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One data file of a committed step, as the manifest recorded it at commit time."""

    path: str  # key relative to the lake root
    rows: int
    bytes: int
    sha256: str
    schema: str | None  # schema_fingerprint of the file (None in manifests written before it)


@dataclasses.dataclass(frozen=True)
class StepManifest:
    """A committed step as recorded in its manifest."""

    run_id: str
    epoch: int
    step: int
    entries: tuple[FileEntry, ...]
    rows: int
    committed_at: float
    stats: Mapping[str, Any]

    @property
    def files(self) -> tuple[str, ...]:
        """Keys (relative to the lake root) of the step's data files."""
        return tuple(e.path for e in self.entries)


def parse_manifest(raw: bytes, where: str) -> StepManifest:
    """Decode a manifest; LakeError if it is unreadable, fails its checksum or lists stray files."""
    try:
        doc = json.loads(raw)
        files = doc["files"]
        ok = doc["checksum"] == files_checksum(files)
        prefix = step_dir(doc["run_id"], doc["epoch"], doc["step"]) + "/"
        entries = tuple(FileEntry(f["path"], int(f["rows"]), int(f["bytes"]), f["sha256"], f.get("schema")) for f in files)
    except (ValueError, KeyError, TypeError) as exc:
        raise LakeError(f"manifest {where} is unreadable ({exc}); delete it to re-commit the step") from exc
    if not ok:
        raise LakeError(f"manifest {where} fails its checksum; delete it to re-commit the step")
    if any(not e.path.startswith(prefix) for e in entries):
        raise LakeError(f"manifest {where} lists files outside {prefix}; delete it to re-commit")
    return StepManifest(doc["run_id"], doc["epoch"], doc["step"], entries, doc["rows"],
                        doc["committed_at"], doc.get("stats", {}))


def load_manifests(fs: fsspec.AbstractFileSystem, root: str, url: str
                   ) -> tuple[list[StepManifest], dict[str, str]]:
    """Every manifest under _manifests/, in key order: (good ones, {bad key: what is wrong})."""
    keys = sorted(k for k in list_files(fs, root, url, "_manifests") if k.endswith(".json"))
    if not keys:
        return [], {}
    with lake_io(url, "read the step manifests"):
        blobs = fs.cat([f"{root}/{k}" for k in keys], on_error="return")
    good, bad = [], {}
    for key in keys:
        blob = blobs.get(f"{root}/{key}")
        if not isinstance(blob, bytes):
            bad[key] = f"cannot be read: {blob!r}"
            continue
        try:
            good.append(parse_manifest(blob, f"{url}/{key}"))
        except LakeError as exc:
            bad[key] = str(exc)
    return good, bad


def quarantine_keys(key: str) -> tuple[str, str]:
    """(where the file goes, where the reason record goes) when `key` is quarantined."""
    return f"{QUARANTINE}/{key}", f"{QUARANTINE}/{key}{REASON_SUFFIX}"


def load_quarantine(fs: fsspec.AbstractFileSystem, root: str, url: str) -> dict[str, dict[str, Any]]:
    """Original key -> reason record of everything verify has quarantined in this lake."""
    keys = [k for k in list_files(fs, root, url, QUARANTINE) if k.endswith(REASON_SUFFIX)]
    if not keys:
        return {}
    with lake_io(url, "read the quarantine records"):
        blobs = fs.cat([f"{root}/{k}" for k in keys])
    start, end = len(QUARANTINE) + 1, -len(REASON_SUFFIX)
    records = {}
    for key in keys:
        try:
            records[key[start:end]] = json.loads(blobs[f"{root}/{key}"])
        except ValueError:
            records[key[start:end]] = {"kind": "unknown", "detail": "unreadable reason record"}
    return records
