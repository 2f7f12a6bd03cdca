"""`rhymerl spec replay`: the acceptance HistoSpec would have reached on a run's recorded responses.

    rhymerl spec replay --lake lake --run rhymerl-20261202-1 --epochs 1,2 --set max_budget=32

One query reads the run's responses from the lake; each setting (`rhymerl.histospec.offline.tuning.SETTINGS`,
overrides on top) replays them through the drafter with the recorded next tokens as the model's
choices (`rhymerl.histospec.offline.replay`). No model runs. `cli/main.py` calls `register(subparsers)`;
lake URL, formats, warnings and exit codes (2: error, message says what to fix) are those of
`rhymerl lake`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from cli.common import add_lake_options, format_rows, guarded, lake_url

if TYPE_CHECKING:  # the module itself loads on first use (keeps `rhymerl --help` quick)
    from rhymerl.histospec.offline.tuning import RecoveredPrompts

RESPONSES_SQL = """
SELECT prompt_id, epoch, step, sample_idx, response_token_ids, reward
FROM rollouts
WHERE run_id = $run AND ($last IS NULL OR epoch <= $last)
ORDER BY prompt_id, epoch, sample_idx
"""
EPOCHS_SQL = "SELECT DISTINCT epoch FROM rollouts WHERE run_id = $run ORDER BY epoch"
PROMPTS_SQL = """
SELECT prompt_id, any_value(prompt_text) AS prompt_text
FROM rollouts WHERE run_id = $run GROUP BY prompt_id
"""
CONFIG_SQL = "SELECT config_json FROM runs WHERE run_id = $run ORDER BY updated_at DESC LIMIT 1"
RUNS_SQL = """
SELECT run_id, count(DISTINCT epoch) AS epochs, count(*) AS responses
FROM rollouts GROUP BY run_id ORDER BY run_id
"""
_MAX_LISTED = 20  # runs named in an unknown-run error


def _epochs(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return sorted({int(e) for e in text.split(",")})
    except ValueError:
        raise ValueError(f"--epochs {text!r}: use comma-separated epoch numbers, e.g. 0,1,2") from None


def _nothing_to_replay(lake: Any, url: str, run_id: str, epochs: list[int] | None) -> ValueError:
    """The error for a query that found no responses: which runs and epochs the lake does hold."""
    runs = lake.sql(RUNS_SQL).to_pylist()
    if not runs:
        return ValueError(f"lake {url} has no committed rollouts; point --lake at a run's lake")
    if any(r["run_id"] == run_id for r in runs):
        present = lake.sql(EPOCHS_SQL, {"run": run_id}).column("epoch").to_pylist()
        return _missing_epochs(present, run_id, epochs) or ValueError(f"run {run_id!r} has no responses")
    listed = ", ".join(f"{r['run_id']} ({r['epochs']} epochs, {r['responses']} responses)"
                       for r in runs[:_MAX_LISTED])
    more = f", and {len(runs) - _MAX_LISTED} more" if len(runs) > _MAX_LISTED else ""
    return ValueError(f"run {run_id!r} is not in lake {url}; runs found: {listed}{more}")


def _missing_epochs(present: list[int], run_id: str, epochs: list[int] | None) -> ValueError | None:
    missing = sorted(set(epochs or ()) - set(present))
    if not missing:
        return None
    return ValueError(f"run {run_id!r} has no responses in epoch {missing[0]}; epochs with "
                      f"responses: {', '.join(map(str, present))}")


def _prompts(lake: Any, run_id: str) -> RecoveredPrompts:
    """The run's prompts as token ids (`rhymerl.histospec.offline.tuning`), with a console line saying how
    many were recovered."""
    from rhymerl.histospec.offline.tuning import RecoveredPrompts, recover_prompts, run_tokenizer

    texts = {r["prompt_id"]: r["prompt_text"] for r in lake.sql(PROMPTS_SQL, {"run": run_id}).to_pylist()}
    config = lake.sql(CONFIG_SQL, {"run": run_id}).column("config_json").to_pylist()
    tokenizer = run_tokenizer(config[0] if config else None)
    if isinstance(tokenizer, str):
        return RecoveredPrompts({}, len(texts), tokenizer, no_tokenizer=True)
    return recover_prompts(texts, *tokenizer)


def cmd_replay(args: argparse.Namespace) -> int:
    from tqdm import tqdm  # imports here keep `rhymerl --help` quick (the drafter loads numpy)

    from rhymerl.histospec.offline.replay import replay
    from rhymerl.config.spec import SuffixUnavailable, require_arctic_inference
    from rhymerl.histospec.offline.tuning import (COLUMNS, SUFFIX_ARMS, default_settings, records_from_columns,
                                          replay_configs, report_rows)
    from storage.lake import Lake

    names, note = (args.settings, "") if args.settings else default_settings()
    configs = replay_configs(names, args.set or ())  # bad settings fail before any I/O
    if any(c.method == "suffix" for c in configs.values()):
        try:
            require_arctic_inference()
        except SuffixUnavailable as exc:
            raise ValueError(str(exc)) from None
    if note:
        print(note, file=sys.stderr)
    wanted = _epochs(args.epochs)
    url = lake_url(args)
    with Lake(url) as lake:
        table = lake.sql(RESPONSES_SQL, {"run": args.run, "last": max(wanted) if wanted else None})
        if table.num_rows == 0:
            raise _nothing_to_replay(lake, url, args.run, wanted)
        prompts = None if args.without_prompts else _prompts(lake, args.run)
    if prompts is not None:
        print(prompts.describe(), file=sys.stderr)
    records = records_from_columns(table.to_pydict(), prompts.token_ids if prompts else None)
    present = sorted({r.epoch for r in records})
    error = _missing_epochs(present, args.run, wanted)
    if error:
        raise error
    num_prompts = len({r.prompt_id for r in records})
    reports = {}
    with tqdm(total=num_prompts * len(configs), desc="replay", unit="prompt", file=sys.stderr,
              disable=True if args.format != "table" else None) as bar:  # None: only on a terminal
        for name, config in configs.items():
            bar.set_postfix_str(name)
            reports[name] = replay(records, config, wanted, on_prompt=bar.update, arm=SUFFIX_ARMS.get(name))
    rows = report_rows(reports)
    if args.format == "table":
        rows = [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in rows]
        print(f"run {args.run}: {num_prompts} prompts, {len(records)} responses in epochs "
              f"{', '.join(map(str, present))}; replayed epochs {', '.join(map(str, wanted or present))}")
    print(format_rows(rows, list(COLUMNS), args.format))
    return 0


def register(subparsers: Any) -> None:
    """Add `spec` with `replay` to a `rhymerl` subparsers object."""
    spec = subparsers.add_parser("spec", help="HistoSpec (speculative rollouts) offline tools",
                                 description="Tune HistoSpec on recorded rollouts, without a model.")
    sub = spec.add_subparsers(dest="spec_command", required=True)
    rep = sub.add_parser(
        "replay", help="acceptance each drafter setting would have reached on a run's responses",
        description="Replay a run's recorded responses through the drafter (the recorded next tokens "
                    "act as the model's choices) and report the acceptance per setting and epoch: "
                    "mean accepted length (tokens per verification step, counting the bonus token) "
                    "and acceptance rate (accepted / drafted draft tokens). Each response replays "
                    "after its prompt, as the engine ran it: the lake keeps the prompt's text, which "
                    "is encoded again with the run's tokenizer and kept where it hashes to the "
                    "recorded prompt_id.")
    rep.add_argument("--run", required=True, metavar="RUN_ID", help="the run whose responses to replay")
    rep.add_argument("--epochs", metavar="E,E,...",
                     help="report only these epochs, e.g. 1,2 (earlier epochs still serve as history; "
                          "default: all)")
    rep.add_argument("--settings", action="extend", nargs="+", metavar="NAME",
                     help="settings to replay (default: all of rhymerl.histospec.offline.tuning.SETTINGS: "
                          "histospec, its variants, ngram, and vLLM's suffix decoding with a stock global "
                          "cache (suffix), one cache per prompt holding HistoSpec's history (suffix-prompt) "
                          "and a cache of about one step of responses (suffix-step); an unknown name "
                          "lists them)")
    rep.add_argument("--set", action="extend", nargs="+", metavar="KEY=VALUE",
                     help="override a SpecConfig field in every setting, e.g. --set max_budget=32 "
                          "min_match=2 (values parse as TOML)")
    rep.add_argument("--without-prompts", action="store_true",
                     help="replay every response without its prompt (a response's first tokens are then "
                          "drafted from its own tokens only)")
    add_lake_options(rep)
    rep.set_defaults(func=guarded(cmd_replay))

