"""The prompts a run's responses answered, as token ids: recovered from the lake for offline replay.

The lake keeps each response's rendered prompt text and `prompt_id = prompt_id_of(token ids)`, not
the ids themselves. The engine drafts with the prompt in the context (a response's first tokens
follow the prompt's last ones, and vLLM's `suffix` method drafts from the prompt too), so a replay
without the prompt under-reports every drafter, the first tokens of each response most. Here the
text is encoded again with the run's tokenizer; an id is kept only when its hash equals the
recorded `prompt_id`, so a recovered prompt is exactly what the engine saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from rhymerl.data.records import prompt_id_of

Encode = Callable[[str], list[int]]


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
    """The encoder a run tokenized its prompts with (from its recorded config) and its name, or
    why there is none: the run's `model.path` if it is readable here (a relative path from the
    current folder), else the built-in byte-level tokenizer (every built-in task's)."""
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
    """Encode each prompt id's text (`texts`: prompt_id -> rendered prompt) and keep the ids whose
    hash is the prompt id (`rhymerl.data.records.prompt_id_of`, as `rhymerl.data.datasets.render_prompts` made it)."""
    found: dict[str, tuple[int, ...]] = {}
    for pid, text in texts.items():
        ids = tuple(int(t) for t in encode(text)) if text else ()
        if ids and prompt_id_of(ids) == pid:
            found[pid] = ids
    return RecoveredPrompts(found, len(texts) - len(found), source)
