"""Training and evaluation problems: a built-in task, or the rows of any dataset, checked row by row.

A dataset that is not built in is read by `rhymerl.data.sources.load_rows` (.jsonl / .json /
.parquet files, lists, globs, `datasets.save_to_disk` folders, s3:// URLs; every column kept).
`data.prompt_key` names the prompt column and `data.answer_key` the gold answer column, which is
required only when a built-in reward (gsm8k, math) is among `reward.functions`: other reward
functions read what they need from the whole row.

Rules, checked for every row before any is used (so a bad row is reported the same way whatever the
seed or the number of prompts):

* the prompt cell is non-empty text, or a non-empty list of chat messages
  (`rhymerl.data.chat.validate_messages`);
* with a built-in reward the answer cell is text or a number;
* with `gsm8k` it is a number or a worked solution whose last non-empty line is ``#### <number>``
  (the format rule of `rhymerl.data.reward`); with any other reward any answer text is fine
  (``\\frac{1}{2}``, ``42``).

A row becomes `Problem(index, question, answer, solution, row)`: `index` its 0-based position in
the source (stable across seeds: it identifies the row in messages and the lake), `question` the
prompt cell as read, `row` the whole row. `answer` is the gold number when `gsm8k` is chosen (what
its rule compares, e.g. "42" for "... #### 42"), else the answer cell as text ("" when the data has
no such column); `solution` is the answer cell as text ("" without one).

Errors are `ConfigError`s (`DatasetError` for a row) that name the setting, the source and the row,
and the fix. `scan_problems` lists every problem of a source for the run's input checks;
`load_problems` raises on the first. Rendering problems into prompts is `rhymerl.data.prompts`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rhymerl.config.task import BUILTIN_DATASETS, DataConfig, RewardConfig, Source
from rhymerl.data.chat import validate_messages
from rhymerl.data.records import Problem
from rhymerl.data.reward import extract_answer, normalise_number
from rhymerl.data.reward_builtins import BUILTINS
from rhymerl.data.sources import SourceRows, load_rows, pick_rows
from rhymerl.errors import ConfigError

ROW_ERROR_LIMIT = 20  # rows listed by the input checks before "N more"


class DatasetError(ConfigError):
    """A row of a dataset is unusable, or a prompt cannot be made of it; the message names the row and the fix."""


def load_problems(data: DataConfig, reward: RewardConfig, *, source: Source | None = None,
                  num_prompts: int | None = None, storage_options: Mapping[str, Any] | None = None,
                  key: str = "data.dataset") -> list[Problem]:
    """The problems a run uses: the first `num_prompts` after a `random.Random(data.seed)` shuffle of
    the rows (0: every row), each row checked (module docstring).

    `source` and `num_prompts` default to `data.dataset` and `data.num_prompts`; an evaluation
    passes its own (`eval.dataset`, `eval.num_prompts`, with `key="eval.dataset"` so messages name
    its settings) and shares the data settings (columns, seed). `reward` decides which answer
    column rules apply. `storage_options` are the fsspec settings for URLs (s3://). "builtin" and
    "builtin-long" are the generated tasks of `rhymerl.data.builtin` / `rhymerl.data.long`.
    Raises ConfigError (DatasetError for a bad row) naming the setting and the fix.
    """
    source = data.dataset if source is None else source
    count = data.num_prompts if num_prompts is None else num_prompts
    count_key = _count_key(key)
    if isinstance(source, str) and source in BUILTIN_DATASETS:
        return _builtin(source, count, data.seed, count_key)
    rows = load_rows(source, storage_options, key)
    problems, errors = _problems(rows, data, reward, key)
    if errors:
        more = f" ({len(errors) - 1} more bad rows; rhymerl run lists them)" if len(errors) > 1 else ""
        raise DatasetError(errors[0] + more)
    return [p for _, p in pick_rows(problems, count, data.seed, f"{key} {rows.name}", count_key)]


def scan_problems(data: DataConfig, reward: RewardConfig, *, source: Source | None = None,
                  num_prompts: int | None = None, storage_options: Mapping[str, Any] | None = None,
                  key: str = "data.dataset", limit: int = ROW_ERROR_LIMIT) -> tuple[list[Problem], list[str]]:
    """(every good row's problem, in source order; one message per problem found) for the input checks.

    The same rules as `load_problems`, without raising: a source that cannot be read or lacks a
    column gives one message and no problems; bad rows give one message each (at most `limit`,
    then one saying how many more); too few rows for the number of prompts gives one message.
    A built-in task has no rows to check and gives ([], []) when its count is valid.
    """
    source = data.dataset if source is None else source
    count = data.num_prompts if num_prompts is None else num_prompts
    if isinstance(source, str) and source in BUILTIN_DATASETS:
        return [], [_every_row_of_generated(source, _count_key(key))] if count == 0 else []
    try:
        rows = load_rows(source, storage_options, key)
    except ConfigError as exc:
        return [], [str(exc)]
    problems, errors = _problems(rows, data, reward, key)
    if len(errors) > limit:
        errors = errors[:limit] + [f"{key} {rows.name}: {len(errors) - limit} more bad rows not shown"]
    if not errors:
        try:
            pick_rows(problems, count, data.seed, f"{key} {rows.name}", _count_key(key))
        except ConfigError as exc:
            errors.append(str(exc))
    return problems, errors


def dataset_errors(data: DataConfig, reward: RewardConfig, **kwargs: Any) -> list[str]:
    """The messages of `scan_problems` alone; [] when the source loads as `load_problems` would load it."""
    return scan_problems(data, reward, **kwargs)[1]


def _count_key(key: str) -> str:
    return key.rsplit(".", 1)[0] + ".num_prompts"  # data.dataset -> data.num_prompts


def _every_row_of_generated(source: str, count_key: str) -> str:
    return (f"{count_key} = 0 means every row, but {source!r} is a generated task with no fixed rows; set "
            f"{count_key} to a count such as 128")


def _builtin(source: str, count: int, seed: int, count_key: str) -> list[Problem]:
    if count == 0:
        raise ConfigError(_every_row_of_generated(source, count_key))
    if source == "builtin":
        from rhymerl.data.builtin import builtin_problems

        return builtin_problems(num=count, seed=seed)
    from rhymerl.data.long import long_problems

    return long_problems(num=count, seed=seed)


def _problems(rows: SourceRows, data: DataConfig, reward: RewardConfig, key: str) -> tuple[list[Problem], list[str]]:
    """(each good row's Problem, one message per bad row or missing column)."""
    builtins = [f for f in reward.functions if f in BUILTINS]
    missing = _column_errors(rows, data, builtins, key)
    if missing:
        return [], missing
    problems, errors = [], []
    for index, row in enumerate(rows.rows):
        try:
            problems.append(_problem(index, row, data, builtins, f"{key} {rows.name}: row {index} (0-based)"))
        except ConfigError as exc:
            errors.append(str(exc))
    return problems, errors


def _column_errors(rows: SourceRows, data: DataConfig, builtins: Sequence[str], key: str) -> list[str]:
    """One message per configured column the rows lack: the prompt column always, the answer column
    when a built-in reward reads it."""
    columns = ", ".join(rows.columns) or "none"
    errors = []
    if data.prompt_key not in rows.columns:
        errors.append(f"data.prompt_key = {data.prompt_key!r}: {key} {rows.name} has no such column (columns: "
                      f"{columns}); set data.prompt_key to the column holding the prompts")
    if builtins and data.answer_key not in rows.columns:
        errors.append(f"data.answer_key = {data.answer_key!r}: {key} {rows.name} has no such column (columns: "
                      f"{columns}), and the built-in reward {builtins[0]} reads it; set data.answer_key to the "
                      "gold answer's column, or use a reward function that needs none")
    return errors


def _problem(index: int, row: Mapping[str, Any], data: DataConfig, builtins: Sequence[str], where: str) -> Problem:
    """One row's Problem, or ConfigError naming `where` and what is wrong (rules: module docstring)."""
    cell = row[data.prompt_key]
    if isinstance(cell, str):
        if not cell.strip():
            raise DatasetError(f"{where}: the prompt (column {data.prompt_key!r}) is empty; fill it in or remove "
                               "the row")
    else:
        validate_messages(cell, f"{where}: column {data.prompt_key!r}")
    gold = row.get(data.answer_key)
    solution = "" if gold is None else str(gold)
    if not builtins:
        return Problem(index=index, question=cell, answer=solution, solution=solution, row=dict(row))
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise DatasetError(f"{where}: the answer (column {data.answer_key!r}) is {type(gold).__name__} "
                           f"{gold!r:.60}; the built-in reward {builtins[0]} needs text or a number")
    answer = solution
    if "gsm8k" in builtins:
        number = normalise_number(solution.strip()) or extract_answer(solution)
        if number is None:
            tail = solution.strip().splitlines()[-1] if solution.strip() else ""
            raise DatasetError(
                f"{where}: reward gsm8k needs the answer (column {data.answer_key!r}) to be a number or end "
                f"with a '#### <number>' line (last line: {tail[:60]!r}); end it with a line like '#### 42', "
                "or choose a reward that reads other answers (reward.functions = [\"math\"])")
        answer = number
    return Problem(index=index, question=cell, answer=answer, solution=solution, row=dict(row))
