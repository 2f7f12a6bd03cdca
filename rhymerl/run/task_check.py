"""Input checks of the task a run trains on: its data, chat template, reward functions and evaluation set.

Part of the run's preflight (`rhymerl.run.preflight.check_dataset`): everything here reads files
(and the dataset's URLs) only, so a bad task stops `rhymerl run` in seconds, before any server
starts. Each problem is one `(area, message)`, the message naming the setting and the fix:

* reward: `load_reward_set` (each of reward.functions exists, imports, has the function, takes
  (prompt, completion, row); built-in names; reward.weights). A plug-in is also called once, on the
  first training row with an empty completion (`RewardSet.check`); the built-ins are not (math
  would import SymPy: seconds), their gold answers are checked row by row instead.
* dataset / eval: every row of data.dataset and eval.dataset (`scan_problems`: readable, the
  prompt and answer columns, prompt cells, chat messages, gsm8k answers), and the .jinja file of
  data.chat_template.
* the chat template renders the first row of each set that uses it, with the tokenizer prompts are
  rendered with: the built-in model's (made in code, so no model build is needed) or model.path's.
  A model.path tokenizer is loaded as a fast tokenizer (importing AutoTokenizer alone takes
  seconds more; chat templates render the same); one that does not load that way (no
  tokenizer.json, or broken: the model check reports that) skips this check, and the run renders
  at start.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from rhymerl.config.run import RunConfig
from rhymerl.config.task import Source
from rhymerl.data.chat import check_render
from rhymerl.data.datasets import load_problems, scan_problems
from rhymerl.data.prompts import PromptRenderer, prompt_renderer
from rhymerl.data.records import Problem
from rhymerl.data.rewards import RewardSet, load_reward_set
from rhymerl.errors import ConfigError

OptionsOf = Callable[[Source], Mapping[str, Any]]  # a source's fsspec settings (storage.fs.source_options)


def task_problems(cfg: RunConfig, options_of: OptionsOf | None = None) -> list[tuple[str, str]]:
    """Every problem with the run's task, as (area, message); [] = the task is usable."""
    options_of = options_of or (lambda source: {})
    found: list[tuple[str, str]] = []
    rewards = renderer = None
    try:
        rewards = load_reward_set(cfg.reward.functions, cfg.reward.weights, cfg.data.answer_key)
    except ConfigError as exc:
        found.append(("reward", str(exc)))
    try:
        renderer = prompt_renderer(cfg.data)
    except ConfigError as exc:
        found.append(("dataset", str(exc)))
    sets: list[tuple[str, str, list[Problem]]] = []  # (area, key, its good rows' problems)
    for area, key, source, count in _sources(cfg):
        problems, errors = scan_problems(cfg.data, cfg.reward, source=source, num_prompts=count,
                                         storage_options=options_of(source), key=key)
        found += [(area, m) for m in errors]
        if not problems and not errors:  # a built-in task: check one of its generated prompts
            problems = load_problems(cfg.data, cfg.reward, source=source, num_prompts=1, key=key)
        if problems:
            sets.append((area, key, problems))
    if renderer is None:
        return found
    rendered, chat_found = _chat_problems(cfg, renderer, sets)
    found += chat_found
    if rewards is not None and sets and sets[0][1] == "data.dataset" and sets[0][2]:
        first = sets[0][2][0]
        found += _reward_problems(rewards, rendered.get("data.dataset", str(first.question)), first)
    return found


def _sources(cfg: RunConfig) -> list[tuple[str, str, Source, int]]:
    """(area, key, source, number of prompts) of the training data and, when on, the evaluation set."""
    found = [("dataset", "data.dataset", cfg.data.dataset, cfg.data.num_prompts)]
    if cfg.eval.enabled:
        found.append(("eval", "eval.dataset", cfg.eval.dataset, cfg.eval.num_prompts))
    return found


def _chat_problems(cfg: RunConfig, renderer: PromptRenderer,
                   sets: list[tuple[str, str, list[Problem]]]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """({key: first row's prompt text}, problems): rows that need a chat template under
    data.chat_template = 'none' (every row: no tokenizer is needed), then the first chat row of each
    set rendered with the real tokenizer."""
    found: list[tuple[str, str]] = []
    texts: dict[str, str] = {}
    chat: list[tuple[str, str, Problem]] = []
    for area, key, problems in sets:
        first_chat = next((p for p in problems if renderer.uses_chat(p.question)), None)
        if first_chat is None:
            texts[key] = renderer.text(None, problems[0].question, key) if problems else ""
        elif renderer.chat.mode == "none":
            try:
                renderer.text(None, first_chat.question, f"{key} row {first_chat.index} (0-based)")
            except ConfigError as exc:
                found.append((area, str(exc)))
        else:
            chat.append((area, key, first_chat))
    if not chat:
        return texts, found
    tokenizer = _tokenizer(cfg.model.path)
    if tokenizer is None:
        return texts, found
    for area, key, problem in chat:
        where = f"data.chat_template = {cfg.data.chat_template!r} on {key} row {problem.index} (0-based)"
        try:
            texts[key] = check_render(renderer.chat, tokenizer, problem.question, where)
        except ConfigError as exc:
            found.append((area, str(exc)))
    return texts, found


def _tokenizer(model_path: str) -> Any | None:
    """The tokenizer prompts are rendered with (module docstring), or None when it does not load fast."""
    from rhymerl.data.chat import install_default_chat_template
    from rhymerl.policy.tokenizer import builtin_tokenizer, is_builtin_model

    if not model_path:
        return builtin_tokenizer()
    from transformers import PreTrainedTokenizerFast

    try:
        tok = PreTrainedTokenizerFast.from_pretrained(model_path)
    except Exception:  # the model check names what is wrong with the folder's tokenizer
        return None
    if is_builtin_model(model_path):
        install_default_chat_template(tok)
    return tok


def _reward_problems(rewards: RewardSet, prompt: str, problem: Problem) -> list[tuple[str, str]]:
    """A plug-in that fails on the first row with an empty completion (`RewardSet.check`)."""
    plugins = [(f, w) for f, w in zip(rewards.functions, rewards.weights) if f.kind != "builtin"]
    if not plugins:
        return []
    only = RewardSet(tuple(f for f, _ in plugins), tuple(w for _, w in plugins), rewards.answer_key)
    try:
        only.check(prompt, problem.row, prompt_id=f"data.dataset row {problem.index}")
    except ConfigError as exc:
        return [("reward", str(exc))]
    return []
