"""Writing the rollout lake: data files, then the step manifest last (exactly once per step).

Exactly-once protocol for rollouts: every attempt writes its data to fresh unique keys, so a
retry never clobbers or appends to anything. `commit_step` then writes the step's manifest (the
files, their row counts, sizes and SHA-256, and a checksum over that list) with a create-if-absent
put. Readers see only files named by a manifest, so data of an attempt that died before its
manifest is invisible, and a second commit of the same step is refused (returns False): the
first wins. Steps and runs rows are single small files written atomically at keys that make
retries harmless, so they need no manifest of their own; so is each evaluation's rows file (one
per run and epoch boundary, written whole or not at all). The key layout is in storage/layout.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import uuid
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.fs import LakeError, lake_io, open_filesystem, parquet_bytes, put_atomic, read_parquet_bytes
from storage.layout import MANIFEST_VERSION, check_key, eval_key, files_checksum, manifest_key, step_dir
from storage.schema import (
    EVALS_SCHEMA, ROLLOUTS_SCHEMA, RUNS_SCHEMA, STEPS_SCHEMA, SchemaError, conform_table, rows_to_table,
    schema_fingerprint,
)

__all__ = ["LakeWriter", "RUN_STATUSES"]

RUN_STATUSES = ("running", "finished", "failed", "killed")


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
        check_key(run_id, epoch, step)
        for name, value in (("worker", worker), ("attempt", attempt)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not isinstance(table, pa.Table):
            raise TypeError(f"write_rollouts takes a pyarrow Table, got {type(table).__name__}; "
                            "build one from dict rows with rows_to_table(rows)")
        data = conform_table(_check_partition(table, run_id, epoch, step), ROLLOUTS_SCHEMA)
        key = f"{step_dir(run_id, epoch, step)}/part-w{worker}-a{attempt}-{uuid.uuid4().hex}.parquet"
        with lake_io(self.url, f"write {key}"):
            put_atomic(self.fs, self._path(key), parquet_bytes(data), exclusive=False)
        return key

    def is_committed(self, run_id: str, epoch: int, step: int) -> bool:
        """True once the step's manifest exists (its rollouts are then visible to readers)."""
        check_key(run_id, epoch, step)
        with lake_io(self.url, "check a step manifest"):
            return self.fs.exists(self._path(manifest_key(run_id, epoch, step)))

    def _describe(self, keys: list[str]) -> list[dict[str, Any]]:
        """Read the files back: proves they exist and are Parquet, and gives rows and SHA-256."""
        paths = [self._path(k) for k in keys]
        with lake_io(self.url, "read back the files to commit"):
            blobs = self.fs.cat(paths, on_error="return")
        entries = []
        for key, path in zip(keys, paths):
            blob = blobs.get(path)
            if not isinstance(blob, bytes):
                raise LakeError(f"lake {self.url}: cannot commit {key}: {blob!r}; pass the keys "
                                "that write_rollouts returned for this step")
            try:
                meta = pq.read_metadata(pa.BufferReader(blob))
            except pa.ArrowException as exc:
                raise LakeError(f"lake {self.url}: {key} is not a Parquet file ({exc}); "
                                "rewrite the step's rollouts with write_rollouts") from exc
            entries.append({"path": key, "rows": meta.num_rows, "bytes": len(blob),
                            "sha256": hashlib.sha256(blob).hexdigest(),
                            "schema": schema_fingerprint(meta.schema.to_arrow_schema())})
        return entries

    def commit_step(self, run_id: str, epoch: int, step: int, files: list[str],
                    stats: Mapping[str, Any] | None = None) -> bool:
        """Make the step's rollouts visible by writing its manifest last; exactly once.

        `files` are the keys write_rollouts returned for this step (all workers, one attempt).
        Returns True if this call committed the step, False if it was already committed (the
        earlier commit stands and no rows are added). `stats` (JSON values) go in the manifest.
        """
        check_key(run_id, epoch, step)
        if not files:
            raise ValueError(f"commit_step({run_id!r}, {epoch}, {step}) got no files; pass the keys "
                             "that write_rollouts returned for this step")
        prefix = step_dir(run_id, epoch, step) + "/"
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
               "rows": sum(e["rows"] for e in entries), "checksum": files_checksum(entries),
               "committed_at": time.time(), "stats": stats_json}
        key = manifest_key(run_id, epoch, step)
        with lake_io(self.url, f"write manifest {key}"):
            return put_atomic(self.fs, self._path(key), json.dumps(doc, indent=1).encode(), exclusive=True)

    def write_steps_row(self, run_id: str, epoch: int, step: int, values: Mapping[str, Any]) -> bool:
        """Write the step's row of the steps table; False if the step already has one.

        `values` holds STEPS_SCHEMA columns other than the key (absent ones are NULL);
        committed_at defaults to now.
        """
        check_key(run_id, epoch, step)
        clash = sorted({"run_id", "epoch", "step"} & set(values))
        if clash:
            raise ValueError(f"write_steps_row: pass {clash} as arguments, not inside values")
        row = {"committed_at": time.time(), **values, "run_id": run_id, "epoch": epoch, "step": step}
        data = parquet_bytes(rows_to_table([row], STEPS_SCHEMA))
        key = f"steps/run_id={run_id}/epoch={epoch}/step={step}.parquet"
        with lake_io(self.url, f"write {key}"):
            if self.fs.exists(self._path(key)):
                return False
            return put_atomic(self.fs, self._path(key), data, exclusive=True)

    def has_eval(self, run_id: str, epoch: int) -> bool:
        """Whether the evaluation after `epoch` (-1: before the first) is in the lake."""
        key = eval_key(run_id, epoch)
        with lake_io(self.url, f"check {key}"):
            return self.fs.exists(self._path(key))

    def write_evals(self, run_id: str, epoch: int, rows: list[Mapping[str, Any]]) -> bool:
        """Write one evaluation's rows (EVALS_SCHEMA) as one file, exactly once: False (nothing
        written) when that evaluation is already in the lake. run_id and epoch must match every row."""
        key = eval_key(run_id, epoch)
        if not rows:
            raise ValueError(f"write_evals({run_id!r}, {epoch}) got no rows; an evaluation has at least one")
        if any(r.get("run_id") != run_id or r.get("epoch") != epoch for r in rows):
            raise SchemaError(f"evals: every row of {key} must have run_id={run_id!r} and epoch={epoch}")
        now = time.time()
        data = parquet_bytes(rows_to_table([{"evaluated_at": now, **r} for r in rows], EVALS_SCHEMA))
        with lake_io(self.url, f"write {key}"):
            if self.fs.exists(self._path(key)):
                return False
            return put_atomic(self.fs, self._path(key), data, exclusive=True)

    def _run_states(self, run_id: str) -> list[str]:
        with lake_io(self.url, f"list the states of run {run_id}"):
            try:
                found = self.fs.ls(self._path(f"runs/run_id={run_id}"), detail=False)
            except FileNotFoundError:
                return []
        return sorted(p for p in found if p.endswith(".parquet"))

    def _write_run_state(self, row: dict[str, Any]) -> None:
        key = f"runs/run_id={row['run_id']}/{time.time_ns():020d}-{row['status']}.parquet"
        data = parquet_bytes(rows_to_table([row], RUNS_SCHEMA))
        with lake_io(self.url, f"write {key}"):
            put_atomic(self.fs, self._path(key), data, exclusive=True)

    def write_run(self, run_id: str, name: str, config: Any, started_at: float | None = None) -> None:
        """Record that a run started (or resumed): a runs row with status 'running'.

        `config` is a config dataclass (e.g. RunConfig), a dict, or JSON text.
        """
        check_key(run_id, 0, 0)
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            config = dataclasses.asdict(config)
        config_json = config if isinstance(config, str) else json.dumps(config, sort_keys=True, default=str)
        now = time.time()
        self._write_run_state({"run_id": run_id, "name": name, "config_json": config_json,
                               "started_at": now if started_at is None else started_at,
                               "ended_at": None, "status": "running", "updated_at": now})

    def finish_run(self, run_id: str, status: str = "finished", ended_at: float | None = None) -> None:
        """Record the end of a run; the runs view then shows this status and ended_at."""
        check_key(run_id, 0, 0)
        if status not in RUN_STATUSES[1:]:
            raise ValueError(f"finish_run status {status!r} must be one of {RUN_STATUSES[1:]}")
        states = self._run_states(run_id)
        if not states:
            raise LakeError(f"lake {self.url}: run {run_id!r} has no runs row; call write_run first")
        with lake_io(self.url, f"read the state of run {run_id}"):
            last = read_parquet_bytes(self.fs.cat_file(states[-1])).to_pylist()[0]
        now = time.time()
        # Latest state wins in the view, so never let a skewed clock put the end before the start.
        updated = max(now, last["updated_at"] + 1e-3)
        self._write_run_state({**{k: last[k] for k in ("run_id", "name", "config_json", "started_at")},
                               "ended_at": now if ended_at is None else ended_at,
                               "status": status, "updated_at": updated})
