"""Versioned Arrow schemas of the rollout lake, and conversion of plain rows into them.

Four tables live in the lake (see `storage/lake.py` for the layout and write protocol):

- `rollouts`: one row per generated response (the data draft indexes and length forecasts read).
- `steps`: one row per training step (stage timings and batch statistics).
- `runs`: one row per run state change (the `runs` view keeps the latest per run).
- `evals`: one row per held-out evaluation sample (`eval.*`; never trained on, never in HistoSpec's history).

Every column carries a `doc` entry in its field metadata; `column_docs(schema)` returns them.
Each schema has a `schema_version` in its metadata and as an int16 column in every file.

Evolution rule: a new version may only ADD nullable columns (never rename, retype or drop).
Readers scan the files of each schema (its `schema_fingerprint`, recorded in the step manifest)
together and combine the scans by column name under the current schema as a typed template, so
an older file simply reads NULL in the columns it lacks. Times are float64 unix seconds throughout.
"""

from __future__ import annotations

import hashlib
import numbers
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

# 1: the first schemas. 2: steps gain speculative-decoding (spec_*) and scheduling (bubble_ratio,
# makespan_s, forecast_*) columns. 3: rollouts gain HistoPipe migration columns (migrations,
# migrated_from_worker, migrated_at); steps gain reward_total_s and migrations. 4: steps gain
# logprob_abs_diff (engine vs trainer log-probs of the sampled tokens). 5: steps gain
# spec_steps_by_response_pos and spec_tokens_by_response_pos (verification by response position).
# 6: the evals table (held-out evaluation samples); rollouts gain reward_values (each reward function's
# value); `correct` is NULL when no function judges correctness, and `formatted` is no longer written (NULL).
# 7: steps gain the goodput controller's spec_proposed, spec_step_predicted_s and spec_step_measured_s.
SCHEMA_VERSION = 7


class SchemaError(ValueError):
    """Data does not fit a lake schema; the message names the column and what it accepts."""


def _col(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


def _schema(table: str, fields: list[pa.Field]) -> pa.Schema:
    version = _col("schema_version", pa.int16(), "Version of this table's schema the row was written with.",
                   nullable=False)
    return pa.schema([*fields, version], metadata={"table": table, "schema_version": str(SCHEMA_VERSION)})


ROLLOUTS_SCHEMA = _schema("rollouts", [
    _col("run_id", pa.string(), "Run that generated the response.", nullable=False),
    _col("epoch", pa.int32(), "Epoch (0-based pass over the prompt set).", nullable=False),
    _col("step", pa.int32(), "Training step, as numbered by the training flow.", nullable=False),
    _col("prompt_id", pa.string(), "prompt_id_of(prompt token ids): stable 16-hex id.", nullable=False),
    _col("prompt_index", pa.int32(), "Position of the problem in the dataset."),
    _col("prompt_text", pa.string(), "Prompt as rendered by the template."),
    _col("sample_idx", pa.int32(), "Index of the response within its prompt's group (0..n-1).",
         nullable=False),
    _col("response_token_ids", pa.list_(pa.int32()), "Sampled token ids, without the prompt."),
    _col("response_text", pa.string(), "Detokenized response."),
    _col("logprobs", pa.list_(pa.float32()), "Engine log-prob of each sampled token (same length) under the "
         "sampling distribution (logits / temperature, nucleus renormalised: vLLM processed_logprobs)."),
    _col("reward", pa.float32(), "Reward trained on: the weighted sum of reward_values (reward.weights)."),
    _col("correct", pa.bool_(), "Every reward function that judges correctness said correct (gsm8k, math); "
         "NULL when none judges it."),
    _col("formatted", pa.bool_(), "Response ended with a '#### <number>' line (the GSM8K rule); NULL from "
         "schema 6 on (gsm8k's value in reward_values says whether it was right)."),
    _col("reward_values", pa.map_(pa.string(), pa.float64()),
         "Each reward function's value by its name (reward.functions), e.g. reward_values['gsm8k']; "
         "NULL before schema 6."),
    _col("length", pa.int32(), "Number of response tokens."),
    _col("finish_reason", pa.string(), "'stop' (EOS or stop string) or 'length' (hit max_tokens)."),
    _col("policy_version", pa.int32(), "Version of the weights that generated the response."),
    _col("worker_id", pa.int32(), "Rollout worker (engine) that generated the response."),
    _col("gen_start", pa.float64(), "Unix seconds when the request was admitted."),
    _col("gen_end", pa.float64(), "Unix seconds when the response finished."),
    _col("migrations", pa.int16(), "Times the request moved to another worker mid-generation (0 or 1; "
         "NULL before schema 3)."),
    _col("migrated_from_worker", pa.int32(), "Worker that generated the response's prefix before it "
         "moved to worker_id (NULL: never moved)."),
    _col("migrated_at", pa.float64(), "Unix seconds when the prefix moved to worker_id (NULL: never moved)."),
])

STEPS_SCHEMA = _schema("steps", [
    _col("run_id", pa.string(), "Run the step belongs to.", nullable=False),
    _col("epoch", pa.int32(), "Epoch of the step.", nullable=False),
    _col("step", pa.int32(), "Training step, as numbered by the training flow.", nullable=False),
    _col("rollout_s", pa.float64(), "Seconds spent generating responses."),
    _col("reward_s", pa.float64(), "Seconds the step waited for scores after its rollout (critical path)."),
    _col("reward_total_s", pa.float64(), "Seconds of reward compute, summed over scoring chunks (most of it "
         "overlaps the rollout)."),
    _col("train_s", pa.float64(), "Seconds spent in the policy update."),
    _col("sync_s", pa.float64(), "Seconds spent pushing new weights to the rollout workers."),
    _col("lake_s", pa.float64(), "Seconds spent writing and committing the step's rollouts."),
    _col("total_s", pa.float64(), "Wall-clock seconds of the whole step."),
    _col("reward_mean", pa.float64(), "Mean reward over the step's responses."),
    _col("accuracy", pa.float64(), "Fraction of the step's responses that were correct."),
    _col("length_mean", pa.float64(), "Mean response length in tokens."),
    _col("length_max", pa.int32(), "Longest response in tokens."),
    _col("tokens", pa.int64(), "Response tokens generated in the step."),
    _col("tokens_per_s", pa.float64(), "tokens / rollout_s."),
    _col("policy_version", pa.int32(), "Version of the weights that generated the step's responses."),
    _col("committed_at", pa.float64(), "Unix seconds when the row was written."),
    _col("spec_method", pa.string(), "Speculative drafter of the step ('histospec', 'ngram'); NULL: off."),
    _col("spec_steps", pa.int64(), "Verification steps (engine decode steps summed over requests)."),
    _col("spec_tokens", pa.int64(), "Tokens emitted by those steps (accepted drafts + 1 each)."),
    _col("spec_drafted", pa.int64(), "Draft tokens verified (what the goodput controller kept of spec_proposed)."),
    _col("spec_accepted", pa.int64(), "Draft tokens accepted by the verifier."),
    _col("spec_mean_accepted_length", pa.float64(),
         "spec_tokens / spec_steps: tokens per verification step, bonus token counted."),
    _col("spec_acceptance_by_pos", pa.list_(pa.float32()),
         "[j]: share of drafts reaching position j whose token j was accepted."),
    _col("spec_steps_by_response_pos", pa.list_(pa.int64()),
         "[b]: verification steps that came after [0,100), [100,300), [300,1000), 1000+ response tokens "
         "(b = 0..3; HistoSpec only, NULL otherwise)."),
    _col("spec_tokens_by_response_pos", pa.list_(pa.int64()),
         "[b]: tokens those steps emitted; / spec_steps_by_response_pos[b]: tokens per verification "
         "at that response position."),
    _col("spec_proposed", pa.int64(), "Draft tokens the drafter proposed before the goodput controller trimmed "
         "them (NULL before schema 7)."),
    _col("spec_step_predicted_s", pa.float64(), "Mean seconds per engine step the goodput controller forecast for "
         "the steps it shaped (NULL: controller off or before schema 7)."),
    _col("spec_step_measured_s", pa.float64(), "Mean measured seconds of those engine steps: beside "
         "spec_step_predicted_s, how well the controller's cost fit holds."),
    _col("spec_drafter_s", pa.float64(), "Seconds the drafter spent proposing (summed over workers)."),
    _col("spec_history_s", pa.float64(),
         "Seconds to cut the step's per-worker HistoSpec bundles (summed over workers; prepared during "
         "the previous step except an epoch's first)."),
    _col("bubble_ratio", pa.float64(), "Idle share of worker time while the step's rollout ran."),
    _col("makespan_s", pa.float64(), "Seconds from the first admission to the last finish."),
    _col("migrations", pa.int32(), "Requests moved to an idle worker in the step's tail (HistoPipe tier 2)."),
    _col("logprob_abs_diff", pa.float64(), "Mean |engine - trainer| log-prob of the step's sampled tokens "
         "before its update: ~0 when engine and trainer hold the same weights and sampling settings."),
    _col("forecast_spearman", pa.float64(), "Rank correlation of forecast and actual mean lengths."),
    _col("forecast_moved_fraction", pa.float64(),
         "Prompts whose forecast and actual length percentiles differ by > 25 points."),
])

RUNS_SCHEMA = _schema("runs", [
    _col("run_id", pa.string(), "Unique run id (also the lake partition key).", nullable=False),
    _col("name", pa.string(), "Human-readable run name."),
    _col("config_json", pa.string(), "The whole run config as JSON."),
    _col("started_at", pa.float64(), "Unix seconds when the run started."),
    _col("ended_at", pa.float64(), "Unix seconds when the run ended (NULL while running)."),
    _col("status", pa.string(), "'running', 'finished', 'failed' or 'killed'."),
    _col("updated_at", pa.float64(), "Unix seconds when this state was written (latest wins).",
         nullable=False),
])

EVALS_SCHEMA = _schema("evals", [
    _col("run_id", pa.string(), "Run that evaluated.", nullable=False),
    _col("epoch", pa.int32(), "The epoch after which the evaluation ran; -1: before the first epoch.",
         nullable=False),
    _col("global_step", pa.int32(), "Training steps done when the evaluation ran (the MLflow step of its eval/* "
         "metrics).", nullable=False),
    _col("policy_version", pa.int32(), "Version of the weights that generated the response."),
    _col("prompt_id", pa.string(), "prompt_id_of(prompt token ids): stable 16-hex id.", nullable=False),
    _col("prompt_index", pa.int32(), "Position of the problem in the eval dataset."),
    _col("prompt_text", pa.string(), "Prompt as rendered by the template."),
    _col("sample_idx", pa.int32(), "Index of the response among its prompt's eval.n samples.", nullable=False),
    _col("response_text", pa.string(), "Detokenized response."),
    _col("tokens", pa.int32(), "Number of response tokens."),
    _col("finish_reason", pa.string(), "'stop' (EOS or stop string) or 'length' (hit max_tokens)."),
    _col("reward", pa.float64(), "Weighted sum of the reward functions' values."),
    _col("reward_values", pa.map_(pa.string(), pa.float64()),
         "Each reward function's value by its name (reward_values['gsm8k'])."),
    _col("correct", pa.bool_(), "Every reward function that judges answers said correct; NULL: none judges."),
    _col("worker_id", pa.int32(), "Rollout worker (engine) that generated the response."),
    _col("evaluated_at", pa.float64(), "Unix seconds when the evaluation's row file was written."),
])

SCHEMAS: dict[str, pa.Schema] = {"rollouts": ROLLOUTS_SCHEMA, "steps": STEPS_SCHEMA, "runs": RUNS_SCHEMA,
                                 "evals": EVALS_SCHEMA}


def schema_fingerprint(schema: pa.Schema) -> str:
    """A stable 16-hex id of a schema's column names and types (metadata ignored).

    Files with equal fingerprints can be read as one DuckDB scan without union_by_name.
    """
    text = ";".join(f"{f.name}:{f.type}" for f in schema)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def column_docs(schema: pa.Schema) -> dict[str, str]:
    """Column name -> its documentation line."""
    return {f.name: (f.metadata or {}).get(b"doc", b"").decode() for f in schema}


def _table_name(schema: pa.Schema) -> str:
    return (schema.metadata or {}).get(b"table", b"table").decode()


def _integer_items(values: list[Any], type_: pa.DataType) -> Iterable[Any]:
    """The values that must be integers: scalars of an int column, elements of a list<int> one."""
    if pa.types.is_integer(type_):
        return values
    if pa.types.is_list(type_) and pa.types.is_integer(type_.value_type):
        return (x for v in values if v is not None and not isinstance(v, str) for x in v)
    return ()


def _column_array(name: str, values: list[Any], field: pa.Field, table: str) -> pa.Array:
    # Arrow would silently truncate 1.5 to 1 in an int column; refuse instead.
    for x in _integer_items(values, field.type):
        if x is not None and (isinstance(x, bool) or not isinstance(x, numbers.Integral)):
            raise SchemaError(f"{table}: column '{name}' expects {field.type}, got {x!r}; "
                              "pass whole numbers")
    if not field.nullable and any(v is None for v in values):
        row = next(i for i, v in enumerate(values) if v is None)
        raise SchemaError(f"{table}: column '{name}' is required but row {row} has no value; "
                          f"give every row a {field.type} '{name}'")
    try:
        return pa.array(values, type=field.type, from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise SchemaError(f"{table}: column '{name}' expects {field.type}: {exc}") from exc


def _check_names(names: Sequence[str], schema: pa.Schema) -> None:
    unknown = [n for n in names if schema.get_field_index(n) < 0]
    if unknown:
        raise SchemaError(f"{_table_name(schema)}: unknown column(s) {unknown}; allowed columns: "
                          f"{', '.join(schema.names)} (add new columns to storage/schema.py first)")


def rows_to_table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema = ROLLOUTS_SCHEMA) -> pa.Table:
    """Build a table of `schema` from dict rows.

    Missing nullable keys become NULL; `schema_version` is filled in. Unknown keys, a missing
    required key or a value of the wrong type raise SchemaError naming the column.
    """
    names = {k for row in rows for k in row}
    _check_names(sorted(names), schema)
    table = _table_name(schema)
    arrays = []
    for field in schema:
        if field.name == "schema_version":
            arrays.append(pa.array([SCHEMA_VERSION] * len(rows), type=pa.int16()))
            continue
        arrays.append(_column_array(field.name, [row.get(field.name) for row in rows], field, table))
    return pa.Table.from_arrays(arrays, schema=schema)


def conform_table(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """Return `data` cast to `schema`: columns reordered, missing nullable ones NULL, version set.

    Only safe casts are allowed (int64 -> int32 if the values fit, never float -> int truncation).
    """
    _check_names(data.column_names, schema)
    table = _table_name(schema)
    arrays = []
    for field in schema:
        if field.name == "schema_version":
            arrays.append(pa.array([SCHEMA_VERSION] * data.num_rows, type=pa.int16()))
        elif field.name not in data.column_names:
            arrays.append(_column_array(field.name, [None] * data.num_rows, field, table))
        else:
            column = data.column(field.name)
            if not field.nullable and column.null_count:
                raise SchemaError(f"{table}: column '{field.name}' is required but has "
                                  f"{column.null_count} NULL value(s)")
            try:
                arrays.append(column.cast(field.type, safe=True))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(f"{table}: column '{field.name}' has type {column.type}, "
                                  f"expected {field.type}: {exc}") from exc
    return pa.Table.from_arrays(arrays, schema=schema)
