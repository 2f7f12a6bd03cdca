"""Tests for rhymerl.data.datasets: rows of any columns from every source type become checked problems."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rhymerl.config.task import DataConfig, RewardConfig
from rhymerl.data.datasets import DatasetError, load_problems, scan_problems
from rhymerl.data.reward import normalise_number, score
from rhymerl.data.records import Problem
from rhymerl.errors import ConfigError

ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,234. Price?", "answer": "It costs 1,234.\n#### 1,234"},
    {"question": "Lose 3.5 from 0?", "answer": "0 - 3.5 = -3.5\n#### -3.50"},
    {"question": "What is {x} if x = 2?", "answer": "2"},  # a bare number is a gsm8k gold answer too
    {"question": "Half of 1?", "answer": "1 / 2 = .5\n#### .5"},
]
GSM8K, MATH = RewardConfig(), RewardConfig(functions=("math",))
PLUGIN = RewardConfig(functions=("rewards.py:score",))  # a plug-in (not loaded here): no answer column needed


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def data(path, **kw) -> DataConfig:
    return DataConfig(dataset=str(path) if isinstance(path, Path) else path, **{"num_prompts": 0, **kw})


# ---------------------------------------------------------------- loading


def test_gsm8k_rows_become_problems(tmp_path):
    problems = load_problems(data(write_jsonl(tmp_path / "gsm.jsonl", ROWS), seed=0), GSM8K)
    by_index = {p.index: p for p in problems}
    # gsm8k: answer = the gold number its rule compares; solution = the cell; row = every column
    assert by_index[1] == Problem(index=1, question=ROWS[1]["question"], answer="1234",
                                  solution=ROWS[1]["answer"], row=ROWS[1])
    assert [by_index[i].answer for i in range(5)] == ["7", "1234", "-3.5", "2", "0.5"]
    assert all(score(p.solution, p.answer).correct for p in problems if "####" in p.solution)


def test_any_columns_and_any_answer_text_without_gsm8k(tmp_path):
    rows = [{"prompt": "Half?", "gold": "\\frac{1}{2}", "id": 7}, {"prompt": "Six?", "gold": 42, "id": 8}]
    problems = load_problems(data(write_jsonl(tmp_path / "m.jsonl", rows), prompt_key="prompt",
                                  answer_key="gold", seed=0), MATH)
    got = sorted((p.index, p.question, p.answer, p.row["id"]) for p in problems)
    assert got == [(0, "Half?", "\\frac{1}{2}", 7), (1, "Six?", "42", 8)]  # answer = str(cell)


def test_no_answer_column_is_fine_for_a_plugin_reward(tmp_path):
    (p,) = load_problems(data(write_jsonl(tmp_path / "p.jsonl", [{"text": "hi"}]), prompt_key="text"), PLUGIN)
    assert (p.question, p.answer, p.row) == ("hi", "", {"text": "hi"})


def test_every_source_type_gives_the_same_problems(tmp_path):
    jsonl = write_jsonl(tmp_path / "a.jsonl", ROWS)
    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")
    (tmp_path / "parts").mkdir()
    write_jsonl(tmp_path / "parts" / "0.jsonl", ROWS[:2])
    write_jsonl(tmp_path / "parts" / "1.jsonl", ROWS[2:])
    want = load_problems(data(jsonl, seed=3), GSM8K)
    for source in (str(tmp_path / "a.json"), str(tmp_path / "a.parquet"), str(tmp_path / "parts" / "*.jsonl"),
                   (str(tmp_path / "parts" / "0.jsonl"), str(tmp_path / "parts" / "1.jsonl"))):
        assert load_problems(DataConfig(dataset=source, num_prompts=0, seed=3), GSM8K) == want, source


def test_a_save_to_disk_folder(tmp_path):
    # The layout datasets.Dataset.save_to_disk writes: state.json listing Arrow IPC stream files.
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    table = pa.Table.from_pylist(ROWS)
    with pa.ipc.new_stream(str(folder / "data-00000-of-00001.arrow"), table.schema) as writer:
        writer.write_table(table)
    got = load_problems(data(folder, seed=1), GSM8K)
    assert got == load_problems(data(write_jsonl(tmp_path / "a.jsonl", ROWS), seed=1), GSM8K)


def test_shuffle_is_seeded_and_num_prompts_keeps_a_prefix(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", ROWS)
    # random.Random(seed).shuffle(range(5)), pinned so a change of shuffle shows up here
    assert [p.index for p in load_problems(data(path, seed=0), GSM8K)] == [2, 1, 0, 4, 3]
    assert [p.index for p in load_problems(data(path, seed=1), GSM8K)] == [2, 3, 4, 0, 1]
    assert [p.index for p in load_problems(data(path, num_prompts=2, seed=0), GSM8K)] == [2, 1]


def test_an_evaluation_set_shares_the_keys_and_names_its_own_settings(tmp_path):
    train = write_jsonl(tmp_path / "t.jsonl", ROWS)
    held = write_jsonl(tmp_path / "e.jsonl", ROWS[:3])
    got = load_problems(data(train), GSM8K, source=str(held), num_prompts=2, key="eval.dataset")
    assert len(got) == 2 and all(p.row in ROWS[:3] for p in got)
    with pytest.raises(ConfigError, match=r"eval.num_prompts = 4 but eval.dataset .* has 3 rows"):
        load_problems(data(train), GSM8K, source=str(held), num_prompts=4, key="eval.dataset")


def test_builtin_tasks_are_unchanged():
    problems = load_problems(DataConfig(dataset="builtin", num_prompts=5, seed=0), GSM8K)
    assert len(problems) == 5 and all(normalise_number(p.answer) == p.answer for p in problems)
    assert all(p.row == {"question": p.question, "answer": p.answer} for p in problems)
    from rhymerl.data.long import long_problems

    assert load_problems(DataConfig(dataset="builtin-long", num_prompts=7, seed=2), GSM8K) == long_problems(7, seed=2)
    # a generated task has no "every row"
    with pytest.raises(ConfigError, match="data.num_prompts = 0 means every row, but 'builtin'"):
        load_problems(DataConfig(dataset="builtin", num_prompts=0), GSM8K)


# ---------------------------------------------------------------- row errors


@pytest.mark.parametrize("row, reward, message", [
    ({"question": "  ", "answer": "1"}, GSM8K, r"the prompt \(column 'question'\) is empty"),
    ({"question": 5, "answer": "1"}, GSM8K, r"column 'question': the prompt is int"),
    ({"question": [{"role": "bot", "content": "x"}], "answer": "1"}, GSM8K, r"prompt message 0 has role 'bot'"),
    ({"question": [{"role": "user", "content": 3}], "answer": "1"}, GSM8K, r"prompt message 0 \(user\) has content 3"),
    ({"question": "q", "answer": "so 42"}, GSM8K, r"reward gsm8k needs the answer \(column 'answer'\) to be a "
                                                  r"number or end with a '#### <number>' line \(last line: 'so 42'\)"),
    ({"question": "q", "answer": None}, MATH, r"the answer \(column 'answer'\) is NoneType None; the built-in "
                                              r"reward math needs text or a number"),
])
def test_a_bad_row_names_the_source_the_row_and_the_fix(tmp_path, row, reward, message):
    path = write_jsonl(tmp_path / "d.jsonl", [ROWS[0], row, ROWS[2]])
    with pytest.raises(DatasetError, match=rf"data.dataset {re.escape(str(path))}: row 1 \(0-based\): (.*: )?{message}"):
        load_problems(data(path, num_prompts=1), reward)  # checked even when the shuffle would not pick it


def test_non_gsm8k_answers_need_no_marker(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "so 42"}])
    assert load_problems(data(path), MATH)[0].answer == "so 42"


def test_missing_columns_name_the_setting(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "x", "a": "1"}])
    problems, errors = scan_problems(data(path), GSM8K)
    assert problems == [] and len(errors) == 2
    assert errors[0].startswith("data.prompt_key = 'question': data.dataset") and "(columns: q, a)" in errors[0]
    assert errors[1].startswith("data.answer_key = 'answer':") and "set data.answer_key" in errors[1]
    assert scan_problems(data(path, prompt_key="q"), PLUGIN)[1] == []  # no built-in reward: no answer column needed


def test_scan_lists_every_bad_row_up_to_a_limit(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [ROWS[0]] + [{"question": "", "answer": "1"}] * 25)
    problems, errors = scan_problems(data(path), GSM8K, limit=20)
    assert [p.index for p in problems] == [0]
    assert len(errors) == 21 and "row 1 (0-based)" in errors[0] and "row 20 (0-based)" in errors[19]
    assert errors[20].endswith("5 more bad rows not shown")
    with pytest.raises(DatasetError, match=r"\(24 more bad rows; rhymerl run lists them\)"):
        load_problems(data(path), GSM8K)


def test_source_errors_are_one_message(tmp_path):
    assert scan_problems(data(tmp_path / "nope.jsonl"), GSM8K) == (
        [], [f"data.dataset: {tmp_path / 'nope.jsonl'} does not exist; fix the path or URL"])
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    assert scan_problems(data(path, num_prompts=9), GSM8K)[1] == [
        f"data.num_prompts = 9 but data.dataset {path} has 5 rows; set data.num_prompts to at most 5, or 0 "
        "for every row"]
