"""Reward plug-ins: built-ins, file and module functions, weights, errors, pickling."""

import math
import pickle
import sys

import pytest
from math_verify import parse, verify

from rhymerl.data import reward_builtins, rewards
from rhymerl.data.reward_builtins import MathReward, parse_gold
from rhymerl.data.rewards import RewardFunctionError, load_reward_set
from rhymerl.errors import ConfigError

PLUGIN = '''
from dataclasses import dataclass

CONSTANT = 3

def brevity(prompt, completion, row):
    return 1.0 / (1 + len(completion))

def judged(prompt, completion, row):
    return (0.5, row["label"] in completion)

def two_args(prompt, completion):
    return 0.0

def needs_kw(prompt, completion, row, *, scale):
    return 0.0

def flexible(*args, **kwargs):
    return 0.25

@dataclass
class Scaled:
    factor: float = 2.0
    def __call__(self, prompt, completion, row):
        return self.factor

scaled = Scaled()

def boom(prompt, completion, row):
    raise ZeroDivisionError("no")

def nan(prompt, completion, row):
    return float("nan")

def text(prompt, completion, row):
    return "1.0"

def boolean(prompt, completion, row):
    return True

def bad_verdict(prompt, completion, row):
    return (1.0, "yes")
'''


@pytest.fixture
def plugin(tmp_path):
    (tmp_path / "plug.py").write_text(PLUGIN)
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "raises.py").write_text("raise RuntimeError('cannot start')\n")
    return tmp_path


# ---------------------------------------------------------------- built-ins

# (gold, completion, correct): the math rule is math-verify's equivalence
MATH_TABLE = [
    (r"\frac{1}{2}", "The answer is 0.5", True),
    ("0.5", r"so we get \boxed{\frac{1}{2}}", True),
    (r"\sqrt{8}", r"The answer is $2\sqrt{2}$", True),
    (r"2\sqrt{2}", r"$\sqrt{8}$", True),
    ("x^2+2x+1", r"\boxed{(x+1)^2}", True),
    ("3", r"\boxed{4}", False),  # wrong answer
    ("3", "I do not know", False),  # no answer at all
]


@pytest.mark.parametrize("gold, completion, correct", MATH_TABLE)
def test_math_reward_agrees_with_math_verify(gold, completion, correct):
    assert verify(parse_gold(gold), parse(completion)) is correct  # the library's own verdict
    assert MathReward()("p", completion, {"answer": gold}) == (float(correct), correct)


def test_math_reward_reads_the_answer_column_and_numbers():
    assert MathReward("solution")("p", r"\boxed{72}", {"solution": 72}) == (1.0, True)


def test_math_gold_that_does_not_parse_is_a_dataset_error():
    with pytest.raises(ValueError, match="does not parse"):
        MathReward()("p", r"\boxed{1}", {"answer": ""})


@pytest.mark.parametrize("gold", ["72", "3 * 24 = 72\n#### 72", 72])
def test_gsm8k_reward_uses_the_hash_line_rule(gold):
    # gold is a number or a worked solution; the completion must end in "#### <number>"
    rs = load_reward_set(["gsm8k"])
    assert rs.score("q", "6*12=72\n#### 72", {"answer": gold}).correct is True
    assert rs.score("q", "#### 71", {"answer": gold}).values == {"gsm8k": 0.0}
    assert rs.score("q", "72", {"answer": gold}).correct is False  # unformatted


def test_builtin_registry_names():
    assert set(reward_builtins.BUILTINS) == {"gsm8k", "math"}


# ---------------------------------------------------------------- plug-ins, weights, correctness


def test_weighted_sum_and_values_by_name(plugin):
    rs = load_reward_set(["gsm8k", "plug.py:brevity", "plug.py:scaled"], [2.0, 3.0, 0.5], base_dir=plugin)
    s = rs.score("q", "#### 4", {"answer": "4"})
    brevity = 1.0 / 7  # len("#### 4") == 6
    assert s.values == {"gsm8k": 1.0, "brevity": pytest.approx(brevity), "scaled": 2.0}
    assert s.total == pytest.approx(2.0 * 1.0 + 3.0 * brevity + 0.5 * 2.0)
    assert s.correct is True  # only gsm8k judged, and it said correct


def test_correct_is_none_unless_a_function_judges(plugin):
    rs = load_reward_set(["plug.py:brevity", "plug.py:flexible"], base_dir=plugin)
    assert rs.weights == (1.0, 1.0)
    assert rs.score("q", "abc", {}).correct is None


def test_correct_is_true_only_if_every_judge_agrees(plugin):
    rs = load_reward_set(["gsm8k", "plug.py:judged"], base_dir=plugin)
    row = {"answer": "4", "label": "cat"}  # the plug-in sees every column of the row
    assert rs.score("q", "#### 4", row).correct is False  # gsm8k True, judged False
    assert rs.score("q", "cat\n#### 4", row).correct is True


def test_module_plugin(plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin))
    rs = load_reward_set(["plug:brevity"])
    assert rs.functions[0].kind == "module"
    assert rs.score("q", "x", {}).total == 0.5


# ---------------------------------------------------------------- loading errors

BAD_LOADS = [
    ([], None, "reward.functions must be a non-empty list"),
    ("math", None, "reward.functions must be a non-empty list"),
    (["mathh"], None, r"reward.functions\[0\] = 'mathh' is not a built-in reward function \(built-ins: gsm8k, math\)"),
    (["plug.py"], None, r"is not a built-in.*and a ':NAME' after it"),
    (["math", "nope.py:f"], None, r"reward.functions\[1\] = 'nope.py:f': file .*nope.py does not exist; fix the path"),
    (["broken.py:f"], None, r"reward.functions\[0\].*importing file .*broken.py failed with SyntaxError"),
    (["raises.py:f"], None, r"importing file .*raises.py failed with RuntimeError: cannot start"),
    (["no_such_pkg_xyz:f"], None, r"importing module 'no_such_pkg_xyz' failed with ModuleNotFoundError"),
    (["plug.py:missing"], None, r"has no 'missing'; its callables are: .*brevity"),
    (["plug.py:CONSTANT"], None, r"'plug.py:CONSTANT' is not callable \(type int\)"),
    (["plug.py:two_args"], None, r"cannot be called as two_args\(prompt, completion, row\)"),
    (["plug.py:needs_kw"], None, r"cannot be called as needs_kw\(prompt, completion, row\).*scale"),
    (["plug.py:1x"], None, r"with NAME a Python name"),
    ([42], None, r"reward.functions\[0\] = 42 is not a spec"),
    (["plug.py:brevity", "plug.py:brevity"], None, r"reward.functions\[1\].*already used by reward.functions\[0\]"),
    (["math", "gsm8k"], [1.0], r"reward.weights = \[1.0\] has 1 entries but reward.functions has 2"),
    (["math"], [float("inf")], r"reward.weights\[0\] = inf is not a finite number"),
    (["math"], [float("nan")], r"reward.weights\[0\] = nan is not a finite number"),
    (["math"], ["1"], r"reward.weights\[0\] = '1' is not a finite number"),
    (["math"], "1", r"reward.weights = '1' is not a list"),
]


@pytest.mark.parametrize("functions, weights, message", BAD_LOADS)
def test_loading_errors_name_the_key_and_the_fix(plugin, functions, weights, message):
    with pytest.raises(ConfigError, match=message):
        load_reward_set(functions, weights, base_dir=plugin)


BAD_SCORES = [
    ("boom", r"'boom' \(plug.py:boom\) raised on prompt p-7: ZeroDivisionError: no"),
    ("nan", r"'nan' .* on prompt p-7 returned the non-finite value nan"),
    ("text", r"'text' .* on prompt p-7 returned '1.0'; return a number or a \(number, correct\) pair"),
    ("boolean", r"returned True; return a number"),
    ("bad_verdict", r"returned correct='yes'; it must be True, False or None"),
]


@pytest.mark.parametrize("name, message", BAD_SCORES)
def test_scoring_errors_name_the_function_and_the_prompt(plugin, name, message):
    rs = load_reward_set([f"plug.py:{name}"], base_dir=plugin)
    with pytest.raises(RewardFunctionError, match=message):
        rs.score("q", "a", {}, prompt_id="p-7")


def test_a_module_missing_in_the_scoring_process_says_so(plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin))
    blob = pickle.dumps(load_reward_set(["plug:brevity"]))
    rewards._RESOLVED.clear()
    monkeypatch.delitem(sys.modules, "plug")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(plugin)])  # a worker without it
    with pytest.raises(RewardFunctionError, match=r"'brevity' \(plug:brevity\) cannot be loaded in this process: "
                                                  r"ModuleNotFoundError"):
        pickle.loads(blob).score("q", "a", {}, prompt_id="p1")


def test_a_builtin_on_a_row_without_the_answer_column_is_a_scoring_error():
    rs = load_reward_set(["gsm8k"], answer_key="gold")
    with pytest.raises(RewardFunctionError, match=r"'gsm8k'.*prompt p1: KeyError.*no answer column 'gold'"):
        rs.score("q", "#### 1", {"answer": "1"}, prompt_id="p1")


def test_check_scores_one_row_before_the_run(plugin):
    load_reward_set(["math", "plug.py:brevity"], base_dir=plugin).check("q", {"answer": "1"}, "p0")
    with pytest.raises(ConfigError, match=r"reward.functions: reward function 'math' \(math\) raised on prompt "
                                          r"p0: ValueError: gold answer '' does not parse.*even an empty one"):
        load_reward_set(["math"]).check("q", {"answer": ""}, "p0")
    assert load_reward_set(["gsm8k"]).uses_answer_column
    assert not load_reward_set(["plug.py:brevity"], base_dir=plugin).uses_answer_column


# ---------------------------------------------------------------- processes


def test_pickles_and_runs_the_checked_text_in_a_fresh_process(plugin):
    rs = load_reward_set(["math", "plug.py:judged", "plug.py:scaled"], [1.0, 2.0, 1.0], base_dir=plugin)
    blob = pickle.dumps(rs)
    before = rs.score("q", r"cat \boxed{3}", {"answer": "3", "label": "cat"})
    # A fresh worker: nothing resolved, no plug-in module loaded, the file gone from disk.
    rewards._RESOLVED.clear()
    for name in [n for n in sys.modules if n.startswith("rhymerl_reward_plugin_")]:
        del sys.modules[name]
    (plugin / "plug.py").unlink()
    again = pickle.loads(blob)
    assert again == rs
    after = again.score("q", r"cat \boxed{3}", {"answer": "3", "label": "cat"})
    assert after == before
    assert after.total == 1.0 + 2.0 * 0.5 + 2.0 and after.correct is True
    assert not math.isnan(after.total)
