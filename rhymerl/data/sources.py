"""Dataset rows from files, folders, globs and URLs: every column kept, each row a dict.

A source is one entry or a list of entries; each entry is a path or fsspec URL (``s3://...``,
opened with the given storage options), possibly a glob (``*``, ``?``, ``[``), naming:

* ``.jsonl``: one JSON object per line; blank lines are skipped.
* ``.json``: a list of objects, or an object whose ``"data"`` key holds that list (the layout
  ``datasets.load_dataset("json", field="data")`` reads). Nothing else.
* ``.parquet``: any Parquet file.
* a folder written by ``datasets.Dataset.save_to_disk``: its ``state.json`` lists the Arrow files
  (``{"_data_files": [{"filename": "data-00000-of-00001.arrow"}, ...]}``), each an Arrow IPC
  *stream* (the format `datasets` writes), read in that order with pyarrow; the IPC file format
  is read too. Without ``_data_files`` the folder's ``data-*.arrow`` files are read, sorted.
  ``dataset_info.json`` is not needed. A ``DatasetDict`` folder (``dataset_dict.json``) is refused
  with its split names: name one split's folder.

Rows keep file order, files their listed (or sorted glob) order. Every row of a source must have
the same columns (a file's rows and all its files alike). Errors are `ConfigError`s naming the
source (and the line or file) and the fix: a missing path, a glob matching nothing, an empty or
unreadable file, an unsupported type, mixed columns.

`check_columns` checks the configured prompt and answer columns; `pick_rows` chooses the
prompts: the rows shuffled by ``random.Random(seed)`` over their indices, then the first
`num_prompts` (0: every row), each with its index in the source as its stable id.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, TypeVar

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from rhymerl.errors import ConfigError

T = TypeVar("T")
SUFFIXES = (".jsonl", ".json", ".parquet")
STATE_FILE = "state.json"  # datasets.save_to_disk: lists the folder's Arrow files
DICT_FILE = "dataset_dict.json"  # datasets.DatasetDict.save_to_disk: one folder per split


@dataclass(frozen=True)
class SourceRows:
    """The rows of a source, with its columns (the same for every row) and a name for messages."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]


def load_rows(source: str | Sequence[str], storage_options: Mapping[str, Any] | None = None,
              key: str = "data.dataset") -> SourceRows:
    """Every row of `source` (module docstring); `key` names the setting in error messages."""
    entries = [source] if isinstance(source, str) else list(source)
    if not entries or not all(isinstance(e, str) and e for e in entries):
        raise ConfigError(f"{key} = {source!r}: give a path, URL or glob, or a list of them")
    name = entries[0] if len(entries) == 1 else f"[{', '.join(entries)}]"
    parts: list[tuple[str, tuple[str, ...], list[dict[str, Any]]]] = []
    for entry in entries:
        fs, paths = _expand(entry, dict(storage_options or {}), key)
        for path in paths:
            where = fs.unstrip_protocol(path) if "://" in entry else path
            columns, rows = _read(fs, path, where)
            if not rows:
                raise ConfigError(f"{key}: {where} is empty (no rows); remove it from {key} or fill it")
            parts.append((where, columns, rows))
    first_where, columns, _ = parts[0]
    for where, cols, _ in parts[1:]:
        if set(cols) != set(columns):
            raise ConfigError(f"{key}: mixed columns: {where} has {_diff(cols, columns)} compared with "
                              f"{first_where}; every file of a source needs the same columns")
    return SourceRows(name=name, columns=columns, rows=tuple(r for _, _, rows in parts for r in rows))


def _diff(cols: Sequence[str], want: Sequence[str]) -> str:
    extra, missing = sorted(set(cols) - set(want)), sorted(set(want) - set(cols))
    return "; ".join(p for p in (f"extra columns {extra}" if extra else "",
                                 f"no columns {missing}" if missing else "") if p)


def _expand(entry: str, storage_options: dict[str, Any], key: str) -> tuple[Any, list[str]]:
    """(filesystem, the files one entry names): a glob's matches, a save_to_disk folder's Arrow files."""
    try:
        fs, path = fsspec.core.url_to_fs(entry, **storage_options)
        if any(c in path for c in "*?["):
            paths = sorted(fs.glob(path))
            if not paths:
                raise ConfigError(f"{key}: the glob {entry} matches nothing; check the pattern and folder")
            return fs, paths
        if not fs.exists(path):
            raise ConfigError(f"{key}: {entry} does not exist; fix the path or URL")
        return fs, _folder_files(fs, path, entry, key) if fs.isdir(path) else [path]
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{key}: cannot open {entry}: {type(exc).__name__}: {exc}; check the path, "
                          "the URL and its storage options (credentials, endpoint)") from exc


def _folder_files(fs: Any, path: str, entry: str, key: str) -> list[str]:
    """The Arrow files of a `datasets.save_to_disk` folder, in the order its state.json lists them."""
    path = path.rstrip("/")
    if fs.isfile(f"{path}/{DICT_FILE}"):
        splits = json.loads(fs.cat_file(f"{path}/{DICT_FILE}")).get("splits", [])
        raise ConfigError(f"{key}: {entry} holds a DatasetDict (splits: {', '.join(splits)}); name one "
                          f"split's folder, e.g. {entry.rstrip('/')}/{splits[0] if splits else 'train'}")
    if not fs.isfile(f"{path}/{STATE_FILE}"):
        raise ConfigError(f"{key}: {entry} is a folder but not one written by datasets' save_to_disk (no "
                          f"{STATE_FILE}); name its files or a glob such as {entry.rstrip('/')}/*.jsonl")
    state = json.loads(fs.cat_file(f"{path}/{STATE_FILE}"))
    names = [f["filename"] for f in state.get("_data_files", [])]
    paths = [f"{path}/{n}" for n in names] if names else sorted(fs.glob(f"{path}/data-*.arrow"))
    if not paths:
        raise ConfigError(f"{key}: {entry} lists no Arrow files in {STATE_FILE} and has no data-*.arrow")
    return paths


def _read(fs: Any, path: str, where: str) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    """(columns, rows) of one file, by its suffix; ConfigError naming `where` when it cannot be read."""
    suffix = next((s for s in (*SUFFIXES, ".arrow") if path.endswith(s)), "")
    if not suffix:
        raise ConfigError(f"{where}: unsupported file type; use {', '.join(SUFFIXES)} files or a "
                          "datasets.save_to_disk folder")
    try:
        with fs.open(path, "rb") as f:
            if suffix == ".jsonl":
                return _jsonl(f, where)
            if suffix == ".json":
                return _json(f, where)
            table = pq.read_table(f) if suffix == ".parquet" else _arrow(f)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{where} cannot be read as {suffix[1:]}: {type(exc).__name__}: {exc}; check that "
                          "the file is complete and of that type") from exc
    return tuple(table.column_names), table.to_pylist()


def _arrow(f: Any) -> pa.Table:
    blob = f.read()
    try:
        return pa.ipc.open_stream(blob).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_file(blob).read_all()


def _same_columns(rows: list[dict[str, Any]], where: str, line_of: Sequence[int], unit: str) -> tuple[str, ...]:
    """The columns every row shares; ConfigError naming the first row whose columns differ."""
    columns = tuple(rows[0]) if rows else ()
    for row, line in zip(rows, line_of):
        if set(row) != set(columns):
            raise ConfigError(f"{where}: mixed columns: {unit} {line} has {_diff(tuple(row), columns)} compared "
                              f"with {unit} {line_of[0]}; every row needs the same columns")
    return columns


def _jsonl(f: Any, where: str) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    rows, lines = [], []
    for number, raw in enumerate(f, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{where} line {number} is not valid JSON ({exc}); each line must be one "
                              "JSON object") from exc
        if not isinstance(row, dict):
            raise ConfigError(f"{where} line {number} is a JSON {type(row).__name__}, not an object; each "
                              "line must be one JSON object such as {\"question\": ..., \"answer\": ...}")
        rows.append(row)
        lines.append(number)
    return _same_columns(rows, where, lines, "line"), rows


def _json(f: Any, where: str) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    try:
        data = json.load(f)
    except ValueError as exc:
        raise ConfigError(f"{where} is not valid JSON ({exc}); fix the file (JSON Lines files end in .jsonl)") from exc
    rows = data.get("data") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"{where} must hold a list of JSON objects, or {{\"data\": [objects]}}; "
                          f"found a {type(data).__name__} at the top")
    return _same_columns(rows, where, range(len(rows)), "row"), rows


def check_columns(source: SourceRows, required: Mapping[str, str]) -> None:
    """ConfigError unless every column in `required` (setting -> column, e.g. {"data.prompt_key":
    "question"}) is one of the source's columns."""
    for setting, column in required.items():
        if column not in source.columns:
            raise ConfigError(f"{setting} = {column!r}: missing column {column!r} in {source.name}; columns "
                              f"are: {', '.join(source.columns)}")


def pick_rows(rows: Sequence[T], num_prompts: int, seed: int, name: str = "the dataset",
              key: str = "data.num_prompts") -> list[tuple[int, T]]:
    """(index in `rows`, row) of the prompts: indices shuffled by random.Random(seed), the first
    `num_prompts` kept (0: all). More than the rows, or negative, is a ConfigError: the count sets
    the steps per epoch, so silently training on fewer would misreport the run."""
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 0:
        raise ConfigError(f"{key} = {num_prompts!r}: give a count >= 1, or 0 for every row")
    if num_prompts > len(rows):
        raise ConfigError(f"{key} = {num_prompts} but {name} has {len(rows)} rows; set {key} to at most "
                          f"{len(rows)}, or 0 for every row")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [(i, rows[i]) for i in order[:num_prompts or len(rows)]]
