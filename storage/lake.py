"""The rollout lake: Parquet files in a folder or object store, committed step by step.

`LakeWriter` (storage/writer.py) writes data files, then each step's manifest last; `Lake` here
reads back only what the manifests commit, through an in-memory DuckDB. The key layout is in
storage/layout.py; `storage/verify.py` finds and quarantines damaged files and leftovers.

Views and table macros (SQL in storage/sql/):

    rollouts, steps, runs, evals               the committed tables (evals: held-out evaluation samples)
    lake_files                                 every committed data file and its state
    lake_summary                               runs x epochs: steps, responses, files, bytes
    length_by_epoch, length_histogram(w)       length distributions per epoch
    rhyme, rhyme_epochs, rhyme_by_*(k)         reuse of the previous epoch's responses
    length_rank_stability, length_rank_moves(t)  length-rank stability between epochs
    previous_responses(run, ep), length_forecast(run, ep)   what epoch ep learns from ep - 1
    prompt_history(run, ep, k)                 each prompt's responses from its last k epochs before ep

Damaged committed files (missing, or not the size the manifest recorded: truncated) never give
a silently wrong count: by default the Lake refuses to open and names them; with
`on_damaged="skip"` it leaves them out and warns (LakeWarning) with the rows left out. Files
quarantined by `rhymerl lake verify --quarantine` are always left out with a warning.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path
from typing import Any, Mapping

import duckdb
import pyarrow as pa

from storage.fs import KnownFilesFS, LakeError, is_local, list_files, open_filesystem
from storage.layout import VERIFY_HINT, StepManifest, load_manifests, load_quarantine
from storage.schema import SCHEMAS, SchemaError, rows_to_table
from storage.writer import RUN_STATUSES, LakeWriter

__all__ = ["Lake", "LakeError", "LakeWarning", "LakeWriter", "QueryError", "RUN_STATUSES", "SchemaError",
           "SkippedFile", "open_filesystem", "rows_to_table"]

ON_DAMAGED = ("error", "skip")
_SQL_DIR = Path(__file__).parent / "sql"
_TABLE_SQL = ("rollouts", "steps", "runs", "evals")  # templated with the file list at every refresh
_ANALYSIS_SQL = ("summary", "lengths", "rhyme", "length_rank", "history")  # macros and views over them
_HIVE_TYPES = {"rollouts": "{'run_id': VARCHAR, 'epoch': INTEGER, 'step': INTEGER}",
               "steps": "{'run_id': VARCHAR, 'epoch': INTEGER}",
               "runs": "{'run_id': VARCHAR}", "evals": "{'run_id': VARCHAR}"}
_LAKE_FILE = re.compile(r"((?:rollouts|steps|runs|evals)/run_id=[^\s'\"]+?\.parquet)")
_LAKE_FILES_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("epoch", pa.int32()), ("step", pa.int32()), ("path", pa.string()),
    ("rows", pa.int64()), ("bytes", pa.int64()), ("sha256", pa.string()),
    ("schema", pa.string()), ("committed_at", pa.float64()), ("state", pa.string()),
])


class QueryError(ValueError):
    """A query over the lake failed in DuckDB (syntax, unknown name, bad parameter); the message is
    DuckDB's own."""

class LakeWarning(UserWarning):
    """Committed data is being left out of the views; the message says which and how much."""


@dataclasses.dataclass(frozen=True)
class SkippedFile:
    """A committed data file the views leave out."""

    key: str
    state: str  # 'missing', 'truncated' (size differs from the manifest) or 'quarantined'
    rows: int  # committed rows it held, per its manifest
    detail: str


def _first_line(exc: Exception) -> str:
    """DuckDB errors carry the whole failing SQL after the first line; keep the message."""
    return str(exc).strip().split("\n", 1)[0]


def _named_file(exc: Exception) -> str | None:
    """The lake key of the data file a DuckDB error is about, if it names one."""
    found = _LAKE_FILE.search(str(exc))
    return found.group(1) if found else None


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def _classify(manifests: list[StepManifest], sizes: Mapping[str, Mapping[str, Any]],
              quarantined: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[SkippedFile]]:
    """One lake_files row per committed file, with its state; and the files to leave out."""
    rows, skipped = [], []
    for m in manifests:
        for e in m.entries:
            info = sizes.get(e.path)
            if e.path in quarantined:
                state, detail = "quarantined", str(quarantined[e.path].get("detail", ""))
            elif info is None:
                state, detail = "missing", "listed by its manifest but not in the lake"
            elif int(info.get("size", -1)) != e.bytes:
                state, detail = "truncated", f"{info.get('size')} bytes, manifest says {e.bytes}"
            else:
                state, detail = "ok", ""
            rows.append({"run_id": m.run_id, "epoch": m.epoch, "step": m.step, "path": e.path,
                         "rows": e.rows, "bytes": e.bytes, "sha256": e.sha256, "schema": e.schema,
                         "committed_at": m.committed_at, "state": state})
            if state != "ok":
                skipped.append(SkippedFile(e.path, state, e.rows, detail))
    return rows, skipped


class Lake:
    """Read-only SQL over the COMMITTED contents of a lake (see the module docstring for views).

    Views are built from the manifests found at construction; call `refresh()` to pick up steps
    committed since. `on_damaged` is "error" (refuse to open a lake with missing or truncated
    committed files, naming them) or "skip" (leave them out and warn). Uses an in-memory DuckDB
    that never downloads extensions: remote files are read through the fsspec filesystem.
    """

    def __init__(self, url: str, on_damaged: str = "error") -> None:
        if on_damaged not in ON_DAMAGED:
            raise ValueError(f"on_damaged={on_damaged!r}; use one of {ON_DAMAGED}")
        self.url = url
        self.on_damaged = on_damaged
        self.skipped: tuple[SkippedFile, ...] = ()
        self.fs, self.root = open_filesystem(url)
        self.con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                                      "autoload_known_extensions": False})
        for name, schema in SCHEMAS.items():
            self.con.register("_arrow_template", schema.empty_table())
            self.con.execute(f"CREATE TABLE _schema_{name} AS SELECT * FROM _arrow_template")
            self.con.unregister("_arrow_template")
        self._manifests: list[StepManifest] = []
        self._fs_names: list[str] = []  # filesystems this Lake registered with DuckDB
        # Views over views are bound when created: create them over the empty tables (cheap,
        # no file is opened), and DuckDB rebinds them to the real tables at query time.
        self._create_table_views({name: [] for name in _TABLE_SQL})
        self.con.register("lake_files", _LAKE_FILES_SCHEMA.empty_table())
        for name in _ANALYSIS_SQL:
            self.con.execute((_SQL_DIR / f"{name}.sql").read_text())
        self.refresh()

    def _full(self, key: str) -> str:
        path = f"{self.root}/{key}"
        return path if is_local(self.fs) else self.fs.unstrip_protocol(path)

    def manifests(self) -> list[StepManifest]:
        """Every committed step as of the last refresh, in key order."""
        return list(self._manifests)

    def _load_manifests(self) -> list[StepManifest]:
        manifests, bad = load_manifests(self.fs, self.root, self.url)
        if bad:
            first = next(iter(bad.values()))
            message = (f"lake {self.url}: {len(bad)} step manifest(s) cannot be used ({first}); "
                       + VERIFY_HINT.format(url=self.url)
                       + ", which makes those steps uncommitted so a re-run can commit them")
            if self.on_damaged == "error":
                raise LakeError(message)
            warnings.warn(LakeWarning(message + "; their rows are left out"), stacklevel=3)
        return manifests

    def _report_skipped(self, skipped: list[SkippedFile]) -> None:
        damaged = [s for s in skipped if s.state != "quarantined"]
        hint = VERIFY_HINT.format(url=self.url)
        if damaged and self.on_damaged == "error":
            names = "; ".join(f"{s.key} ({s.state}: {s.detail})" for s in damaged[:3])
            more = f" and {len(damaged) - 3} more" if len(damaged) > 3 else ""
            raise LakeError(f"lake {self.url}: {len(damaged)} committed data file(s) are damaged: "
                            f"{names}{more}. Counts would be wrong, so the lake is not opened; {hint}, "
                            "or open it with on_damaged='skip' (CLI: --skip-damaged)")
        if skipped:
            rows = sum(s.rows for s in skipped)
            names = ", ".join(f"{s.key} ({s.state})" for s in skipped[:3])
            more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
            warnings.warn(LakeWarning(
                f"lake {self.url}: leaving out {len(skipped)} committed file(s) holding {rows} rows: "
                f"{names}{more}; query results exclude those rows. {hint}"), stacklevel=3)

    def refresh(self) -> None:
        """Rebuild the views from the manifests and table files present now."""
        manifests = self._load_manifests()
        sizes = list_files(self.fs, self.root, self.url, "rollouts")
        quarantined = load_quarantine(self.fs, self.root, self.url)
        file_rows, skipped = _classify(manifests, sizes, quarantined)
        self._report_skipped(skipped)
        self._manifests, self.skipped = manifests, tuple(skipped)
        tables = {name: list_files(self.fs, self.root, self.url, name) for name in _TABLE_SQL[1:]}
        if not is_local(self.fs):
            known = {**sizes, **{k: v for files in tables.values() for k, v in files.items()}}
            self._register_fs(KnownFilesFS(self.fs, {f"{self.root}/{k}": v for k, v in known.items()}))
        self.con.register("lake_files", pa.Table.from_pylist(file_rows, schema=_LAKE_FILES_SCHEMA))
        # Committed files of one schema are one scan: DuckDB then reads a single footer to bind
        # the view instead of every file's (union_by_name would). Files of unknown schema, and
        # the steps, runs and evals files (no manifest), are matched by column name.
        groups: dict[str | None, list[str]] = {}
        for row in file_rows:
            if row["state"] == "ok":
                groups.setdefault(row["schema"], []).append(row["path"])
        self._create_table_views({
            "rollouts": [(keys, fp is None) for fp, keys in groups.items()],
            **{name: [(sorted(k for k in files if k.endswith(".parquet")), True)]
               for name, files in tables.items()},
        })

    def _register_fs(self, fs: KnownFilesFS) -> None:
        """Route DuckDB's reads of this lake's URLs through `fs`, replacing the previous one."""
        for name in self._fs_names:
            self.con.unregister_filesystem(name)
        before = set(self.con.list_filesystems())
        self.con.register_filesystem(fs)
        self._fs_names = sorted(set(self.con.list_filesystems()) - before)

    def _read(self, table: str, keys: list[str], by_name: bool) -> str:
        return (f"read_parquet({_sql_list([self._full(k) for k in keys])}, union_by_name = {by_name}, "
                f"hive_partitioning = true, hive_types = {_HIVE_TYPES[table]})")

    def _create_table_views(self, scans: dict[str, list[tuple[list[str], bool]]]) -> None:
        """(Re)create the rollouts, steps, runs and evals views; each scan is (keys, union_by_name)."""
        for name in _TABLE_SQL:
            self._create_view(name, scans[name])

    def _create_view(self, name: str, scans: list[tuple[list[str], bool]]) -> None:
        """Creating a view reads file footers: a file that cannot be read is named in a LakeError
        (error mode) or left out with a warning, and the view is created without it (skip mode)."""
        while True:
            sources = "".join(f"\nUNION ALL BY NAME\nSELECT * FROM {self._read(name, keys, by_name)}"
                              for keys, by_name in scans if keys)
            try:
                self.con.execute((_SQL_DIR / f"{name}.sql").read_text().replace("{sources}", sources))
                return
            except duckdb.Error as exc:
                key = _named_file(exc)
                if key is None:
                    raise
                if self.on_damaged == "error" or not any(key in keys for keys, _ in scans):
                    raise self._cannot_read(key, exc) from exc
                warnings.warn(LakeWarning(f"lake {self.url}: leaving out {key}, which cannot be read "
                                          f"({_first_line(exc)}); {VERIFY_HINT.format(url=self.url)}"),
                              stacklevel=5)
                scans = [([k for k in keys if k != key], by_name) for keys, by_name in scans]

    def _cannot_read(self, key: str, exc: duckdb.Error) -> LakeError:
        return LakeError(f"lake {self.url}: cannot read {key}: {_first_line(exc)}; "
                         f"{VERIFY_HINT.format(url=self.url)}")

    def sql(self, query: str, params: list[Any] | Mapping[str, Any] | None = None) -> pa.Table:
        """Run a query over the views and return the result as an Arrow table.

        A lake file DuckDB cannot read raises LakeError naming it and pointing at verify;
        any other DuckDB error (SQL syntax, an unknown column) raises QueryError with DuckDB's
        message, so callers above storage/ need not know DuckDB.
        """
        try:
            relation = self.con.sql(query, params=params)
            return relation.to_arrow_table() if relation is not None else pa.table({})
        except duckdb.Error as exc:
            key = _named_file(exc)
            if key is None:
                raise QueryError(str(exc)) from exc
            raise self._cannot_read(key, exc) from exc

    def summary(self) -> pa.Table:
        """lake_summary: per run and epoch, committed steps, responses, files and bytes."""
        return self.sql("SELECT * FROM lake_summary")

    def previous_responses(self, run_id: str, epoch: int) -> pa.Table:
        """prompt_id, sample_idx, response_token_ids of every response of epoch - 1 of the run."""
        return self.sql("SELECT * FROM previous_responses($run, $ep)", {"run": run_id, "ep": epoch})

    def prompt_history(self, run_id: str, epoch: int, epochs_back: int = 1) -> pa.Table:
        """HistoSpec's history for epoch `epoch`: see storage/sql/history.sql."""
        return self.sql("SELECT * FROM prompt_history($run, $ep, $k)",
                        {"run": run_id, "ep": epoch, "k": epochs_back})

    def length_forecast(self, run_id: str, epoch: int) -> pa.Table:
        """Per prompt: responses, mean_length and max_length in epoch - 1 of the run."""
        return self.sql("SELECT * FROM length_forecast($run, $ep)", {"run": run_id, "ep": epoch})

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
