"""Prompt rendering: a row's prompt cell (text or chat messages) to the text the engine is given.

The prompt column holds either text or a list of chat messages ``[{"role": ..., "content": ...}]``
(roles user, system, assistant, tool; content a string; other keys are passed to the template
untouched). `data.system_prompt` is optional text; `data.chat_template` is

* ``"auto"``: the tokenizer's own chat template;
* ``"none"``: no template: the prompt must be text and no system prompt set (the text is used as is);
* a path to a ``.jinja`` file: that template (read once, when the renderer is made).

When the cell is a message list, or a system prompt is set, the template renders the messages
with ``add_generation_prompt=True`` (transformers' ``apply_chat_template(..., tokenize=False)``);
plain text with no system prompt is used as is under every setting. The system prompt is put
first unless the row's messages already begin with a system message: the row's own wins.

Errors are `ConfigError`s naming the setting or the row and the problem; `check_render`
renders one row so a template that fails is found before anything starts.

`DEFAULT_CHAT_TEMPLATE` is a small ChatML-like template (``<|im_start|>role\\n...<|im_end|>\\n``)
for a tokenizer that has none, such as the built-in byte-level one (`rhymerl.policy.build`);
`install_default_chat_template` sets it. Turns end at the model's end-of-sequence token as for any
prompt: a real chat model's tokenizer brings its own template and end-of-turn token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rhymerl.errors import ConfigError

ROLES = ("user", "system", "assistant", "tool")
DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def install_default_chat_template(tokenizer: Any) -> bool:
    """Give `tokenizer` `DEFAULT_CHAT_TEMPLATE` if it has no chat template; True if it was set.

    `save_pretrained` then writes it (``chat_template.jinja``), so vLLM and `AutoTokenizer` see it."""
    if getattr(tokenizer, "chat_template", None):
        return False
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    return True


def validate_messages(cell: Any, where: str) -> list[dict[str, Any]]:
    """The cell as a list of message dicts, or ConfigError naming `where` (e.g. "row 3") and the problem."""
    if not isinstance(cell, (list, tuple)) or not cell:
        raise ConfigError(f"{where}: the prompt is {type(cell).__name__} {cell!r:.60}; it must be text or a "
                          "non-empty list of messages [{\"role\": \"user\", \"content\": \"...\"}]")
    messages = []
    for i, message in enumerate(cell):
        if not isinstance(message, dict):
            raise ConfigError(f"{where}: prompt message {i} is a {type(message).__name__}, not an object "
                              "with 'role' and 'content'")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ConfigError(f"{where}: prompt message {i} has role {role!r}; roles are {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ConfigError(f"{where}: prompt message {i} ({role}) has content {content!r:.60}; it must be a string")
        messages.append(dict(message))
    return messages


@dataclass(frozen=True)
class ChatRenderer:
    """How prompts are rendered: `mode` "auto", "none" or "file" (then `template` holds the file's
    text), and the system prompt ("" for none). Plain data: it pickles into any process."""

    mode: str = "auto"
    template: str = ""
    system_prompt: str = ""
    template_name: str = "auto"  # as configured, for messages

    def render(self, tokenizer: Any, cell: Any, where: str) -> str:
        """The prompt text of one row's prompt cell (rules in the module docstring)."""
        if isinstance(cell, str) and not self.system_prompt:
            return cell
        if self.mode == "none":
            what = "a system prompt is set" if isinstance(cell, str) else "the prompt is a message list"
            raise ConfigError(f"{where}: data.chat_template = 'none' but {what}; set data.chat_template to "
                              "'auto' or a .jinja file, or give plain-text prompts and no data.system_prompt")
        messages = [{"role": "user", "content": cell}] if isinstance(cell, str) else validate_messages(cell, where)
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        template = self.template if self.mode == "file" else None
        if template is None and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"{where}: data.chat_template = 'auto' but the tokenizer has no chat template; "
                              "set data.chat_template to a .jinja file (or give the tokenizer one)")
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 chat_template=template)
        except Exception as exc:
            raise ConfigError(f"{where}: the chat template ({self.template_name}) failed to render: "
                              f"{type(exc).__name__}: {exc}; fix the template or the row's messages") from exc
        if not isinstance(text, str):
            raise ConfigError(f"{where}: the chat template ({self.template_name}) rendered "
                              f"{type(text).__name__}, not text")
        return text


def make_renderer(chat_template: str = "auto", system_prompt: str = "",
                  base_dir: str | Path | None = None) -> ChatRenderer:
    """A ChatRenderer for the settings; ConfigError for a bad `data.chat_template` or system prompt.

    A relative .jinja path is taken from `base_dir` (default: the current directory)."""
    if not isinstance(system_prompt, str):
        raise ConfigError(f"data.system_prompt = {system_prompt!r} must be text (\"\" for none)")
    if chat_template in ("auto", "none"):
        return ChatRenderer(mode=chat_template, system_prompt=system_prompt, template_name=chat_template)
    if not isinstance(chat_template, str) or not chat_template.endswith(".jinja"):
        raise ConfigError(f"data.chat_template = {chat_template!r}: use 'auto', 'none' or a path to a .jinja file")
    path = Path(base_dir or Path.cwd()) / chat_template
    if not path.is_file():
        raise ConfigError(f"data.chat_template = {chat_template!r}: {path} does not exist; fix the path")
    text = path.read_text()
    if not text.strip():
        raise ConfigError(f"data.chat_template = {chat_template!r}: {path} is empty")
    return ChatRenderer(mode="file", template=text, system_prompt=system_prompt, template_name=str(path))


def render_cells(renderer: ChatRenderer, tokenizer: Any, cells: Sequence[Any],
                   names: Sequence[str]) -> list[str]:
    """The prompt text of each cell; `names[i]` names cell i in errors (e.g. "row 12 of data.jsonl")."""
    return [renderer.render(tokenizer, cell, name) for cell, name in zip(cells, names, strict=True)]


def check_render(renderer: ChatRenderer, tokenizer: Any, cell: Any, where: str) -> str:
    """Render one row (the first) at check time, so a failing template stops the run before it
    starts; returns the text. ConfigError as `ChatRenderer.render`, and for an empty result."""
    text = renderer.render(tokenizer, cell, where)
    if not text:
        raise ConfigError(f"{where}: the prompt renders to empty text; check data.prompt_key and the template")
    return text
