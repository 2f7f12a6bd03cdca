"""`rhymerl lake`: SQL over the rollout lake, a summary of what it holds, and verify/quarantine.

    rhymerl lake sql "SELECT epoch, avg(reward) FROM rollouts GROUP BY epoch" --format json
    rhymerl lake summary --lake s3://bucket/prefix
    rhymerl lake verify --quarantine

`cli/main.py` calls `register(subparsers)`; each subcommand sets `func(args) -> exit code`.
The lake is `--lake URL`, else $RHYMERL_LAKE, else ./lake. Results go to stdout; warnings
(committed rows left out) and errors go to stderr. Exit codes: 0 ok, 1 verify found problems
it did not quarantine, 2 error (message says what to fix).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.common import add_lake_options, guarded, lake_url, print_table, run_alone


def _open(args: argparse.Namespace) -> Any:
    from storage.lake import Lake

    return Lake(lake_url(args), on_damaged="skip" if getattr(args, "skip_damaged", False) else "error")


def _params(pairs: list[str] | None) -> dict[str, Any] | None:
    if not pairs:
        return None
    params = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--param {pair!r}: use NAME=VALUE, referenced as $NAME in the query")
        try:
            params[name] = json.loads(raw)
        except ValueError:
            params[name] = raw  # a bare word is a string
    return params


def cmd_sql(args: argparse.Namespace) -> int:
    with _open(args) as lake:
        print_table(lake.sql(args.query, _params(args.param)), args.format)
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    with _open(args) as lake:
        table = lake.summary()
        print_table(table, args.format)
        if args.format == "table":
            rows = table.to_pylist()
            runs = len({r["run_id"] for r in rows})
            responses = sum(r["responses"] or 0 for r in rows)
            size = sum(r["bytes"] or 0 for r in rows)
            [evals] = lake.sql("SELECT count(DISTINCT (run_id, epoch)) AS n, count(*) AS samples FROM evals").to_pylist()
            print(f"lake {lake.url}: {runs} run(s), {len(lake.manifests())} committed step(s), "
                  f"{responses} responses, {size / 1e6:.1f} MB committed; {evals['n']} held-out evaluation(s) "
                  f"of {evals['samples']} samples (table evals)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from storage.verify import verify_lake

    grace = {} if args.grace is None else {"grace_s": args.grace}
    report = verify_lake(lake_url(args), quarantine=args.quarantine, deep=not args.quick, **grace)
    if args.format == "json":
        print(json.dumps({"url": report.url, "manifests": report.manifests,
                          "files_checked": report.files_checked, "hashed": report.hashed,
                          "quarantined_before": report.quarantined_before, "clean": report.clean,
                          "findings": report.table().to_pylist()}))
    elif report.findings or args.format == "csv":
        print_table(report.table(), args.format)
    if args.format == "table":
        pending = len(report.findings) - len(report.problems)
        print(f"checked {report.manifests} manifest(s) and {report.files_checked} committed data "
              f"file(s) ({'hashed' if report.hashed else 'sizes only'}): {len(report.problems)} "
              f"problem(s), {pending} pending; {report.quarantined_before} quarantined earlier")
        if not report.clean:
            print("run again with --quarantine to move the problems aside under _quarantine/")
    return 0 if report.clean else 1


def register(subparsers: Any) -> None:
    """Add `lake` with `sql`, `summary` and `verify` to a `rhymerl` subparsers object."""
    lake = subparsers.add_parser(
        "lake", help="query and check the rollout lake (Parquet + DuckDB)",
        description="SQL over the committed contents of a rollout lake, a summary, and checks.")
    sub = lake.add_subparsers(dest="lake_command", required=True)

    sql = sub.add_parser(
        "sql", help="run a DuckDB SQL query over the lake's views",
        description="Run DuckDB SQL over the committed data. Views: rollouts, steps, runs, evals, lake_files, "
                    "lake_summary, length_by_epoch, rhyme, rhyme_epochs, length_rank_stability; table "
                    "macros: rhyme_by_response(k), rhyme_by_prompt(k), rhyme_by_epoch(k), "
                    "length_rank_moves(pct), length_rank_stability_at(pct), length_histogram(width), "
                    "previous_responses(run, epoch), prompt_history(run, epoch, k), "
                    "length_forecast(run, epoch). "
                    "Docs: storage/README.md.")
    sql.add_argument("query", help='SQL text, e.g. "SELECT epoch, avg(reward) FROM rollouts GROUP BY epoch"')
    sql.add_argument("--param", action="append", metavar="NAME=VALUE",
                     help="bind $NAME in the query (VALUE parsed as JSON, else a string); repeatable")
    sql.add_argument("--skip-damaged", action="store_true",
                     help="leave out missing or truncated committed files (with a warning) instead of failing")
    add_lake_options(sql)
    sql.set_defaults(func=guarded(cmd_sql))

    summary = sub.add_parser(
        "summary", help="runs, epochs, committed steps, responses and bytes; held-out evaluations",
        description="One row per run and epoch, from the step manifests (reads no data file).")
    summary.add_argument("--skip-damaged", action="store_true",
                         help="leave out missing or truncated committed files instead of failing")
    add_lake_options(summary)
    summary.set_defaults(func=guarded(cmd_summary))

    verify = sub.add_parser(
        "verify", help="find damaged files, broken manifests and leftovers; --quarantine moves them",
        description="Report committed data files that are missing, truncated or corrupt (SHA-256), "
                    "unreadable manifests, and files no manifest lists (leftovers of failed attempts). "
                    "Exit code 1 if problems remain.")
    verify.add_argument("--quarantine", action="store_true",
                        help="move every problem aside under _quarantine/ (healthy committed files "
                             "are never touched); readers then leave those rows out with a warning")
    verify.add_argument("--quick", action="store_true",
                        help="check committed files by size only (no read and SHA-256 of every file)")
    verify.add_argument("--grace", type=float, metavar="SECONDS",
                        help="uncommitted files younger than this may belong to a running writer: "
                             "report them as pending and never move them (default: 3600)")
    add_lake_options(verify)
    verify.set_defaults(func=guarded(cmd_verify))


def main(argv: list[str] | None = None) -> int:
    """`python -m cli.lake lake ...`: the same commands without the rest of `rhymerl`."""
    return run_alone(register, argv)


if __name__ == "__main__":
    sys.exit(main())
