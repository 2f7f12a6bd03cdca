"""Training problems: load them (built-in task or a GSM8K-format file) and render them to prompts.

A dataset file is JSONL (one JSON object per line) or Parquet, with string fields `question` and
`answer`; the answer is a worked solution whose last non-empty line is ``#### <number>``
(the format rule of `rhymerl.data.reward`). Every row is checked before any is used, so a bad row is
reported the same way whatever the seed or `num_prompts`. Errors are `DatasetError`s that name
the file, the line (JSONL, 1-based as editors count) or row (Parquet, 0-based) and the fix.

Choices:
* Blank lines in JSONL are skipped and do not count as rows.
* `Problem.index` is the row's 0-based position among the file's rows, so it is stable across
  seeds and identifies the row for error messages and the lake.
* A file with fewer rows than `num_prompts` is an error (not a warning): `num_prompts` sets the
  steps per epoch, so silently training on fewer prompts would misreport the run.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence

from rhymerl.config.task import DataConfig
from rhymerl.data.reward import extract_answer
from rhymerl.data.records import Problem, Prompt, prompt_id_of

log = logging.getLogger(__name__)

_FIELDS = ("question", "answer")
BUILTIN_DATASETS = ("builtin", "builtin-long")  # data.dataset values that name a built-in task


class DatasetError(ValueError):
    """A dataset file or row is unusable; the message names the file, the row and the fix."""


# ---------------------------------------------------------------- loading


def load_problems(cfg: DataConfig) -> list[Problem]:
    """The first `cfg.num_prompts` problems after a `random.Random(cfg.seed)` shuffle of the rows.

    `cfg.dataset == "builtin"` delegates to `rhymerl.data.builtin.builtin_problems`, "builtin-long"
    (the long-tail task) to `rhymerl.data.long.long_problems`; otherwise it is a path to a
    `.jsonl` or `.parquet` file (see the module docstring for the format).
    """
    if cfg.dataset == "builtin":
        from rhymerl.data.builtin import builtin_problems

        return builtin_problems(num=cfg.num_prompts, seed=cfg.seed)
    if cfg.dataset == "builtin-long":
        from rhymerl.data.long import long_problems

        return long_problems(num=cfg.num_prompts, seed=cfg.seed)
    path = Path(cfg.dataset)
    problems = read_problem_file(path)
    if len(problems) < cfg.num_prompts:
        raise DatasetError(
            f"dataset {path} has {len(problems)} rows but data.num_prompts={cfg.num_prompts}; "
            f"set data.num_prompts to at most {len(problems)} or use a larger file"
        )
    order = list(range(len(problems)))
    random.Random(cfg.seed).shuffle(order)
    return [problems[i] for i in order[: cfg.num_prompts]]


def read_problem_file(path: Path) -> list[Problem]:
    """Every row of a `.jsonl` or `.parquet` GSM8K-format file, in file order, all validated.

    Raises the first DatasetError met (`dataset_errors` lists them all).
    """
    problems = []
    for item in _checked_rows(path):
        if isinstance(item, DatasetError):
            raise item
        problems.append(item)
    if not problems:
        raise DatasetError(
            f"dataset file {path} has no rows; add rows with fields 'question' and 'answer' "
            "(the answer ending in '#### <number>')"
        )
    return problems


def dataset_errors(cfg: DataConfig, limit: int = 20) -> list[str]:
    """Every problem of `cfg`'s dataset, one message per bad row (file and line), without raising.

    At most `limit` messages, then one saying how many more; [] when the dataset loads as
    `load_problems` would load it. The built-in tasks have no file and are always fine.
    """
    if cfg.dataset in BUILTIN_DATASETS:
        return []
    path = Path(cfg.dataset)
    errors: list[str] = []
    rows = 0
    try:
        for item in _checked_rows(path):
            if isinstance(item, DatasetError):
                errors.append(str(item))
            else:
                rows += 1
    except DatasetError as exc:  # the file itself: missing, unreadable, wrong columns
        return [str(exc)]
    except OSError as exc:  # e.g. no permission to read it
        return [f"dataset file {path} cannot be read ({exc}); fix its permissions or set data.dataset"]
    if not errors and rows == 0:
        return [f"dataset file {path} has no rows; add rows with fields 'question' and 'answer' "
                "(the answer ending in '#### <number>')"]
    if not errors and rows < cfg.num_prompts:
        return [f"dataset {path} has {rows} rows but data.num_prompts={cfg.num_prompts}; "
                f"set data.num_prompts to at most {rows} or use a larger file"]
    if len(errors) > limit:
        errors = errors[:limit] + [f"dataset file {path}: {len(errors) - limit} more bad rows not shown"]
    return errors


def _checked_rows(path: Path) -> Iterator[Problem | DatasetError]:
    """Each row of the file as a Problem, or the DatasetError that names what is wrong with it.

    Raises DatasetError for the file as a whole (missing, unknown extension, unreadable Parquet).
    """
    if not path.is_file():
        raise DatasetError(
            f"dataset file {path} does not exist; set data.dataset to an existing .jsonl or "
            ".parquet file, or to 'builtin' or 'builtin-long'"
        )
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = _jsonl_rows(path)
    elif suffix == ".parquet":
        rows = _parquet_rows(path)
    else:
        raise DatasetError(
            f"dataset file {path} has unknown extension {path.suffix!r}; use a .jsonl file "
            "(one JSON object per line) or a .parquet file, with fields 'question' and 'answer'"
        )
    for index, (where, row) in enumerate(rows):
        if isinstance(row, DatasetError):  # a line that is not JSON
            yield row
            continue
        try:
            yield _problem_from_row(row, where, index)
        except DatasetError as exc:
            yield exc


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, parsed object) for each non-blank line; location reads 'file X line N'.

    A line that is not JSON comes back as (location, DatasetError) so the lines after it are
    still checked.
    """
    with path.open("rb") as f:  # bytes: a line that is not UTF-8 is one bad row, not a crash
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"dataset file {path} line {lineno}"
            yield where, _parse_line(raw, where)


def _parse_line(raw: bytes, where: str) -> Any:
    """The JSON value of one JSONL line, or a DatasetError naming what is wrong with it."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return DatasetError(f"{where} is not UTF-8 text (byte {exc.start}); save the file as UTF-8")
    except json.JSONDecodeError as exc:
        return DatasetError(
            f"{where} is not valid JSON ({exc.msg} at column {exc.colno}); write one JSON "
            'object per line, e.g. {"question": "...", "answer": "... #### 42"}'
        )


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, row dict) for each row; location reads 'file X row N (0-based)'."""
    import pyarrow as pa  # lazy: only Parquet datasets need it
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(
            f"dataset file {path} could not be read as Parquet ({exc}); check that it is a "
            "Parquet file, or convert it to JSONL"
        ) from exc
    for name in _FIELDS:
        if name not in table.column_names:
            raise DatasetError(
                f"dataset file {path} has no column '{name}' (columns: "
                f"{', '.join(table.column_names) or 'none'}); add string columns 'question' "
                "and 'answer'"
            )
    for rowno, row in enumerate(table.select(list(_FIELDS)).to_pylist()):
        yield f"dataset file {path} row {rowno} (0-based)", row


def _problem_from_row(row: Any, where: str, index: int) -> Problem:
    """Validate one row's fields and build its Problem (`where` names the file and row)."""
    if not isinstance(row, dict):
        raise DatasetError(
            f"{where} is a JSON {type(row).__name__}, not an object; write "
            '{"question": "...", "answer": "... #### 42"}'
        )
    for name in _FIELDS:
        if name not in row:
            raise DatasetError(f"{where} has no field '{name}'; every row needs string fields "
                               "'question' and 'answer'")
        if not isinstance(row[name], str):
            raise DatasetError(f"{where}: field '{name}' is {type(row[name]).__name__} "
                               f"({row[name]!r}), not a string; store it as text")
    question, solution = row["question"], row["answer"]
    if not question.strip():
        raise DatasetError(f"{where}: field 'question' is empty; remove the row or fill it in")
    gold = extract_answer(solution)
    if gold is None:
        tail = solution.strip().splitlines()[-1] if solution.strip() else ""
        raise DatasetError(
            f"{where}: field 'answer' does not end with a '#### <number>' line (last line: "
            f"{tail[:80]!r}); end the answer with a line like '#### 42'"
        )
    return Problem(index=index, question=question, answer=gold, solution=solution, row=dict(row))


# ---------------------------------------------------------------- rendering


def render_prompts(
    problems: Sequence[Problem],
    template: str,
    encode: Callable[[str], list[int]],
    max_prompt_tokens: int,
    on_long: Literal["skip", "error"],
) -> tuple[list[Prompt], list[Problem]]:
    """Fill the template, tokenize, and split into (kept prompts, skipped problems).

    Only the literal text "{question}" in `template` is replaced (every occurrence); other braces
    stay as written, so braces in questions or templates are safe. A prompt longer than
    `max_prompt_tokens` is skipped (`on_long="skip"`) or raises DatasetError (`"error"`).
    A prompt whose token ids equal an earlier kept prompt's would share its `prompt_id`, so it is
    dropped with a warning and returned among the skipped: kept and skipped together hold every
    input problem exactly once, in input order.
    """
    _check_render_args(template, max_prompt_tokens, on_long)
    kept: list[Prompt] = []
    skipped: list[Problem] = []
    first_index: dict[str, int] = {}  # prompt_id -> index of the problem that claimed it
    n_long = 0
    for problem in problems:
        text = template.replace("{question}", problem.question)
        token_ids = tuple(int(t) for t in encode(text))
        if not token_ids:
            raise DatasetError(f"problem {problem.index} encodes to zero tokens; check the "
                               "tokenizer and data.prompt_template")
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


def _check_render_args(template: str, max_prompt_tokens: int, on_long: str) -> None:
    if "{question}" not in template:
        raise DatasetError("prompt template must contain the placeholder {question}; "
                           "set data.prompt_template to e.g. '{question}\\n'")
    if max_prompt_tokens < 1:
        raise DatasetError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}; raise "
                           "model.max_model_len or lower rollout.max_tokens")
    if on_long not in ("skip", "error"):
        raise DatasetError(f"on_long must be 'skip' or 'error', got {on_long!r}")
