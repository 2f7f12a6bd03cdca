"""The rollout lake: Parquet files in a folder or object store, committed step by step.

Layout under the lake root (a local folder or `s3://bucket/prefix`):

    rollouts/run_id=R/epoch=E/step=S/part-w{worker}-a{attempt}-{uuid}.parquet   data, never overwritten
    _manifests/run_id=R/epoch=E/step=S.json     commit record of one step, written LAST
    steps/run_id=R/epoch=E/step=S.parquet       one steps row, written only if absent
    runs/run_id=R/{updated_at_ns}-{status}.parquet   one run state, immutable; latest wins

Exactly-once protocol for rollouts: every attempt writes its data to fresh unique keys, so a
retry never clobbers or appends to anything. `commit_step` then writes the step's manifest (the
files, their row counts and SHA-256, and a checksum over that list) with a create-if-absent put.
Readers see only files named by a manifest, so data of an attempt that died before its manifest
is invisible, and a second commit of the same step is refused (returns False): the first wins.
Steps and runs rows are single small files written atomically at keys that make retries
harmless, so they need no manifest of their own.

Hive-style names (`run_id=R/...`) are for people and prefix listings; the columns inside each file
are the source of truth, and readers do not parse the paths.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import duckdb
import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from storage.schema import (
    ROLLOUTS_SCHEMA, RUNS_SCHEMA, SCHEMAS, STEPS_SCHEMA, SchemaError, conform_table, rows_to_table,
)

__all__ = ["Lake", "LakeError", "LakeWriter", "SchemaError", "open_filesystem", "rows_to_table"]

MANIFEST_VERSION = 1
CONNECT_TIMEOUT_S = 3  # an unreachable endpoint must fail in seconds, not minutes
READ_TIMEOUT_S = 30
S3_ATTEMPTS = 2  # botocore attempts per request, and s3fs's own retries on top (kept small)
RUN_STATUSES = ("running", "finished", "failed", "killed")
_SQL_DIR = Path(__file__).parent / "sql"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class LakeError(RuntimeError):
    """The lake cannot be reached, read or written; the message names the URL and the fix."""


# ---------------------------------------------------------------- filesystem


def _secret_values() -> list[str]:
    names = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
    return [v for v in (os.environ.get(n) for n in names) if v and len(v) >= 4]


def _scrub(text: str) -> str:
    """Remove credential values from an error message before it is shown or logged."""
    for value in _secret_values():
        text = text.replace(value, "***")
    return text


@contextmanager
def _io(url: str, what: str) -> Iterator[None]:
    """Turn any storage failure inside the block into a LakeError naming the URL and the action."""
    try:
        yield
    except (LakeError, SchemaError):
        raise
    except Exception as exc:  # fsspec backends raise OSError, botocore and aiohttp errors alike
        msg = _scrub(f"{type(exc).__name__}: {exc}")
        raise LakeError(f"lake {url}: could not {what}: {msg}") from exc


def _s3_options() -> dict[str, Any]:
    """s3fs settings: standard AWS env/config credentials, short timeouts, few retries."""
    options: dict[str, Any] = {
        "config_kwargs": {
            "connect_timeout": CONNECT_TIMEOUT_S,
            "read_timeout": READ_TIMEOUT_S,
            "retries": {"max_attempts": S3_ATTEMPTS, "mode": "standard"},
        },
        "use_listings_cache": False,  # other processes commit steps; never trust a stale listing
    }
    # botocore already honours AWS_ENDPOINT_URL (checked with s3fs 2026.9); passing it explicitly
    # keeps that true for any botocore version and lets error messages name the endpoint.
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_url"] = endpoint
    return options


def _probe_s3(fs: fsspec.AbstractFileSystem, root: str, url: str) -> None:
    bucket = root.split("/", 1)[0]
    endpoint = getattr(fs, "endpoint_url", None) or "AWS default"
    try:
        fs.call_s3("head_bucket", Bucket=bucket)
    except Exception as exc:
        raise LakeError(
            f"lake {url}: cannot reach bucket '{bucket}' at endpoint {endpoint}: "
            f"{_scrub(f'{type(exc).__name__}: {exc}')}. Fix: check that the bucket exists, that "
            f"AWS_ENDPOINT_URL points at a running S3 service, and that AWS credentials "
            f"(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a profile) are set") from exc


def open_filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """Open the filesystem of a lake URL and return it with the root path (no trailing slash).

    Local paths are made absolute. `s3://` uses s3fs with the standard AWS settings plus
    AWS_ENDPOINT_URL, and is probed once so an unreachable store fails now with a LakeError.
    """
    if not url or not url.strip():
        raise LakeError("lake url is empty; set lake.url to a folder or s3://bucket/prefix")
    protocol = fsspec.utils.get_protocol(url)
    if protocol in ("file", "local"):
        if "://" not in url:
            url = os.path.abspath(os.path.expanduser(url))
        fs, path = fsspec.core.url_to_fs(url, auto_mkdir=True)
        return fs, path.rstrip("/") or "/"
    with _io(url, "open its filesystem"):
        fs, path = fsspec.core.url_to_fs(url, **(_s3_options() if protocol in ("s3", "s3a") else {}))
    root = path.rstrip("/")
    if not root:
        raise LakeError(f"lake url {url!r} names no bucket; use s3://bucket/prefix")
    if protocol in ("s3", "s3a"):
        fs.retries = S3_ATTEMPTS  # s3fs's own retry loop (a class attribute, not an init option)
        _probe_s3(fs, root, url)
    return fs, root


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def _put(fs: fsspec.AbstractFileSystem, path: str, data: bytes, exclusive: bool) -> bool:
    """Write `data` at `path` all-or-nothing; with `exclusive`, only if nothing is there yet.

    Returns False when `exclusive` and the path already existed. Local files go through a temp
    file plus rename / hard link, so a reader never sees half a file. S3 PUTs are atomic and the
    exclusive case is a conditional PUT (If-None-Match: *), atomic on AWS, MinIO and moto. Callers
    also check existence first, so a store that ignores the condition still only has a race window.
    """
    if _is_local(fs):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            if not exclusive:
                os.replace(tmp, path)
                return True
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        fs.pipe_file(path, data, mode="create" if exclusive else "overwrite")
    except FileExistsError:
        return False
    return True


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


# ---------------------------------------------------------------- keys


def _check_key(run_id: str, epoch: int, step: int) -> None:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ValueError(f"run_id {run_id!r} is not usable in lake paths; use 1-128 characters "
                         "from letters, digits, '.', '_' and '-', starting with a letter or digit")
    for name, value in (("epoch", epoch), ("step", step)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def _step_dir(run_id: str, epoch: int, step: int) -> str:
    return f"rollouts/run_id={run_id}/epoch={epoch}/step={step}"


def _manifest_key(run_id: str, epoch: int, step: int) -> str:
    return f"_manifests/run_id={run_id}/epoch={epoch}/step={step}.json"


def _files_checksum(files: list[dict[str, Any]]) -> str:
    canonical = json.dumps(files, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _check_partition(table: pa.Table, run_id: str, epoch: int, step: int) -> pa.Table:
    """Fill absent run_id/epoch/step columns from the key; present ones must all match it."""
    for name, value, type_ in (("run_id", run_id, pa.string()), ("epoch", epoch, pa.int32()),
                               ("step", step, pa.int32())):
        if name not in table.column_names:
            table = table.append_column(name, pa.array([value] * table.num_rows, type=type_))
        elif table.num_rows and not pc.all(pc.equal(table.column(name), value)).as_py():
            raise SchemaError(f"rollouts: column '{name}' must be {value!r} in every row of this "
                              f"write (the step being written); found other values")
    return table


@dataclasses.dataclass(frozen=True)
class StepManifest:
    """A committed step as recorded in its manifest."""

    run_id: str
    epoch: int
    step: int
    files: tuple[str, ...]  # keys relative to the lake root
    rows: int
    committed_at: float
    stats: Mapping[str, Any]


def _parse_manifest(raw: bytes, where: str) -> StepManifest:
    try:
        doc = json.loads(raw)
        files = doc["files"]
        ok = doc["checksum"] == _files_checksum(files)
    except (ValueError, KeyError, TypeError) as exc:
        raise LakeError(f"manifest {where} is unreadable ({exc}); delete it to re-commit the step") from exc
    if not ok:
        raise LakeError(f"manifest {where} fails its checksum; delete it to re-commit the step")
    prefix = _step_dir(doc["run_id"], doc["epoch"], doc["step"]) + "/"
    if any(not f["path"].startswith(prefix) for f in files):
        raise LakeError(f"manifest {where} lists files outside {prefix}; delete it to re-commit")
    return StepManifest(doc["run_id"], doc["epoch"], doc["step"], tuple(f["path"] for f in files),
                        doc["rows"], doc["committed_at"], doc.get("stats", {}))


# ---------------------------------------------------------------- writer


class LakeWriter:
    """Writes rollouts, steps and runs to a lake. Several processes may write to one lake at once."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.root = open_filesystem(url)

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def write_rollouts(self, run_id: str, epoch: int, step: int, worker: int, attempt: int,
                       table: pa.Table) -> str:
        """Write one worker's rollouts of a step to a fresh unique file; return its lake key.

        The rows stay invisible until `commit_step` lists the key. Absent run_id/epoch/step
        columns are filled from the arguments; present ones must match them.
        """
        _check_key(run_id, epoch, step)
        for name, value in (("worker", worker), ("attempt", attempt)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not isinstance(table, pa.Table):
            raise TypeError(f"write_rollouts takes a pyarrow Table, got {type(table).__name__}; "
                            "build one from dict rows with rows_to_table(rows)")
        data = conform_table(_check_partition(table, run_id, epoch, step), ROLLOUTS_SCHEMA)
        key = f"{_step_dir(run_id, epoch, step)}/part-w{worker}-a{attempt}-{uuid.uuid4().hex}.parquet"
        with _io(self.url, f"write {key}"):
            _put(self.fs, self._path(key), _parquet_bytes(data), exclusive=False)
        return key

    def is_committed(self, run_id: str, epoch: int, step: int) -> bool:
        """True once the step's manifest exists (its rollouts are then visible to readers)."""
        _check_key(run_id, epoch, step)
        with _io(self.url, "check a step manifest"):
            return self.fs.exists(self._path(_manifest_key(run_id, epoch, step)))

    def _describe(self, keys: list[str]) -> list[dict[str, Any]]:
        """Read the files back: proves they exist and are Parquet, and gives rows and SHA-256."""
        paths = [self._path(k) for k in keys]
        with _io(self.url, "read back the files to commit"):
            blobs = self.fs.cat(paths, on_error="return")
        entries = []
        for key, path in zip(keys, paths):
            blob = blobs.get(path)
            if not isinstance(blob, bytes):
                raise LakeError(f"lake {self.url}: cannot commit {key}: {blob!r}; pass the keys "
                                "that write_rollouts returned for this step")
            try:
                rows = pq.read_metadata(pa.BufferReader(blob)).num_rows
            except pa.ArrowException as exc:
                raise LakeError(f"lake {self.url}: {key} is not a Parquet file ({exc}); "
                                "rewrite the step's rollouts with write_rollouts") from exc
            entries.append({"path": key, "rows": rows, "bytes": len(blob),
                            "sha256": hashlib.sha256(blob).hexdigest()})
        return entries

    def commit_step(self, run_id: str, epoch: int, step: int, files: list[str],
                    stats: Mapping[str, Any] | None = None) -> bool:
        """Make the step's rollouts visible by writing its manifest last; exactly once.

        `files` are the keys write_rollouts returned for this step (all workers, one attempt).
        Returns True if this call committed the step, False if it was already committed (the
        earlier commit stands and no rows are added). `stats` (JSON values) go in the manifest.
        """
        _check_key(run_id, epoch, step)
        if not files:
            raise ValueError(f"commit_step({run_id!r}, {epoch}, {step}) got no files; pass the keys "
                             "that write_rollouts returned for this step")
        prefix = _step_dir(run_id, epoch, step) + "/"
        stray = [f for f in files if not str(f).startswith(prefix)]
        if stray:
            raise ValueError(f"files {stray} are not data files of step {prefix!r}; pass the keys "
                             "that write_rollouts returned for this step")
        try:
            stats_json = json.loads(json.dumps(dict(stats or {})))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"commit_step stats must be JSON values (numbers, strings): {exc}") from exc
        if self.is_committed(run_id, epoch, step):
            return False
        entries = self._describe(sorted(set(files)))
        doc = {"manifest_version": MANIFEST_VERSION, "table": "rollouts", "run_id": run_id,
               "epoch": epoch, "step": step, "files": entries,
               "rows": sum(e["rows"] for e in entries), "checksum": _files_checksum(entries),
               "committed_at": time.time(), "stats": stats_json}
        key = _manifest_key(run_id, epoch, step)
        with _io(self.url, f"write manifest {key}"):
            return _put(self.fs, self._path(key), json.dumps(doc, indent=1).encode(), exclusive=True)

    def write_steps_row(self, run_id: str, epoch: int, step: int, values: Mapping[str, Any]) -> bool:
        """Write the step's row of the steps table; False if the step already has one.

        `values` holds STEPS_SCHEMA columns other than the key (absent ones are NULL);
        committed_at defaults to now.
        """
        _check_key(run_id, epoch, step)
        clash = sorted({"run_id", "epoch", "step"} & set(values))
        if clash:
            raise ValueError(f"write_steps_row: pass {clash} as arguments, not inside values")
        row = {"committed_at": time.time(), **values, "run_id": run_id, "epoch": epoch, "step": step}
        data = _parquet_bytes(rows_to_table([row], STEPS_SCHEMA))
        key = f"steps/run_id={run_id}/epoch={epoch}/step={step}.parquet"
        with _io(self.url, f"write {key}"):
            if self.fs.exists(self._path(key)):
                return False
            return _put(self.fs, self._path(key), data, exclusive=True)

    def _run_states(self, run_id: str) -> list[str]:
        with _io(self.url, f"list the states of run {run_id}"):
            try:
                found = self.fs.ls(self._path(f"runs/run_id={run_id}"), detail=False)
            except FileNotFoundError:
                return []
        return sorted(p for p in found if p.endswith(".parquet"))

    def _write_run_state(self, row: dict[str, Any]) -> None:
        key = f"runs/run_id={row['run_id']}/{time.time_ns():020d}-{row['status']}.parquet"
        data = _parquet_bytes(rows_to_table([row], RUNS_SCHEMA))
        with _io(self.url, f"write {key}"):
            _put(self.fs, self._path(key), data, exclusive=True)

    def write_run(self, run_id: str, name: str, config: Any, started_at: float | None = None) -> None:
        """Record that a run started (or resumed): a runs row with status 'running'.

        `config` is a config dataclass (e.g. RunConfig), a dict, or JSON text.
        """
        _check_key(run_id, 0, 0)
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            config = dataclasses.asdict(config)
        config_json = config if isinstance(config, str) else json.dumps(config, sort_keys=True, default=str)
        now = time.time()
        self._write_run_state({"run_id": run_id, "name": name, "config_json": config_json,
                               "started_at": now if started_at is None else started_at,
                               "ended_at": None, "status": "running", "updated_at": now})

    def finish_run(self, run_id: str, status: str = "finished", ended_at: float | None = None) -> None:
        """Record the end of a run; the runs view then shows this status and ended_at."""
        _check_key(run_id, 0, 0)
        if status not in RUN_STATUSES[1:]:
            raise ValueError(f"finish_run status {status!r} must be one of {RUN_STATUSES[1:]}")
        states = self._run_states(run_id)
        if not states:
            raise LakeError(f"lake {self.url}: run {run_id!r} has no runs row; call write_run first")
        with _io(self.url, f"read the state of run {run_id}"):
            last = pq.read_table(pa.BufferReader(self.fs.cat_file(states[-1]))).to_pylist()[0]
        now = time.time()
        # Latest state wins in the view, so never let a skewed clock put the end before the start.
        updated = max(now, last["updated_at"] + 1e-3)
        self._write_run_state({**{k: last[k] for k in ("run_id", "name", "config_json", "started_at")},
                               "ended_at": now if ended_at is None else ended_at,
                               "status": status, "updated_at": updated})


# ---------------------------------------------------------------- reader


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


class Lake:
    """Read-only SQL over the COMMITTED contents of a lake (views rollouts, steps, runs).

    Views are built from the manifests found at construction; call `refresh()` to pick up steps
    committed since. Uses an in-memory DuckDB that never downloads extensions: remote files are
    read through the fsspec filesystem registered with DuckDB.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.root = open_filesystem(url)
        self.con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                                      "autoload_known_extensions": False})
        if not _is_local(self.fs):
            self.con.register_filesystem(self.fs)
        for name, schema in SCHEMAS.items():
            self.con.register("_arrow_template", schema.empty_table())
            self.con.execute(f"CREATE TABLE _schema_{name} AS SELECT * FROM _arrow_template")
            self.con.unregister("_arrow_template")
        self.refresh()

    def _full(self, key: str) -> str:
        path = f"{self.root}/{key}"
        return path if _is_local(self.fs) else self.fs.unstrip_protocol(path)

    def _find(self, folder: str, suffix: str) -> list[str]:
        """Keys (relative to the root) of finished files under `folder`, sorted."""
        base = f"{self.root}/{folder}"
        with _io(self.url, f"list {folder}/"):
            try:
                found = self.fs.find(base)
            except FileNotFoundError:
                return []
        start = len(self.root) + 1
        return sorted(p[start:] for p in found if p.endswith(suffix))

    def manifests(self) -> list[StepManifest]:
        """Every committed step, in key order."""
        keys = self._find("_manifests", ".json")
        if not keys:
            return []
        with _io(self.url, "read the step manifests"):
            blobs = self.fs.cat([f"{self.root}/{k}" for k in keys])
        return [_parse_manifest(blobs[f"{self.root}/{k}"], f"{self.url}/{k}") for k in keys]

    def refresh(self) -> None:
        """Rebuild the views from the manifests and table files present now."""
        sources = {
            "rollouts": [f for m in self.manifests() for f in m.files],
            "steps": self._find("steps", ".parquet"),
            "runs": self._find("runs", ".parquet"),
        }
        for name, keys in sources.items():
            if keys:
                source = (f"read_parquet({_sql_list([self._full(k) for k in keys])}, "
                          "union_by_name = true, hive_partitioning = false)")
            else:
                source = f"_schema_{name}"
            self.con.execute((_SQL_DIR / f"{name}.sql").read_text().replace("{source}", source))

    def sql(self, query: str, params: list[Any] | Mapping[str, Any] | None = None) -> pa.Table:
        """Run a query over the views and return the result as an Arrow table."""
        relation = self.con.sql(query, params=params)
        return relation.to_arrow_table() if relation is not None else pa.table({})

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
