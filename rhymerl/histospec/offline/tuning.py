"""Offline tuning for `rhymerl spec replay`, minus its I/O: named settings (`SETTINGS`: the
`SpecConfig` fields each changes; `SUFFIX_ARMS` for suffix settings), `key=value` overrides applied to
every setting, the rows a replay reports, and `recover_prompts`: prompt token ids re-encoded from the
lake's text, kept only where `prompt_id_of(ids)` equals the recorded `prompt_id`.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rhymerl.errors import ConfigError
from rhymerl.histospec.offline.replay import RecordedResponse, ReplayReport, SuffixArm
from rhymerl.config.spec import INSTALL_HINT, SpecConfig, has_arctic_inference
from rhymerl.data.records import prompt_id_of

Encode = Callable[[str], list[int]]

# name -> SpecConfig fields changed from the defaults (the budget cap of "additive" is 32)
SETTINGS: dict[str, dict[str, Any]] = {
    "histospec": {},
    "histospec-additive": {"budget_rule": "additive", "max_budget": 32},
    "histospec-no-siblings": {"siblings": False},
    "siblings-only": {"history_epochs": 0, "recent_responses": 0, "prompt_lookup": False},
    "histospec-tree": {"recent_responses": 512},  # with the cross-prompt tree of recent responses
    "histospec-reward": {"reward_weighted": True},
    "ngram": {"method": "ngram"},
    # vLLM's suffix decoding (Arctic Inference) at its stock settings, in the cache scopes of SUFFIX_ARMS
    "suffix": {"method": "suffix"},
    "suffix-prompt": {"method": "suffix"},
    "suffix-step": {"method": "suffix"},
}
# Each suffix setting's cache (`SuffixArm`): the stock global one, one per prompt, the last step's responses.
SUFFIX_ARMS: dict[str, SuffixArm] = {
    "suffix": SuffixArm(),
    "suffix-prompt": SuffixArm(scope="prompt"),
    "suffix-step": SuffixArm(cache_steps=1.0),
}
ENGINE_ONLY = ("enabled", "verifier", "cost_aware", "warm_start_run", "warm_start_lake")  # replay never reads these
COLUMNS = ("setting", "epoch", "mean_accepted_length", "acceptance_rate", "steps", "tokens",
           "drafted", "accepted")


def replay_keys() -> list[str]:
    """The SpecConfig fields an override may set."""
    return [f.name for f in dataclasses.fields(SpecConfig) if f.name not in ENGINE_ONLY]


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs (optional `spec.` prefix; values TOML, else a string) as fields. Raises
    ConfigError naming the key for an unknown key or a value of the wrong type."""
    keys, defaults = replay_keys(), SpecConfig()
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().removeprefix("spec.")
        if not sep:
            raise ConfigError(f"override {pair!r} must look like key=value, e.g. max_budget=32")
        if key not in keys:
            raise ConfigError(f"unknown config key 'spec.{key}'; allowed keys: {', '.join(keys)}")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()  # a bare word is a string
        expected = type(getattr(defaults, key))
        if type(value) is not expected:  # `is`, not isinstance: True is not an int here
            raise ConfigError(f"config key 'spec.{key}': expected {expected.__name__}, got {value!r}")
        out[key] = value
    return out


def default_settings() -> tuple[list[str], str]:
    """Every setting, less those needing Arctic Inference's trees when it is not installed, and a note
    ("" if none) on what was left out."""
    if has_arctic_inference():
        return list(SETTINGS), ""
    needs = [n for n in SETTINGS if SpecConfig(**SETTINGS[n]).needs_arctic_inference]
    return [n for n in SETTINGS if n not in needs], f"note: settings {', '.join(needs)} skipped: {INSTALL_HINT}"


def replay_configs(names: Sequence[str] | None = None,
                   overrides: Sequence[str] = ()) -> dict[str, SpecConfig]:
    """The named settings (all of `SETTINGS` when `names` is empty) with `overrides` on each."""
    unknown = [n for n in names or () if n not in SETTINGS]
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]!r}; known settings: {', '.join(SETTINGS)}")
    extra = parse_overrides(overrides)
    configs = {name: SpecConfig(**{**SETTINGS[name], **extra}) for name in names or SETTINGS}
    lacking = [n for n, c in configs.items() if c.needs_arctic_inference and c.method != "suffix"]
    if lacking and not has_arctic_inference():  # the suffix settings are checked by the caller
        raise ConfigError(f"settings {', '.join(lacking)} draft from the cross-prompt tree "
                          f"(spec.recent_responses > 0), which needs {INSTALL_HINT}; or --set recent_responses=0")
    return configs


def records_from_columns(columns: Mapping[str, Sequence[Any]],
                         prompts: Mapping[str, tuple[int, ...]] | None = None) -> list[RecordedResponse]:
    """Recorded responses from lake columns `prompt_id`, `epoch`, `response_token_ids`, `reward` and,
    if present, `step`, in the given order (NULL reward: 0; NULL tokens: empty). `prompts`
    (`recover_prompts`): a response whose prompt is not there replays without one."""
    steps = columns.get("step") or [0] * len(columns["prompt_id"])
    prompts = prompts or {}
    return [RecordedResponse(str(pid), int(epoch), tuple(int(t) for t in tokens or ()),
                             float(reward or 0.0), prompt_token_ids=prompts.get(str(pid), ()),
                             step=int(step or 0))
            for pid, epoch, tokens, reward, step in zip(columns["prompt_id"], columns["epoch"],
                                                        columns["response_token_ids"], columns["reward"],
                                                        steps)]


def report_rows(reports: Mapping[str, ReplayReport]) -> list[dict[str, Any]]:
    """One row per (setting, epoch) and an `epoch = "all"` row per setting, with `COLUMNS`."""
    rows = []
    for name, report in reports.items():
        for epoch, stats in [*sorted(report.per_epoch.items()), ("all", report.overall())]:
            rows.append({"setting": name, "epoch": epoch,
                         "mean_accepted_length": stats.mean_accepted_length,
                         "acceptance_rate": stats.acceptance_rate, "steps": stats.steps,
                         "tokens": stats.tokens, "drafted": stats.drafted, "accepted": stats.accepted})
    return rows


@dataclass(frozen=True)
class RecoveredPrompts:
    """Token ids by prompt id, for the prompts whose ids could be recovered exactly."""
    token_ids: dict[str, tuple[int, ...]]
    missing: int  # prompts whose text did not encode to their recorded id (or had no text)
    source: str  # the tokenizer used, in words; or, with none, why (`no_tokenizer`)
    no_tokenizer: bool = False

    def describe(self) -> str:
        """One line for the console."""
        total = len(self.token_ids) + self.missing
        if self.no_tokenizer:
            return f"all {total} prompts replay without their prompt tokens: {self.source}"
        line = f"prompt tokens recovered for {len(self.token_ids)} of {total} prompts ({self.source})"
        if self.missing:
            line += ("; the others replay without their prompt (their text does not encode to their "
                     "recorded prompt_id with this tokenizer)")
        return line


def run_tokenizer(config_json: str | None) -> tuple[Encode, str] | str:
    """(encoder, name) a run tokenized its prompts with, or why none: its `model.path` if readable here
    (relative to the current folder), else the built-in byte-level tokenizer."""
    try:
        config = json.loads(config_json or "{}")
        model_path = str(((config or {}).get("model") or {}).get("path") or "")
    except (ValueError, AttributeError):
        return "the run's recorded config has no readable model section"
    if model_path:
        if not Path(model_path).is_dir():
            return f"the run's model.path {model_path} is not a folder here (run from where the run was)"
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model_path)
        except Exception as exc:  # any failure here only costs the prompts, never the replay
            return f"the tokenizer of the run's model.path {model_path} did not load ({type(exc).__name__})"
        return (lambda s: tok.encode(s, add_special_tokens=False)), f"the tokenizer of {model_path}"
    from rhymerl.policy.build import build_tokenizer

    tok = build_tokenizer()
    return (lambda s: tok.encode(s, add_special_tokens=False)), "the built-in byte-level tokenizer"


def recover_prompts(texts: Mapping[str, str | None], encode: Encode, source: str) -> RecoveredPrompts:
    """Encode each `texts` prompt (prompt_id -> rendered text); keep ids whose `prompt_id_of` matches."""
    found: dict[str, tuple[int, ...]] = {}
    for pid, text in texts.items():
        ids = tuple(int(t) for t in encode(text)) if text else ()
        if ids and prompt_id_of(ids) == pid:
            found[pid] = ids
    return RecoveredPrompts(found, len(texts) - len(found), source)
