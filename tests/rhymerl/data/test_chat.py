"""Prompt rendering with a real tokenizer: the built-in byte-level one given the default template."""

import pytest

from rhymerl.data.chat import (DEFAULT_CHAT_TEMPLATE, check_render, install_default_chat_template,
                               make_renderer, render_cells, validate_messages)
from rhymerl.errors import ConfigError
from rhymerl.policy.build import build_tokenizer

MESSAGES = [{"role": "user", "content": "What is 1+1?"}]


@pytest.fixture(scope="module")
def bare():
    return build_tokenizer()  # the built-in byte-level tokenizer: no chat template of its own


@pytest.fixture(scope="module")
def tok():
    t = build_tokenizer()
    assert install_default_chat_template(t) is True
    assert install_default_chat_template(t) is False  # an existing template is kept
    return t


def test_default_template_renders_chatml_with_a_generation_prompt(tok):
    text = make_renderer().render(tok, MESSAGES, "row 0")
    assert text == "<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # bytes round trip


def test_installed_template_survives_save_and_load(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    assert (tmp_path / "chat_template.jinja").read_text() == DEFAULT_CHAT_TEMPLATE
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert make_renderer().render(again, MESSAGES, "r") == make_renderer().render(tok, MESSAGES, "r")


@pytest.mark.parametrize("setting", ["auto", "none"])
def test_plain_text_without_a_system_prompt_is_used_as_is(bare, setting):
    # no template is needed (the bare tokenizer has none) and none is applied
    assert make_renderer(setting).render(bare, "12+30=", "row 0") == "12+30="


def test_system_prompt_goes_first_unless_the_row_has_its_own(tok):
    renderer = make_renderer(system_prompt="Be brief.")
    assert renderer.render(tok, "Hi", "r") == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                                               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    own = [{"role": "system", "content": "Row's own."}, *MESSAGES]
    assert renderer.render(tok, own, "r").startswith("<|im_start|>system\nRow's own.<|im_end|>\n<|im_start|>user")


def test_a_jinja_file_template(tok, tmp_path):
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                                      "{% if add_generation_prompt %}[assistant] {% endif %}")
    renderer = make_renderer("t.jinja", base_dir=tmp_path)
    assert renderer.render(tok, MESSAGES, "r") == "[user] What is 1+1?\n[assistant] "
    names = ["row 0 of d.jsonl", "row 1 of d.jsonl"]
    assert render_cells(renderer, tok, ["a", MESSAGES], names) == ["a", "[user] What is 1+1?\n[assistant] "]


def test_the_message_rule():
    extra = {"role": "tool", "content": "42", "name": "calc"}  # other keys pass through
    assert validate_messages([extra], "row 0") == [extra]


BAD_CELLS = [
    ([{"role": "bot", "content": "x"}],
     r"^row 3: prompt message 0 has role 'bot'; roles are user, system, assistant, tool$"),
    ([MESSAGES[0], {"role": "user", "content": 7}],
     r"^row 3: prompt message 1 \(user\) has content 7; it must be a string$"),
    (["hello"], r"^row 3: prompt message 0 is a str, not an object with 'role' and 'content'$"),
    ([], r"^row 3: the prompt is list \[\]; it must be text or a non-empty list of messages"),
    (5, r"^row 3: the prompt is int 5; it must be text or a non-empty list"),
]


@pytest.mark.parametrize("cell, message", BAD_CELLS)
def test_bad_messages_name_the_row_and_the_problem(tok, cell, message):
    with pytest.raises(ConfigError, match=message):
        make_renderer().render(tok, cell, "row 3")


def test_setting_errors(tok, bare, tmp_path):
    with pytest.raises(ConfigError, match=r"row 0: data.chat_template = 'none' but the prompt is a message list"):
        make_renderer("none").render(tok, MESSAGES, "row 0")
    with pytest.raises(ConfigError, match=r"'none' but a system prompt is set"):
        make_renderer("none", system_prompt="S").render(tok, "q", "row 0")
    with pytest.raises(ConfigError, match=r"'auto' but the tokenizer has no chat template"):
        make_renderer().render(bare, MESSAGES, "row 0")
    with pytest.raises(ConfigError, match=r"data.chat_template = 'chatml': use 'auto', 'none' or a path to a .jinja"):
        make_renderer("chatml")
    with pytest.raises(ConfigError, match=r"data.chat_template = 'missing.jinja': .*missing.jinja does not exist"):
        make_renderer("missing.jinja", base_dir=tmp_path)
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(ConfigError, match=r"empty.jinja is empty"):
        make_renderer("empty.jinja", base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"data.system_prompt = 3 must be text"):
        make_renderer(system_prompt=3)


@pytest.mark.parametrize("template, error", [("{% for %}", "TemplateSyntaxError"),
                                             ("{{ raise_exception('no tools here') }}", "TemplateError: no tools here"),
                                             ("{% if add_generation_prompt %}{% endif %}", "empty text")])
def test_check_render_finds_a_failing_template_on_the_first_row(tok, tmp_path, template, error):
    (tmp_path / "bad.jinja").write_text(template)
    renderer = make_renderer("bad.jinja", base_dir=tmp_path)
    with pytest.raises(ConfigError, match=rf"row 0 of d.jsonl: .*{error}"):
        check_render(renderer, tok, MESSAGES, "row 0 of d.jsonl")
