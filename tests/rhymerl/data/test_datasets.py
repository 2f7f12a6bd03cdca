"""Tests for rhymerl.data.datasets: loading GSM8K-format files (JSONL, Parquet) and rendering prompts."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from rhymerl.config.task import DataConfig
from rhymerl.data.datasets import DatasetError, load_problems, read_problem_file, render_prompts
from rhymerl.data.reward import normalise_number, score
from rhymerl.data.records import Problem, prompt_id_of

ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,234. Price?", "answer": "It costs 1,234.\n#### 1,234"},
    {"question": "Lose 3.5 from 0?", "answer": "0 - 3.5 = -3.5\n#### -3.50"},
    {"question": "What is {x} if x = 2?", "answer": "#### 2"},
    {"question": "Half of 1?", "answer": "1 / 2 = .5\n#### .5"},
]


def at(path: Path) -> str:
    """Regex matching the path literally (tmp paths contain '.' and may contain brackets)."""
    return re.escape(str(path))


def write_jsonl(path: Path, rows: list, raw_lines: dict[int, str] | None = None) -> Path:
    """Write rows as JSON lines; `raw_lines` replaces line i (0-based) with raw text."""
    lines = [json.dumps(r) for r in rows]
    for i, text in (raw_lines or {}).items():
        lines[i] = text
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_parquet(path: Path, columns: dict[str, list]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


def parquet_columns(rows: list[dict]) -> dict[str, list]:
    return {"question": [r["question"] for r in rows], "answer": [r["answer"] for r in rows]}


# ---------------------------------------------------------------- loading


def test_jsonl_rows_become_problems(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", ROWS)
    problems = read_problem_file(path)
    # gold = normalised number after '####'; solution = the full answer text; index = row
    assert problems[1] == Problem(index=1, question=ROWS[1]["question"], answer="1234",
                                  solution=ROWS[1]["answer"], row=ROWS[1])
    assert [p.answer for p in problems] == ["7", "1234", "-3.5", "2", "0.5"]


def test_every_solution_scores_as_correct(tmp_path):
    # a dataset solution is itself a well-formatted response with the gold answer
    for p in read_problem_file(write_jsonl(tmp_path / "gsm.jsonl", ROWS)):
        assert score(p.solution, p.answer).correct


def test_parquet_matches_jsonl(tmp_path):
    jsonl = write_jsonl(tmp_path / "gsm.jsonl", ROWS)
    parquet = write_parquet(tmp_path / "gsm.parquet", parquet_columns(ROWS))
    cfg = dict(num_prompts=4, seed=3)
    assert load_problems(DataConfig(dataset=str(parquet), **cfg)) == \
        load_problems(DataConfig(dataset=str(jsonl), **cfg))


def test_shuffle_is_seeded_and_stable(tmp_path):
    path = str(write_jsonl(tmp_path / "gsm.jsonl", ROWS))
    order0 = [p.index for p in load_problems(DataConfig(dataset=path, num_prompts=5, seed=0))]
    order1 = [p.index for p in load_problems(DataConfig(dataset=path, num_prompts=5, seed=1))]
    # random.Random(seed).shuffle(range(5)), pinned so a change of shuffle shows up here
    assert order0 == [2, 1, 0, 4, 3]
    assert order1 == [2, 3, 4, 0, 1]
    # num_prompts keeps a prefix of the same shuffled order
    first2 = load_problems(DataConfig(dataset=path, num_prompts=2, seed=0))
    assert [p.index for p in first2] == [2, 1]


def test_blank_lines_are_skipped_and_not_counted_as_rows(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text("\n" + json.dumps(ROWS[0]) + "\n   \n" + json.dumps(ROWS[1]) + "\n\n")
    assert [p.index for p in read_problem_file(path)] == [0, 1]


def test_extra_fields_are_ignored(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", [{**ROWS[0], "source": "gsm8k", "id": 9}])
    assert read_problem_file(path)[0].answer == "7"


def test_fewer_rows_than_requested_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", ROWS)
    # num_prompts sets the steps per epoch, so a short file must not silently shrink the run
    with pytest.raises(DatasetError, match=r"has 5 rows but data.num_prompts=6; set "
                                           r"data.num_prompts to at most 5"):
        load_problems(DataConfig(dataset=str(path), num_prompts=6))


def test_builtin_dataset_delegates_to_builtin_task():
    pytest.importorskip("rhymerl.data.builtin")
    problems = load_problems(DataConfig(dataset="builtin", num_prompts=5, seed=0))
    # the built-in task gives the requested count with normalised gold answers, and its worked
    # solutions follow the reward's '#### <number>' format
    assert len(problems) == 5
    assert all(normalise_number(p.answer) == p.answer for p in problems)
    assert all(score(p.solution, p.answer).correct for p in problems)


def test_builtin_long_dataset_delegates_to_the_long_tail_task():
    # Rule: "builtin-long" is the long-tail task's problems (seeded like "builtin"), with no file to check.
    from rhymerl.data.datasets import dataset_errors
    from rhymerl.data.long import long_problems

    cfg = DataConfig(dataset="builtin-long", num_prompts=7, seed=2)
    problems = load_problems(cfg)
    assert problems == long_problems(7, seed=2)
    assert all(score(p.solution, p.answer).correct for p in problems)
    assert dataset_errors(cfg) == []


# ---------------------------------------------------------------- loading errors


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match=rf"{at(path)} does not exist; set data.dataset"):
        load_problems(DataConfig(dataset=str(path)))


def test_unknown_extension(tmp_path):
    path = tmp_path / "gsm.csv"
    path.write_text("question,answer\n")
    with pytest.raises(DatasetError, match=rf"{at(path)} has unknown extension '\.csv'; use a"):
        read_problem_file(path)


@pytest.mark.parametrize("raw, message", [
    ('{"question": "q", "answer": ', r"line 2 is not valid JSON"),
    ('["q", "#### 1"]', r"line 2 is a JSON list, not an object"),
    ('{"answer": "#### 1"}', r"line 2 has no field 'question'"),
    ('{"question": "q"}', r"line 2 has no field 'answer'"),
    ('{"question": "q", "answer": 42}', r"line 2: field 'answer' is int \(42\), not a string"),
    ('{"question": ["q"], "answer": "#### 1"}', r"line 2: field 'question' is list"),
    ('{"question": "  ", "answer": "#### 1"}', r"line 2: field 'question' is empty"),
    ('{"question": "q", "answer": "so 42"}',
     r"line 2: field 'answer' does not end with a '#### <number>' line \(last line: 'so 42'\)"),
    ('{"question": "q", "answer": "#### 42\\nthanks"}', r"line 2: field 'answer' does not end"),
])
def test_bad_jsonl_line_names_file_and_line(tmp_path, raw, message):
    path = write_jsonl(tmp_path / "gsm.jsonl", ROWS[:3], raw_lines={1: raw})
    with pytest.raises(DatasetError, match=rf"dataset file {at(path)} {message}"):
        read_problem_file(path)


def test_bad_line_is_reported_whatever_the_seed(tmp_path):
    # every row is validated, even rows the shuffle would not pick
    path = write_jsonl(tmp_path / "gsm.jsonl", ROWS, raw_lines={4: '{"question": "q"}'})
    with pytest.raises(DatasetError, match="line 5 has no field 'answer'"):
        load_problems(DataConfig(dataset=str(path), num_prompts=1))


def test_empty_jsonl(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text("\n  \n")
    with pytest.raises(DatasetError, match=rf"{at(path)} has no rows; add rows"):
        read_problem_file(path)


def test_parquet_missing_column(tmp_path):
    path = write_parquet(tmp_path / "gsm.parquet", {"question": ["q"], "solution": ["#### 1"]})
    with pytest.raises(DatasetError, match=rf"{at(path)} has no column 'answer' \(columns: "
                                           r"question, solution\)"):
        read_problem_file(path)


def test_parquet_bad_rows_name_the_row(tmp_path):
    cols = parquet_columns(ROWS[:3])
    cols["answer"][1] = "no marker here"
    path = write_parquet(tmp_path / "gsm.parquet", cols)
    # Parquet rows are numbered from 0, and the message says so
    with pytest.raises(DatasetError, match=rf"{at(path)} row 1 \(0-based\): field 'answer'"):
        read_problem_file(path)
    cols = parquet_columns(ROWS[:3])
    cols["question"][2] = None
    path = write_parquet(tmp_path / "gsm2.parquet", cols)
    with pytest.raises(DatasetError, match=r"row 2 \(0-based\): field 'question' is NoneType"):
        read_problem_file(path)


def test_parquet_empty_and_corrupt(tmp_path):
    path = write_parquet(tmp_path / "empty.parquet", {"question": [], "answer": []})
    with pytest.raises(DatasetError, match="has no rows"):
        read_problem_file(path)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=rf"{at(bad)} could not be read as Parquet"):
        read_problem_file(bad)


# ---------------------------------------------------------------- rendering


def encode_chars(text: str) -> list[int]:
    """A real (if tiny) tokenizer: one token per character."""
    return [ord(c) for c in text]


def problem(index: int, question: str, answer: str = "1") -> Problem:
    return Problem(index=index, question=question, answer=answer, solution=f"#### {answer}")


def test_render_fills_template_and_ids():
    (p,), skipped = render_prompts([problem(7, "x={a}?", "3")], "Q: {question}\nA:",
                                   encode_chars, 100, "skip")
    # only '{question}' is replaced: braces in the question survive
    assert p.text == "Q: x={a}?\nA:"
    assert p.token_ids == tuple(ord(c) for c in "Q: x={a}?\nA:")
    assert (p.index, p.answer, p.prompt_id) == (7, "3", prompt_id_of(p.token_ids))
    assert skipped == []


def test_prompt_id_is_stable():
    # blake2b of the packed ids: the same on every process and run (never Python's hash())
    (p,), _ = render_prompts([problem(0, "\x01\x02\x03")], "{question}", encode_chars, 10, "skip")
    assert p.prompt_id == "77ba1ae68d5afbb4"


def test_long_prompts_are_skipped():
    problems = [problem(0, "abcd"), problem(1, "abcde"), problem(2, "abcdef")]
    kept, skipped = render_prompts(problems, "{question}!", encode_chars, 6, "skip")
    # limit 6 tokens: 5 and 6 fit (the limit is inclusive), 7 does not
    assert [p.index for p in kept] == [0, 1]
    assert skipped == [problems[2]]


def test_long_prompt_error_names_problem_length_and_limit():
    problems = [problem(0, "ab"), problem(9, "abcdefgh")]
    with pytest.raises(DatasetError, match=r"problem 9 is 9 prompt tokens, over the limit of 6"):
        render_prompts(problems, "{question}!", encode_chars, 6, "error")


def test_duplicate_prompts_keep_the_first(caplog):
    problems = [problem(0, "same", "1"), problem(1, "other"), problem(2, "same", "2")]
    with caplog.at_level(logging.WARNING, logger="rhymerl.data.datasets"):
        kept, skipped = render_prompts(problems, "{question}", encode_chars, 50, "skip")
    # identical token ids would share a prompt_id, so only the first is kept
    assert [p.index for p in kept] == [0, 1]
    assert skipped == [problems[2]]
    assert "problem 2 renders to the same tokens as problem 0" in caplog.text


@pytest.mark.parametrize("kwargs, message", [
    (dict(template="no placeholder"), "must contain the placeholder"),
    (dict(max_prompt_tokens=0), "max_prompt_tokens must be >= 1"),
    (dict(on_long="truncate"), "on_long must be 'skip' or 'error'"),
    (dict(encode=lambda s: []), "problem 0 encodes to zero tokens"),
])
def test_render_rejects_bad_arguments(kwargs, message):
    args = dict(template="{question}", encode=encode_chars, max_prompt_tokens=10, on_long="skip")
    args.update(kwargs)
    with pytest.raises(DatasetError, match=message):
        render_prompts([problem(0, "q")], **args)
