"""Checking a lake: damaged committed files, broken manifests and leftovers; and quarantining them.

`verify_lake(url)` reports, without changing anything:

    missing       a manifest lists a data file that is not in the lake
    truncated     a committed data file is not the size its manifest recorded
    corrupt       a committed file's SHA-256 differs from its manifest's, or a steps/runs/evals file
                  is not readable Parquet
    bad_manifest  a step manifest is unreadable or fails its checksum
    leftover      a file no manifest lists: a failed or superseded attempt, or a temp file
    pending       like leftover, but younger than `grace_s` in a step not committed yet: a
                  writer may still be working on it, so it is reported and never moved

With `quarantine=True` every finding but `pending` is moved aside to `_quarantine/<key>`, next
to a `<key>.reason.json` record written first (so a crash in between still leaves the record).
Healthy committed files are never moved, so no committed row that can be read is lost. For a
`missing` file only the record is written; readers then leave it out with a warning instead of
refusing to open. A quarantined `bad_manifest` makes its step uncommitted so a re-run of the
step can commit it again; its data files become leftovers.

Data files are listed BEFORE the manifests are read: a step committed in between then only has
its files counted as listed, never as leftovers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import uuid
from typing import Any, Mapping

import fsspec
import pyarrow as pa

from storage.fs import lake_io, list_files, modified_at, move, open_filesystem, put_atomic, read_parquet_bytes
from storage.layout import StepManifest, load_manifests, load_quarantine, quarantine_keys, step_dir

__all__ = ["DEFAULT_GRACE_S", "Finding", "KINDS", "VerifyReport", "verify_lake"]

DEFAULT_GRACE_S = 3600.0  # a step whose files are an hour old and still uncommitted has failed
KINDS = ("missing", "truncated", "corrupt", "bad_manifest", "leftover", "pending")
_CHUNK = 4 << 20


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem found in a lake."""

    kind: str  # one of KINDS
    key: str  # relative to the lake root
    detail: str
    rows: int | None = None  # committed rows affected (None: not committed data)
    action: str = ""  # what quarantine did with it ("" when it was not asked for)


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What verify_lake saw and (with quarantine) did."""

    url: str
    manifests: int  # step manifests read
    files_checked: int  # committed data files checked
    hashed: bool  # committed data files were read and hashed, not only sized
    quarantined_before: int  # keys already in _quarantine/ before this run
    findings: tuple[Finding, ...]

    @property
    def problems(self) -> tuple[Finding, ...]:
        """Findings that need action (all but `pending`)."""
        return tuple(f for f in self.findings if f.kind != "pending")

    @property
    def clean(self) -> bool:
        """True when nothing needs action, or quarantine already moved every problem aside."""
        return all(f.action for f in self.problems)

    def table(self) -> pa.Table:
        """The findings as a table: kind, key, rows, detail, action."""
        rows = [dataclasses.asdict(f) for f in self.findings]
        return pa.Table.from_pylist(rows, schema=pa.schema([
            ("kind", pa.string()), ("key", pa.string()), ("detail", pa.string()),
            ("rows", pa.int64()), ("action", pa.string())]))


def _sha256(fs: fsspec.AbstractFileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stat(fs: fsspec.AbstractFileSystem, path: str) -> Mapping[str, Any] | None:
    try:
        return fs.info(path)
    except FileNotFoundError:
        return None


def _check_committed(fs: fsspec.AbstractFileSystem, root: str, manifests: list[StepManifest],
                     data: Mapping[str, Mapping[str, Any]], quarantined: Mapping[str, Any],
                     deep: bool) -> tuple[list[Finding], int]:
    """Findings for the data files the manifests list; and how many files were checked."""
    findings, checked = [], 0
    for m in manifests:
        for e in m.entries:
            # A step committed after `data` was listed has files the listing missed: ask again.
            info = data.get(e.path) or _stat(fs, f"{root}/{e.path}")
            if e.path in quarantined:
                if info is not None:  # quarantine stopped between its record and the move
                    record = quarantined[e.path]
                    findings.append(Finding(record.get("kind", "corrupt"), e.path,
                                            "quarantine record exists but the file was not moved yet",
                                            e.rows))
                continue
            checked += 1
            if info is None:
                findings.append(Finding("missing", e.path, f"listed by its manifest ({e.rows} rows, "
                                        f"{e.bytes} bytes) but not in the lake", e.rows))
            elif int(info.get("size", -1)) != e.bytes:
                findings.append(Finding("truncated", e.path, f"{info.get('size')} bytes, its manifest "
                                        f"recorded {e.bytes}", e.rows))
            elif deep and _sha256(fs, f"{root}/{e.path}") != e.sha256:
                findings.append(Finding("corrupt", e.path, "SHA-256 differs from the one its "
                                        "manifest recorded at commit", e.rows))
    return findings, checked


def _uncommitted(files: Mapping[str, Mapping[str, Any]], listed: set[str], committed_dirs: set[str],
                 grace_s: float, now: float) -> list[Finding]:
    """Leftover or pending findings for files of `files` that no manifest lists."""
    findings = []
    for key, info in sorted(files.items()):
        if key in listed:
            continue
        folder = key.rsplit("/", 1)[0]
        changed = modified_at(info)
        age = now - changed if changed is not None else float("inf")
        temp = ".tmp-" in key.rsplit("/", 1)[-1]
        if folder in committed_dirs and not temp:
            findings.append(Finding("leftover", key, "not listed by its step's manifest: a failed "
                                    "or superseded attempt"))
        elif age >= grace_s:
            what = "unfinished temp file" if temp else "its step was never committed"
            findings.append(Finding("leftover", key, f"{what} ({age:.0f} s old)"))
        else:
            findings.append(Finding("pending", key, f"uncommitted and {age:.0f} s old (< grace "
                                    f"{grace_s:.0f} s): a writer may still be working on it"))
    return findings


def _check_tables(fs: fsspec.AbstractFileSystem, root: str, url: str,
                  files: Mapping[str, Mapping[str, Any]], grace_s: float, now: float) -> list[Finding]:
    """steps/, runs/ and evals/ files: each Parquet one must read whole; temp files are leftovers."""
    parquet = [k for k in sorted(files) if k.endswith(".parquet")]
    findings = _uncommitted({k: v for k, v in files.items() if not k.endswith(".parquet")},
                            set(), set(), grace_s, now)
    if not parquet:
        return findings
    with lake_io(url, "read the steps, runs and evals files"):
        blobs = fs.cat([f"{root}/{k}" for k in parquet], on_error="return")
    for key in parquet:
        blob = blobs.get(f"{root}/{key}")
        try:
            if not isinstance(blob, bytes):
                raise OSError(repr(blob))
            read_parquet_bytes(blob)
        except (OSError, pa.ArrowException) as exc:
            findings.append(Finding("corrupt", key, f"not readable Parquet: {exc}"))
    return findings


def _quarantine(fs: fsspec.AbstractFileSystem, root: str, url: str, finding: Finding) -> Finding:
    """Record, then move the file aside; return the finding with the action taken."""
    dest, record_key = quarantine_keys(finding.key)
    record = {**dataclasses.asdict(finding), "quarantined_at": time.time(),
              "moved_to": None if finding.kind == "missing" else dest}
    with lake_io(url, f"quarantine {finding.key}"):
        put_atomic(fs, f"{root}/{record_key}", json.dumps(record, indent=1).encode(), exclusive=False)
        if finding.kind == "missing":
            return dataclasses.replace(finding, action="recorded; readers now leave it out")
        if fs.exists(f"{root}/{dest}"):
            dest = f"{dest}.{uuid.uuid4().hex[:8]}"
        move(fs, f"{root}/{finding.key}", f"{root}/{dest}")
    return dataclasses.replace(finding, action=f"moved to {dest}")


def verify_lake(url: str, quarantine: bool = False, deep: bool = True,
                grace_s: float = DEFAULT_GRACE_S) -> VerifyReport:
    """Check every file of the lake at `url` (see the module docstring for what is reported).

    `deep` reads and hashes every committed data file (else sizes only). `quarantine` moves
    each problem aside under _quarantine/. Never touches a healthy committed file.
    """
    if grace_s < 0:
        raise ValueError(f"grace_s must be >= 0 seconds, got {grace_s}")
    fs, root = open_filesystem(url)
    now = time.time()
    data = list_files(fs, root, url, "rollouts")
    tables = {k: v for name in ("steps", "runs", "evals") for k, v in list_files(fs, root, url, name).items()}
    manifest_files = list_files(fs, root, url, "_manifests")
    manifests, bad = load_manifests(fs, root, url)
    quarantined = load_quarantine(fs, root, url)

    findings = [Finding("bad_manifest", key, problem) for key, problem in sorted(bad.items())]
    committed, checked = _check_committed(fs, root, manifests, data, quarantined, deep)
    findings += committed
    listed = {e.path for m in manifests for e in m.entries}
    committed_dirs = {step_dir(m.run_id, m.epoch, m.step) for m in manifests}
    findings += _uncommitted(data, listed, committed_dirs, grace_s, now)
    findings += _uncommitted({k: v for k, v in manifest_files.items() if not k.endswith(".json")},
                             set(), set(), grace_s, now)
    findings += _check_tables(fs, root, url, tables, grace_s, now)
    if quarantine:
        findings = [f if f.kind == "pending" else _quarantine(fs, root, url, f) for f in findings]
    return VerifyReport(url, len(manifests) + len(bad), checked, deep, len(quarantined),
                        tuple(findings))

