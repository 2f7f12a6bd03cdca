"""Tests for rhymerl.data.prompts: problems rendered (template or chat template), tokenized and given ids."""

from __future__ import annotations

import json
import logging

import pytest

from rhymerl.config.task import DataConfig, RewardConfig
from rhymerl.data.chat import DEFAULT_CHAT_TEMPLATE
from rhymerl.data.datasets import DatasetError, load_problems
from rhymerl.data.prompts import PromptRenderer, load_tokenizer, prompt_renderer, render_prompts
from rhymerl.data.records import Problem, prompt_id_of
from rhymerl.errors import ConfigError

CHAT_ROWS = [
    {"messages": [{"role": "user", "content": "What is 1/2 + 1/2?"}], "gold": "1"},
    {"messages": [{"role": "system", "content": "Terse."}, {"role": "user", "content": "2+2?"}], "gold": "4"},
]


class CharTokenizer:
    """A real (if tiny) tokenizer: one token per character."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def problem(index: int, question, answer: str = "1") -> Problem:
    return Problem(index=index, question=question, answer=answer, solution=f"#### {answer}")


@pytest.fixture(scope="module")
def builtin_model_dir(tmp_path_factory):
    """A built-in model's tokenizer as the build saves it (no chat template), marked as built in."""
    from rhymerl.policy.tokenizer import BUILD_INFO, build_tokenizer

    folder = tmp_path_factory.mktemp("builtin")
    build_tokenizer().save_pretrained(folder)
    (folder / BUILD_INFO).write_text("{}")
    return folder


def test_text_prompts_fill_the_template_and_ids():
    (p,), skipped = render_prompts([problem(7, "x={a}?", "3")], PromptRenderer("Q: {question}\nA:"),
                                   CharTokenizer(), 100, "skip")
    # only '{question}' is replaced: braces in the question survive
    assert p.text == "Q: x={a}?\nA:"
    assert p.token_ids == tuple(ord(c) for c in "Q: x={a}?\nA:")
    assert (p.index, p.answer, p.prompt_id) == (7, "3", prompt_id_of(p.token_ids))
    assert skipped == []


def test_prompt_id_is_stable():
    # blake2b of the packed ids: the same on every process and run (never Python's hash())
    (p,), _ = render_prompts([problem(0, "\x01\x02\x03")], PromptRenderer("{question}"), CharTokenizer(), 10, "skip")
    assert p.prompt_id == "77ba1ae68d5afbb4"


def test_long_prompts_are_skipped_or_rejected():
    problems = [problem(0, "abcd"), problem(1, "abcde"), problem(9, "abcdef")]
    kept, skipped = render_prompts(problems, PromptRenderer("{question}!"), CharTokenizer(), 6, "skip")
    # limit 6 tokens: 5 and 6 fit (the limit is inclusive), 7 does not
    assert [p.index for p in kept] == [0, 1] and skipped == [problems[2]]
    with pytest.raises(DatasetError, match=r"problem 9 is 7 prompt tokens, over the limit of 6"):
        render_prompts(problems, PromptRenderer("{question}!"), CharTokenizer(), 6, "error")


def test_duplicate_prompts_keep_the_first(caplog):
    problems = [problem(0, "same", "1"), problem(1, "other"), problem(2, "same", "2")]
    with caplog.at_level(logging.WARNING, logger="rhymerl.data.prompts"):
        kept, skipped = render_prompts(problems, PromptRenderer("{question}"), CharTokenizer(), 50, "skip")
    # identical token ids would share a prompt_id, so only the first is kept
    assert [p.index for p in kept] == [0, 1] and skipped == [problems[2]]
    assert "problem 2 renders to the same tokens as problem 0" in caplog.text


def test_chat_rows_render_with_the_builtin_tokenizer_and_default_template(builtin_model_dir, tmp_path):
    # Rule: a built-in model's tokenizer has no chat template; loading it for prompts gives it the default.
    tok = load_tokenizer(builtin_model_dir)
    assert tok.chat_template == DEFAULT_CHAT_TEMPLATE
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CHAT_ROWS))
    cfg = DataConfig(dataset=str(path), num_prompts=0, prompt_key="messages", answer_key="gold", seed=0)
    problems = load_problems(cfg, RewardConfig(functions=("math",)))
    kept, _ = render_prompts(problems, prompt_renderer(cfg), tok, 200, "skip")
    texts = {p.index: p.text for p in kept}
    assert texts == {0: "<|im_start|>user\nWhat is 1/2 + 1/2?<|im_end|>\n<|im_start|>assistant\n",
                     1: "<|im_start|>system\nTerse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                        "<|im_start|>assistant\n"}
    for p in kept:  # tokenized as written (the byte-level tokenizer: one token per character)
        assert tok.decode(p.token_ids) == p.text and p.prompt_id == prompt_id_of(p.token_ids)
        assert p.row == CHAT_ROWS[p.index] and p.answer == CHAT_ROWS[p.index]["gold"]


def test_a_system_prompt_sends_text_prompts_through_the_chat_template(builtin_model_dir):
    tok = load_tokenizer(builtin_model_dir)
    renderer = prompt_renderer(DataConfig(system_prompt="Answer with '#### <n>'."))
    (p,), _ = render_prompts([problem(0, "1+2?")], renderer, tok, 200, "skip")
    assert p.text == ("<|im_start|>system\nAnswer with '#### <n>'.<|im_end|>\n<|im_start|>user\n1+2?<|im_end|>\n"
                      "<|im_start|>assistant\n")  # prompt_template is for plain text prompts only


def test_a_jinja_template_from_the_current_directory(builtin_model_dir, tmp_path, monkeypatch):
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                                      "{% if add_generation_prompt %}[assistant] {% endif %}")
    monkeypatch.chdir(tmp_path)  # a relative data.chat_template is taken from the current directory
    renderer = prompt_renderer(DataConfig(chat_template="t.jinja"))
    (p,), _ = render_prompts([problem(0, CHAT_ROWS[0]["messages"])], renderer, load_tokenizer(builtin_model_dir),
                             200, "skip")
    assert p.text == "[user] What is 1/2 + 1/2?\n[assistant] "
    with pytest.raises(ConfigError, match=r"data.chat_template = 'gone.jinja': .* does not exist"):
        prompt_renderer(DataConfig(chat_template="gone.jinja"))


def test_messages_need_a_chat_template():
    renderer = prompt_renderer(DataConfig(chat_template="none"))
    with pytest.raises(ConfigError, match=r"problem 3: data.chat_template = 'none' but the prompt is a message list"):
        render_prompts([problem(3, CHAT_ROWS[0]["messages"])], renderer, CharTokenizer(), 100, "skip")


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_prompt_tokens=0), "max_prompt_tokens must be >= 1"),
    (dict(on_long="truncate"), "on_long must be 'skip' or 'error'"),
    (dict(tokenizer=type("Empty", (), {"encode": lambda self, s, add_special_tokens=True: []})()),
     "problem 0 encodes to zero tokens"),
])
def test_render_rejects_bad_arguments(kwargs, message):
    args = dict(renderer=PromptRenderer("{question}"), tokenizer=CharTokenizer(), max_prompt_tokens=10, on_long="skip")
    args.update(kwargs)
    with pytest.raises(DatasetError, match=message):
        render_prompts([problem(0, "q")], **args)
