"""Problems to prompts: each problem's prompt cell rendered to text, tokenized, and given its id.

How a cell becomes text (`PromptRenderer`):

* text, with no `data.system_prompt`: `data.prompt_template` with every literal ``{question}``
  replaced by the text (other braces stay as written, so braces in questions are safe);
* a list of chat messages, or any cell when a system prompt is set: the chat template of
  `data.chat_template` (`rhymerl.data.chat.ChatRenderer`, ``add_generation_prompt=True``).

The text is tokenized without special tokens (a chat template writes its own) and the prompt's id
is `prompt_id_of(token ids)`, so equal prompts share history in HistoSpec and HistoPipe whatever
rendered them. `load_tokenizer` loads a model's tokenizer as prompts are rendered with it: a
built-in model's tokenizer has no chat template, so it gets `DEFAULT_CHAT_TEMPLATE`.

The run's entry point, shared by training and evaluation (`eval.dataset` with `eval.num_prompts`)::

    problems = load_problems(cfg.data, cfg.reward, source=..., num_prompts=..., storage_options=...)
    prompts, skipped = render_prompts(problems, prompt_renderer(cfg.data), load_tokenizer(model_dir),
                                      max_prompt_tokens, cfg.data.on_long_prompt)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from rhymerl.config.task import DataConfig
from rhymerl.data.chat import ChatRenderer, make_renderer
from rhymerl.data.datasets import DatasetError
from rhymerl.data.records import Problem, Prompt, prompt_id_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptRenderer:
    """How prompt cells become text (module docstring); plain data, it pickles into any process."""

    template: str = "{question}\n"  # data.prompt_template
    chat: ChatRenderer = field(default_factory=ChatRenderer)

    def uses_chat(self, cell: Any) -> bool:
        """Whether `cell` goes through the chat template (a message list, or a system prompt is set)."""
        return not isinstance(cell, str) or bool(self.chat.system_prompt)

    def text(self, tokenizer: Any, cell: Any, where: str) -> str:
        """The prompt text of one cell; ConfigError naming `where` when the chat template cannot render it."""
        if not self.uses_chat(cell):
            return self.template.replace("{question}", cell)
        return self.chat.render(tokenizer, cell, where)


def prompt_renderer(data: DataConfig, base_dir: str | Path | None = None) -> PromptRenderer:
    """The renderer of `data`'s settings; a relative .jinja path is taken from `base_dir` (default:
    the current directory). ConfigError naming data.chat_template when the file is missing or empty."""
    return PromptRenderer(data.prompt_template, make_renderer(data.chat_template, data.system_prompt, base_dir))


def load_tokenizer(model_dir: str | Path) -> Any:
    """The tokenizer of `model_dir` (transformers' AutoTokenizer), given `DEFAULT_CHAT_TEMPLATE`
    when the folder is a built-in model (which has no chat template of its own)."""
    from transformers import AutoTokenizer

    from rhymerl.data.chat import install_default_chat_template
    from rhymerl.policy.tokenizer import is_builtin_model

    tok = AutoTokenizer.from_pretrained(model_dir)
    if is_builtin_model(model_dir):
        install_default_chat_template(tok)
    return tok


def render_prompts(
    problems: Sequence[Problem],
    renderer: PromptRenderer,
    tokenizer: Any,
    max_prompt_tokens: int,
    on_long: Literal["skip", "error"],
) -> tuple[list[Prompt], list[Problem]]:
    """Render, tokenize (`tokenizer.encode(text, add_special_tokens=False)`) and split into (kept
    prompts, skipped problems).

    A prompt longer than `max_prompt_tokens` is skipped (`on_long="skip"`) or raises DatasetError
    (`"error"`). A prompt whose token ids equal an earlier kept prompt's would share its
    `prompt_id`, so it is dropped with a warning and returned among the skipped: kept and skipped
    together hold every input problem exactly once, in input order.
    """
    _check_render_args(max_prompt_tokens, on_long)
    kept: list[Prompt] = []
    skipped: list[Problem] = []
    first_index: dict[str, int] = {}  # prompt_id -> index of the problem that claimed it
    n_long = 0
    for problem in problems:
        text = renderer.text(tokenizer, problem.question, f"problem {problem.index}")
        token_ids = tuple(int(t) for t in tokenizer.encode(text, add_special_tokens=False))
        if not token_ids:
            raise DatasetError(f"problem {problem.index} encodes to zero tokens; check the tokenizer, "
                               "data.prompt_template and data.chat_template")
        if len(token_ids) > max_prompt_tokens:
            if on_long == "error":
                raise DatasetError(
                    f"problem {problem.index} is {len(token_ids)} prompt tokens, over the limit of "
                    f"{max_prompt_tokens}; set data.on_long_prompt='skip', shorten "
                    "data.prompt_template, or raise model.max_model_len"
                )
            skipped.append(problem)
            n_long += 1
            continue
        pid = prompt_id_of(token_ids)
        if pid in first_index:
            log.warning("problem %d renders to the same tokens as problem %d (prompt_id %s); "
                        "keeping problem %d only", problem.index, first_index[pid], pid,
                        first_index[pid])
            skipped.append(problem)
            continue
        first_index[pid] = problem.index
        kept.append(Prompt(prompt_id=pid, index=problem.index, text=text, token_ids=token_ids,
                           answer=problem.answer, row=problem.row))
    if n_long:
        log.warning("skipped %d of %d problems longer than %d prompt tokens",
                    n_long, len(problems), max_prompt_tokens)
    return kept, skipped


def _check_render_args(max_prompt_tokens: int, on_long: str) -> None:
    if max_prompt_tokens < 1:
        raise DatasetError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}; raise "
                           "model.max_model_len or lower rollout.max_tokens")
    if on_long not in ("skip", "error"):
        raise DatasetError(f"on_long must be 'skip' or 'error', got {on_long!r}")
