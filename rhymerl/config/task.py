"""The task a run trains on: its data (`data.*`), its reward functions (`reward.*`) and its held-out
evaluation (`eval.*`).

Only the checks that need no file are made here (a settings module reads nothing and imports
nothing heavy); whether the files, columns, reward functions and chat template are usable is
checked by the run's preflight (`rhymerl.run.preflight`) before anything starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rhymerl.config.fields import check
from rhymerl.config.options import option

BUILTIN_DATASETS = ("builtin", "builtin-long")
BUILTIN_REWARDS = ("gsm8k", "math")

Source = str | tuple[str, ...]  # one path / URL / glob, or a list of them


def source_entries(source: Source) -> tuple[str, ...]:
    """The entries of a data source setting (a single string is one entry)."""
    return (source,) if isinstance(source, str) else tuple(source)


@dataclass(frozen=True)
class DataConfig:
    """Training prompts: a built-in task, or rows from files, folders or URLs with any columns."""

    dataset: Source = option(
        "builtin", '"builtin" (the built-in task), "builtin-long" (its long-tail variant: configs/long-tail.toml), '
        "or rows: a .jsonl / .json / .parquet path, glob, s3:// URL or datasets.save_to_disk folder, or a list of "
        "them (docs/tasks.md)")
    prompt_key: str = option("question", "the column holding each prompt: text, or a list of chat messages "
                             '[{"role": ..., "content": ...}]', "a column of the data")
    answer_key: str = option("answer", "the column the built-in rewards (gsm8k, math) compare against; other "
                             "reward functions get the whole row", "a column of the data")
    num_prompts: int = option(128, "prompts per epoch: the first N after a seeded shuffle; 0 = every row", ">= 0")
    prompt_template: str = option("{question}\n", "how a text prompt becomes the prompt (without a chat "
                                  "template): {question} is replaced by the prompt column's text",
                                  "must contain {question}")
    system_prompt: str = option("", 'a system message put before each prompt (renders through the chat '
                                'template); "" = none')
    chat_template: str = option("auto", 'how chat messages (or a system prompt) become text: "auto" = the '
                                'tokenizer\'s template, "none" = no template (text prompts only), or a .jinja file',
                                '"auto", "none" or a path ending in .jinja')
    seed: int = option(0, "seed of the shuffle that picks the prompts")
    on_long_prompt: Literal["skip", "error"] = option(
        "skip", "a prompt longer than model.max_model_len - rollout.max_tokens: skip it (warned, counted) or stop")

    def __post_init__(self) -> None:
        check_source(self.dataset, "data.dataset")
        check(self.num_prompts >= 0, "data.num_prompts", "must be >= 1, or 0 for every row")
        check("{question}" in self.prompt_template, "data.prompt_template",
              "must contain the placeholder {question}")
        for key, value in (("data.prompt_key", self.prompt_key), ("data.answer_key", self.answer_key)):
            check(bool(value.strip()), key, "must name a column (e.g. 'question', 'prompt', 'answer')")
        check(self.chat_template in ("auto", "none") or self.chat_template.endswith(".jinja"), "data.chat_template",
              f"got {self.chat_template!r}; use 'auto', 'none' or a path to a .jinja file")
        check(not (self.chat_template == "none" and self.system_prompt), "data.system_prompt",
              "needs a chat template to render it; set data.chat_template='auto' (or a .jinja file) or "
              "data.system_prompt=''")

    @property
    def builtin(self) -> bool:
        """A built-in task (generated in code; no file)."""
        return isinstance(self.dataset, str) and self.dataset in BUILTIN_DATASETS


def check_source(source: Source, key: str) -> None:
    """A source setting holds at least one non-empty entry."""
    entries = source_entries(source)
    check(bool(entries) and all(e.strip() for e in entries), key,
          f"got {source!r}; give a path, URL or glob, or a list of them")


_FUNCTION_SPEC = re.compile(r"[A-Za-z_][\w.]*|.+:[A-Za-z_]\w*")


@dataclass(frozen=True)
class RewardConfig:
    """The reward: a weighted sum of functions, each built in or a plug-in (docs/tasks.md)."""

    functions: tuple[str, ...] = option(
        ("gsm8k",), 'reward functions: built-ins by name ("gsm8k": "#### <number>" answers; "math": '
        'mathematical equivalence via math-verify), "path/to/file.py:name" or "pkg.module:name", each called '
        "as name(prompt, completion, row)", "at least one")
    weights: tuple[float, ...] = option((), "one weight per function; [] = 1 each", "[] or one number per function")

    def __post_init__(self) -> None:
        check(len(self.functions) >= 1, "reward.functions", 'needs at least one function, e.g. ["gsm8k"]')
        for i, spec in enumerate(self.functions):
            check(_FUNCTION_SPEC.fullmatch(spec) is not None, f"reward.functions[{i}]",
                  f"{spec!r} is not a function: use a built-in name ({', '.join(BUILTIN_REWARDS)}), "
                  '"path/to/file.py:name" or "pkg.module:name"')
        check(not self.weights or len(self.weights) == len(self.functions), "reward.weights",
              f"has {len(self.weights)} weights for {len(self.functions)} functions; give one per function "
              "or [] for 1 each")

    @property
    def weight_list(self) -> tuple[float, ...]:
        """One weight per function (1 each when none are set)."""
        return self.weights or (1.0,) * len(self.functions)


@dataclass(frozen=True)
class EvalConfig:
    """A held-out set, sampled on the run's own engines before the first epoch, after the last and every
    `every_epochs`; never trained on and never part of HistoSpec's history."""

    dataset: Source = option("", 'held-out rows (the same sources and columns as data.dataset); "" = no evaluation')
    num_prompts: int = option(0, "prompts evaluated: the first N after data.seed's shuffle; 0 = every row", ">= 0")
    every_epochs: int = option(0, "also evaluate after every N-th epoch; 0 = only before the first and after "
                               "the last", ">= 0")
    n: int = option(1, "samples per prompt", ">= 1")
    temperature: float = option(0.0, "sampling temperature; 0 = greedy (nothing trains on these samples)", ">= 0")
    max_tokens: int = option(0, "most tokens per response; 0 = rollout.max_tokens", ">= 0")

    def __post_init__(self) -> None:
        if self.dataset:
            check_source(self.dataset, "eval.dataset")
        check(self.num_prompts >= 0, "eval.num_prompts", "must be >= 1, or 0 for every row")
        check(self.every_epochs >= 0, "eval.every_epochs", "must be >= 0 (0: before the first and after the last)")
        check(self.n >= 1, "eval.n", "must be >= 1")
        check(self.temperature >= 0, "eval.temperature", "must be >= 0 (0 = greedy)")
        check(self.max_tokens >= 0, "eval.max_tokens", "must be >= 0 (0 = rollout.max_tokens)")

    @property
    def enabled(self) -> bool:
        return bool(self.dataset)

    def due_after(self, epoch: int, epochs: int) -> bool:
        """Whether to evaluate after epoch `epoch` (0-based) of `epochs` (the first evaluation, before
        epoch 0, is always made when evaluation is on)."""
        if not self.enabled:
            return False
        last = epoch == epochs - 1
        return last or (self.every_epochs > 0 and (epoch + 1) % self.every_epochs == 0)
