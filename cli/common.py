"""What the lake-reading subcommands share: the lake URL, output formats, and one error policy.

Results go to stdout; warnings (committed rows left out) and errors go to stderr, an error as one
line and exit code 2 (`guarded`).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import decimal
import io
import json
import math
import os
import sys
import warnings
from typing import Any, Callable

FORMATS = ("table", "csv", "json")
_CELL = 48  # widest cell the table format prints before eliding


def lake_url(args: argparse.Namespace) -> str:
    """`--lake`, else $RHYMERL_LAKE, else ./lake; a local folder must exist."""
    url = args.lake or os.environ.get("RHYMERL_LAKE") or "lake"
    if "://" not in url and not os.path.isdir(url):
        raise ValueError(f"lake folder {url!r} does not exist; pass --lake PATH|s3://bucket/prefix "
                         "or set RHYMERL_LAKE")
    return url


def _plain(value: Any) -> Any:
    """A JSON-ready version of one Arrow value."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _cell(value: Any, short: bool = True) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}" if short else repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(_plain(value))
    return str(_plain(value))


def format_rows(rows: list[dict[str, Any]], columns: list[str], fmt: str) -> str:
    """Render rows as an aligned text table, CSV (header first) or a JSON array of objects."""
    if fmt == "json":
        return json.dumps([{c: _plain(r[c]) for c in columns} for r in rows])
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_cell(r[c], short=False) for c in columns] for r in rows)
        return out.getvalue().rstrip("\n")
    cells = [[_cell(r[c]) for c in columns] for r in rows]
    cells = [[v if len(v) <= _CELL else v[:_CELL - 1] + "…" for v in line] for line in cells]
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r[c], (int, float, decimal.Decimal)) or r[c] is None for r in rows)
               for c in columns]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    body = [line(columns), line(["-" * w for w in widths])] + [line(v) for v in cells]
    return "\n".join(body + [f"({len(rows)} row{'s' if len(rows) != 1 else ''})"])


def print_table(table: Any, fmt: str) -> None:
    print(format_rows(table.to_pylist(), table.column_names, fmt))


def guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a subcommand: lake warnings to stderr, known errors as one line and exit code 2."""

    def run(args: argparse.Namespace) -> int:
        from storage.lake import LakeError, SchemaError  # here, so `rhymerl --help` answers at once

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                code = command(args)
            except (LakeError, SchemaError, ValueError) as exc:  # QueryError is a ValueError
                code = 2
                print(f"error: {exc}", file=sys.stderr)
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        return code

    return run


def add_lake_options(parser: argparse.ArgumentParser) -> None:
    """`--lake` and `--format`, the options every lake-reading subcommand takes."""
    parser.add_argument("--lake", metavar="URL",
                        help="lake folder or s3://bucket/prefix (default: $RHYMERL_LAKE, else ./lake); "
                             "S3 uses the standard AWS env/config and AWS_ENDPOINT_URL")
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="output: aligned table (default), csv with a header, or a JSON array")


__all__ = ["FORMATS", "add_lake_options", "format_rows", "guarded", "lake_url", "print_table"]


def run_alone(register: Callable[[Any], None], argv: list[str] | None = None) -> int:
    """Run the commands one `register(subparsers)` adds, without the rest of `rhymerl` (a module's
    `python -m cli.NAME ...` entry, and its tests)."""
    parser = argparse.ArgumentParser(prog="rhymerl")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
