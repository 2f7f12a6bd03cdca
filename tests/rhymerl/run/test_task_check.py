"""The task's input checks (rhymerl/run/task_check.py) on a sweep of bad inputs, one spoiled setting each.

In process, through the preflight's own entry (`check_dataset` with the storage layer's source options),
since each case would otherwise pay a CLI start; the CLI sweep (tests/cli/test_cli_preflight.py) runs
two of these cases through `rhymerl run` for the exit code and the report.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models

from rhymerl.config.run import load_config
from rhymerl.errors import ConfigError
from rhymerl.run.preflight import check_dataset
from storage.fs import source_options

CHAT = [{"role": "user", "content": "What is 1/2 + 1/2?"}]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("task")
    write_jsonl(root / "gsm.jsonl", [{"question": f"{i} + 1?", "answer": f"#### {i + 1}"} for i in range(4)])
    write_jsonl(root / "chat.jsonl", [{"messages": CHAT, "gold": "1"}] * 2)
    write_jsonl(root / "badchat.jsonl", [{"messages": CHAT, "gold": "1"}, {"messages": [{"role": "bot"}], "gold": "1"}])
    write_jsonl(root / "nonumber.jsonl", [{"question": "q", "answer": "five"}] * 4)
    (root / "empty.jsonl").write_text("")
    (root / "r.py").write_text("def good(prompt, completion, row):\n    return 1.0\n\n"
                               "def one_arg(x):\n    return 1.0\n\n"
                               "def picky(prompt, completion, row):\n    return float(completion.split()[-1])\n")
    (root / "broken.py").write_text("import not_a_module_anywhere\n")
    (root / "raises.jinja").write_text("{{ raise_exception('roles must alternate') }}")
    model = root / "model"  # a user model whose tokenizer has no chat template
    model.mkdir()
    Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>")).save(str(model / "tokenizer.json"))
    return root


def findings(root: Path, overrides: list[str]) -> list[str]:
    cfg = load_config(None, [f'data.dataset="{root / "gsm.jsonl"}"', "data.num_prompts=4", *overrides])
    return [str(f) for f in check_dataset(cfg, source_options)]


CHAT_DATA = ['data.prompt_key="messages"', 'data.answer_key="gold"', 'reward.functions=["math"]', "data.num_prompts=0"]

# (name, overrides with {root} for the folder, text every finding line must hold) -- one bad input each
CASES = [
    ("reward-file-missing", ['reward.functions=["nope.py:f"]'], ["reward: reward.functions[0] = 'nope.py:f'",
                                                                 "does not exist; fix the path"]),
    ("reward-import-fails", ['reward.functions=["{root}/broken.py:f"]'], ["reward: reward.functions[0]",
                                                                         "ModuleNotFoundError", "fix the code"]),
    ("reward-no-function", ['reward.functions=["{root}/r.py:absent"]'], ["has no 'absent'", "its callables are: "
                                                                        "good, one_arg, picky"]),
    ("reward-signature", ['reward.functions=["{root}/r.py:one_arg"]'], ["cannot be called as one_arg(prompt, "
                                                                       "completion, row)", "give it those three"]),
    ("reward-unknown-builtin", ['reward.functions=["gsm9k"]'], ["'gsm9k' is not a built-in reward function",
                                                               "gsm8k, math"]),
    ("reward-fails-on-empty", ['reward.functions=["{root}/r.py:picky"]'], ["reward: reward.functions: reward "
                                                                          "function 'picky'", "IndexError",
                                                                          "must score any completion"]),
    ("prompt-key-missing", ['data.prompt_key="prompt"'], ["dataset: data.prompt_key = 'prompt'", "(columns: "
                                                         "question, answer)", "set data.prompt_key"]),
    ("answer-key-missing", ['data.answer_key="gold"'], ["dataset: data.answer_key = 'gold'", "built-in reward "
                                                       "gsm8k reads it", "set data.answer_key"]),
    ("gsm8k-no-number", ['data.dataset="{root}/nonumber.jsonl"'], ["reward gsm8k needs the answer (column "
                                                                  "'answer')", "'#### 42'", 'reward.functions = '
                                                                                            '["math"]']),
    ("messages-malformed", ['data.dataset="{root}/badchat.jsonl"', *CHAT_DATA], ["row 1 (0-based): column "
                                                                                "'messages': prompt message 0 has "
                                                                                "role 'bot'; roles are user"]),
    ("chat-template-file-missing", ['data.chat_template="gone.jinja"'], ["data.chat_template = 'gone.jinja'",
                                                                         "does not exist; fix the path"]),
    ("chat-template-fails", ['data.dataset="{root}/chat.jsonl"', 'data.chat_template="{root}/raises.jinja"',
                             *CHAT_DATA], ["data.chat_template = '", "failed to render: TemplateError: roles must "
                                           "alternate", "fix the template"]),
    ("chat-template-none", ['data.dataset="{root}/chat.jsonl"', 'data.chat_template="none"', *CHAT_DATA],
     ["data.chat_template = 'none' but the prompt is a message list", "set data.chat_template to 'auto'"]),
    ("tokenizer-without-template", ['data.dataset="{root}/chat.jsonl"', 'model.path="{root}/model"', *CHAT_DATA],
     ["data.chat_template = 'auto' but the tokenizer has no chat template", "set data.chat_template to a .jinja"]),
    ("eval-missing", ['eval.dataset="{root}/gone.jsonl"'], ["eval: eval.dataset: ", "gone.jsonl does not exist; "
                                                           "fix the path"]),
    ("eval-empty", ['eval.dataset="{root}/empty.jsonl"'], ["eval: eval.dataset: ", "is empty (no rows)"]),
    ("eval-keys-missing", ['eval.dataset="{root}/chat.jsonl"'], ["eval: data.", "eval.dataset", "(columns: messages, "
                                                                "gold)"]),
    ("eval-too-few-rows", ['eval.dataset="{root}/chat.jsonl"', 'data.prompt_key="messages"',
                           'data.answer_key="gold"', 'reward.functions=["math"]', "eval.num_prompts=3"],
     ["eval: eval.num_prompts = 3 but eval.dataset", "has 2 rows; set eval.num_prompts to at most 2"]),
]


@pytest.mark.parametrize("name, overrides, expect", CASES, ids=[c[0] for c in CASES])
def test_each_bad_task_input_is_one_line_naming_the_setting_and_the_fix(root, name, overrides, expect):
    t = time.perf_counter()
    found = findings(root, [o.replace("{root}", str(root)) for o in overrides])
    assert len(found) >= 1, name
    missing = [e for e in expect if not any(e in f for f in found)]
    assert not missing, f"{name}: missing {missing} in {found}"
    # Far inside the preflight's budget even on a loaded machine (the first chat case imports transformers).
    assert time.perf_counter() - t < 30


def test_the_sweep_is_wide():
    assert len(CASES) >= 12


def test_good_task_inputs_pass(root):
    # The other side of the sweep: each spoiled setting was the only problem.
    assert findings(root, []) == []
    chat = [f'data.dataset="{root / "chat.jsonl"}"', *CHAT_DATA]
    assert findings(root, chat) == []  # the built-in tokenizer, given the default template, renders
    assert findings(root, [*chat, 'data.system_prompt="Be brief."', f'eval.dataset="{root / "chat.jsonl"}"',
                           f'reward.functions=["math", "{root}/r.py:good"]', "reward.weights=[1.0, 0.5]"]) == []
    assert findings(root, ['data.dataset="builtin"', 'data.system_prompt="Be brief."']) == []


def test_weights_not_matching_the_functions_stop_the_config_load():
    with pytest.raises(ConfigError, match=r"reward.weights.*has 1 weights for 2 functions"):
        load_config(None, ['reward.functions=["gsm8k", "math"]', "reward.weights=[1.0]"])
