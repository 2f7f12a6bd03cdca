"""The rollout lake: write protocol, committed-only views and schema evolution, on disk and S3."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rhymerl.config.run import RunConfig
from storage.lake import Lake, LakeError, LakeWriter, open_filesystem
from storage.schema import (
    ROLLOUTS_SCHEMA, RUNS_SCHEMA, SCHEMAS, STEPS_SCHEMA, SchemaError, column_docs, rows_to_table,
)


def _rows(run_id: str, epoch: int, step: int, n: int, start: int = 0) -> pa.Table:
    return rows_to_table([
        {"run_id": run_id, "epoch": epoch, "step": step, "prompt_id": f"p{i // 2}",
         "sample_idx": i, "response_token_ids": [1, 2, i], "logprobs": [-0.5, -0.25, -1.0],
         "reward": float(i % 2), "correct": i % 2 == 1, "length": 3, "finish_reason": "stop",
         "gen_start": 100.0, "gen_end": 101.5}
        for i in range(start, start + n)])


def _count(lake: Lake, table: str = "rollouts") -> int:
    return lake.sql(f"SELECT count(*) AS n FROM {table}").column("n")[0].as_py()


def test_write_commit_query_counts(lake_url: str) -> None:
    # Rule: after commit, every row of every listed file is visible once, per step.
    w = LakeWriter(lake_url)
    step0 = [w.write_rollouts("r1", 0, 0, worker, 0, _rows("r1", 0, 0, n, start=10 * worker))
             for worker, n in ((0, 3), (1, 2))]
    assert w.commit_step("r1", 0, 0, step0, stats={"reward_mean": 0.4}) is True
    step1 = [w.write_rollouts("r1", 0, 1, 0, 0, _rows("r1", 0, 1, 4))]
    assert w.commit_step("r1", 0, 1, step1) is True
    with Lake(lake_url) as lake:
        per_step = lake.sql("SELECT step, count(*) AS n FROM rollouts GROUP BY step ORDER BY step")
        assert per_step.to_pylist() == [{"step": 0, "n": 5}, {"step": 1, "n": 4}]
        assert lake.sql("SELECT sum(len(response_token_ids)) AS t FROM rollouts").column("t")[0].as_py() == 27
        assert [(m.step, m.rows, m.stats) for m in lake.manifests()] == [
            (0, 5, {"reward_mean": 0.4}), (1, 4, {})]


def test_uncommitted_rows_are_invisible(lake_url: str) -> None:
    # Rule: a step is visible only once its manifest exists (and after refresh()).
    w = LakeWriter(lake_url)
    key = w.write_rollouts("r1", 0, 0, 0, 0, _rows("r1", 0, 0, 3))
    with Lake(lake_url) as lake:
        assert _count(lake) == 0 and not w.is_committed("r1", 0, 0)
        w.commit_step("r1", 0, 0, [key])
        assert _count(lake) == 0  # views are a snapshot until refresh()
        lake.refresh()
        assert _count(lake) == 3 and w.is_committed("r1", 0, 0)


def test_recommit_is_a_noop(lake_url: str) -> None:
    # Rule: the first commit of a step wins; later commits add nothing, even with other files.
    w = LakeWriter(lake_url)
    first = w.write_rollouts("r1", 0, 0, 0, 0, _rows("r1", 0, 0, 3))
    assert w.commit_step("r1", 0, 0, [first]) is True
    extra = w.write_rollouts("r1", 0, 0, 0, 1, _rows("r1", 0, 0, 3))
    assert w.commit_step("r1", 0, 0, [first]) is False
    assert w.commit_step("r1", 0, 0, [first, extra]) is False
    with Lake(lake_url) as lake:
        assert _count(lake) == 3


def test_racing_commit_loses_even_past_the_check(lake_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rule: the create-if-absent manifest write, not the is_committed pre-check, makes it exactly once.
    w = LakeWriter(lake_url)
    first = w.write_rollouts("r1", 0, 0, 0, 0, _rows("r1", 0, 0, 2))
    second = w.write_rollouts("r1", 0, 0, 0, 1, _rows("r1", 0, 0, 2))
    assert w.commit_step("r1", 0, 0, [first]) is True
    monkeypatch.setattr(LakeWriter, "is_committed", lambda self, *key: False)  # both saw "absent"
    assert w.commit_step("r1", 0, 0, [second]) is False
    with Lake(lake_url) as lake:
        assert lake.manifests()[0].files == (first,) and _count(lake) == 2


def test_crashed_writer_then_retry_commits_exactly_once(lake_url: str) -> None:
    # Rule: data of an attempt that died before its manifest never shows; the retry counts once.
    w = LakeWriter(lake_url)
    orphan = w.write_rollouts("r1", 0, 0, 0, 0, _rows("r1", 0, 0, 4))  # attempt 0 dies here
    with Lake(lake_url) as lake:
        assert _count(lake) == 0
    retry = w.write_rollouts("r1", 0, 0, 0, 1, _rows("r1", 0, 0, 4))
    assert retry != orphan and "-a1-" in retry
    assert w.commit_step("r1", 0, 0, [retry]) is True
    assert w.commit_step("r1", 0, 0, [orphan]) is False  # a late straggler cannot add its rows
    with Lake(lake_url) as lake:
        got = lake.sql("SELECT count(*) AS n, count(DISTINCT sample_idx) AS d FROM rollouts")
        assert got.to_pylist() == [{"n": 4, "d": 4}]
        assert lake.manifests()[0].files == (retry,)


def test_old_file_without_new_column_reads_nulls(lake_url: str) -> None:
    # Rule: columns added later are nullable; an older file reads NULL in them (union_by_name).
    w = LakeWriter(lake_url)
    current = _rows("r1", 0, 0, 2)
    old = current.drop_columns(["gen_start", "gen_end"])  # as written before those columns existed
    old_key = "rollouts/run_id=r1/epoch=0/step=0/part-w0-a0-old.parquet"
    with w.fs.open(f"{w.root}/{old_key}", "wb") as f:
        pq.write_table(old, f)
    w.commit_step("r1", 0, 0, [old_key])
    with Lake(lake_url) as lake:
        only_old = lake.sql("SELECT gen_end FROM rollouts")
        assert only_old.column("gen_end").to_pylist() == [None, None]
        assert only_old.schema.field("gen_end").type == pa.float64()
        w.commit_step("r1", 0, 1, [w.write_rollouts("r1", 0, 1, 0, 0, _rows("r1", 0, 1, 2))])
        lake.refresh()
        mixed = lake.sql("SELECT step, gen_end FROM rollouts ORDER BY step, sample_idx").to_pylist()
        assert [(r["step"], r["gen_end"]) for r in mixed] == [(0, None), (0, None), (1, 101.5), (1, 101.5)]


def test_reward_values_query_by_function_name_and_read_null_in_older_files(tmp_path) -> None:
    # Rule (schema 6): reward_values is a map a query indexes by function name; a file written
    # before it existed (and a function a run did not have) reads NULL.
    lake_url = str(tmp_path / "lake")
    w = LakeWriter(lake_url)
    old_key = "rollouts/run_id=r1/epoch=0/step=0/part-w0-a0-old.parquet"
    with w.fs.open(f"{w.root}/{old_key}", "wb") as f:
        pq.write_table(_rows("r1", 0, 0, 1).drop_columns(["reward_values"]), f)
    w.commit_step("r1", 0, 0, [old_key])
    new = [{"run_id": "r1", "epoch": 0, "step": 1, "prompt_id": "p", "sample_idx": 0, "reward": 1.5, "correct": None,
            "reward_values": [("gsm8k", 1.0), ("brevity", 1.0)]}]
    w.commit_step("r1", 0, 1, [w.write_rollouts("r1", 0, 1, 0, 0, rows_to_table(new))])
    with Lake(lake_url) as lake:
        got = lake.sql("SELECT step, reward_values['brevity'] AS b, reward_values['math'] AS m, correct "
                       "FROM rollouts ORDER BY step").to_pylist()
        assert got == [{"step": 0, "b": None, "m": None, "correct": False},
                       {"step": 1, "b": 1.0, "m": None, "correct": None}]
        entries = lake.sql("SELECT reward_values FROM rollouts WHERE step = 1").to_pylist()
        assert entries == [{"reward_values": [("gsm8k", 1.0), ("brevity", 1.0)]}]


def test_empty_lake_gives_typed_empty_views(lake_url: str) -> None:
    # Rule: no committed data is an empty result with the schema's columns, not an error.
    with Lake(lake_url) as lake:
        for table, schema in (("rollouts", ROLLOUTS_SCHEMA), ("steps", STEPS_SCHEMA), ("runs", RUNS_SCHEMA)):
            got = lake.sql(f"SELECT * FROM {table}")
            assert got.num_rows == 0 and got.column_names == schema.names
        assert lake.sql("SELECT * FROM rollouts").schema.field("logprobs").type == pa.list_(pa.float32())


def test_steps_row_is_written_once(lake_url: str) -> None:
    # Rule: a retried step cannot add a second steps row (create-if-absent at a fixed key).
    w = LakeWriter(lake_url)
    assert w.write_steps_row("r1", 0, 0, {"reward_mean": 0.25, "tokens": 96, "total_s": 1.5}) is True
    assert w.write_steps_row("r1", 0, 0, {"reward_mean": 0.99}) is False
    with Lake(lake_url) as lake:
        rows = lake.sql("SELECT step, reward_mean, tokens, train_s FROM steps").to_pylist()
    assert rows == [{"step": 0, "reward_mean": 0.25, "tokens": 96, "train_s": None}]


def test_runs_view_shows_latest_state(lake_url: str) -> None:
    # Rule: the runs view keeps the latest state per run; finish_run keeps name and config.
    w = LakeWriter(lake_url)
    w.write_run("r1", "baseline", {"train": {"lr": 0.001}}, started_at=10.0)
    w.write_run("r2", "other", RunConfig(), started_at=20.0)
    w.finish_run("r1", "failed", ended_at=30.0)
    with Lake(lake_url) as lake:
        rows = lake.sql("SELECT run_id, name, config_json, started_at, ended_at, status FROM runs "
                        "ORDER BY run_id").to_pylist()
    assert json.loads(rows[1].pop("config_json"))["rollout"]["n"] == RunConfig().rollout.n
    assert rows == [
        {"run_id": "r1", "name": "baseline", "config_json": '{"train": {"lr": 0.001}}',
         "started_at": 10.0, "ended_at": 30.0, "status": "failed"},
        {"run_id": "r2", "name": "other", "started_at": 20.0, "ended_at": None, "status": "running"},
    ]


def test_manifest_lists_rows_and_checksums(tmp_path) -> None:
    # Rule: the manifest names each file with its row count and SHA-256, and is written last.
    w = LakeWriter(str(tmp_path))
    key = w.write_rollouts("r1", 2, 7, 3, 0, _rows("r1", 2, 7, 5))
    assert key.startswith("rollouts/run_id=r1/epoch=2/step=7/part-w3-a0-")
    w.commit_step("r1", 2, 7, [key])
    doc = json.loads((tmp_path / "_manifests/run_id=r1/epoch=2/step=7.json").read_text())
    data = (tmp_path / key).read_bytes()
    assert doc["rows"] == 5 and doc["files"][0]["rows"] == 5
    assert doc["files"][0]["sha256"] == hashlib.sha256(data).hexdigest()


def test_tampered_manifest_is_refused(tmp_path) -> None:
    # Rule: a manifest whose file list does not match its checksum is an error, not silent data.
    w = LakeWriter(str(tmp_path))
    w.commit_step("r1", 0, 0, [w.write_rollouts("r1", 0, 0, 0, 0, _rows("r1", 0, 0, 2))])
    path = tmp_path / "_manifests/run_id=r1/epoch=0/step=0.json"
    doc = json.loads(path.read_text())
    doc["files"][0]["rows"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(LakeError, match="checksum"):
        Lake(str(tmp_path))


def test_bad_inputs_name_the_problem(tmp_path) -> None:
    # Rule: every bad input is refused with a message naming the column, key or file.
    w = LakeWriter(str(tmp_path))
    with pytest.raises(SchemaError, match="'reward'"):
        rows_to_table([{"run_id": "r", "epoch": 0, "step": 0, "prompt_id": "p", "sample_idx": 0,
                        "reward": "high"}])
    with pytest.raises(SchemaError, match="'sample_idx' expects int32, got 1.5"):
        rows_to_table([{"run_id": "r", "epoch": 0, "step": 0, "prompt_id": "p", "sample_idx": 1.5}])
    with pytest.raises(SchemaError, match="'sample_idx' is required"):
        rows_to_table([{"run_id": "r", "epoch": 0, "step": 0, "prompt_id": "p"}])
    with pytest.raises(SchemaError, match="rewards"):
        rows_to_table([{"run_id": "r", "epoch": 0, "step": 0, "prompt_id": "p", "sample_idx": 0,
                        "rewards": 1.0}])
    with pytest.raises(SchemaError, match="'step' must be 0"):
        w.write_rollouts("r1", 0, 0, 0, 0, _rows("r1", 0, 1, 2))
    with pytest.raises(ValueError, match="run_id"):
        w.write_rollouts("a/b", 0, 0, 0, 0, _rows("a/b", 0, 0, 1))
    other = w.write_rollouts("r1", 0, 1, 0, 0, _rows("r1", 0, 1, 1))
    with pytest.raises(ValueError, match="not data files of step"):
        w.commit_step("r1", 0, 0, [other])
    with pytest.raises(LakeError, match="cannot commit"):
        w.commit_step("r1", 0, 0, ["rollouts/run_id=r1/epoch=0/step=0/part-missing.parquet"])


def test_local_paths_are_made_absolute(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rule: a relative lake path is resolved once, against the current directory.
    monkeypatch.chdir(tmp_path)
    _, root = open_filesystem("lake")
    assert root == os.path.join(str(tmp_path), "lake")


def test_unreachable_endpoint_fails_fast_without_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rule: a dead S3 endpoint is a LakeError within seconds naming the URL and the fix.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDUMMYVISIBLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dummy-secret-never-print")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    start = time.monotonic()
    with pytest.raises(LakeError) as info:
        LakeWriter("s3://some-bucket/lake")
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "s3://some-bucket/lake" in message and "AWS_ENDPOINT_URL" in message
    assert "dummy-secret-never-print" not in message


def test_every_column_is_documented() -> None:
    # Rule: each schema column carries a doc line in its field metadata.
    for schema in SCHEMAS.values():
        assert all(column_docs(schema).values()), schema.metadata


def test_storage_readme_documents_every_column() -> None:
    # Rule: each table's column list in storage/README.md matches its schema exactly, in order.
    text = (Path(__file__).resolve().parents[2] / "storage" / "README.md").read_text()
    for name, schema in SCHEMAS.items():
        section = text.split(f"\n### {name}\n", 1)[1].split("\n#", 1)[0]
        documented = re.findall(r"^\| `(\w+)` \|", section, flags=re.M)
        assert documented == schema.names, f"update the {name} table in storage/README.md"


def _eval_rows(run_id: str, epoch: int, n: int) -> list[dict]:
    return [{"run_id": run_id, "epoch": epoch, "global_step": max(epoch + 1, 0) * 2, "prompt_id": f"p{i}",
             "sample_idx": 0, "reward": float(i % 2), "reward_values": {"gsm8k": float(i % 2)},
             "correct": i % 2 == 1, "tokens": 5} for i in range(n)]


def test_each_evaluation_is_written_once(lake_url: str) -> None:
    # Rule: one file per (run, epoch boundary), created only if absent: a second write adds nothing.
    w = LakeWriter(lake_url)
    assert not w.has_eval("r1", -1)
    assert w.write_evals("r1", -1, _eval_rows("r1", -1, 3))
    assert not w.write_evals("r1", -1, _eval_rows("r1", -1, 4))
    assert w.write_evals("r1", 1, _eval_rows("r1", 1, 2)) and w.has_eval("r1", -1) and not w.has_eval("r1", 0)
    w.commit_step("r1", 0, 0, [w.write_rollouts("r1", 0, 0, 0, 0, _rows("r1", 0, 0, 2))])
    with Lake(lake_url) as lake:
        got = lake.sql("SELECT epoch, count(*) AS n, sum(reward_values['gsm8k']) AS g FROM evals "
                       "GROUP BY epoch ORDER BY epoch").to_pylist()
        assert got == [{"epoch": -1, "n": 3, "g": 1.0}, {"epoch": 1, "n": 2, "g": 1.0}]
        assert _count(lake) == 2  # evaluation samples are never rollouts
    with pytest.raises(SchemaError, match="epoch=0"):
        w.write_evals("r1", 0, _eval_rows("r1", 1, 1))
    with pytest.raises(ValueError, match="-1"):
        w.has_eval("r1", -2)


def test_manifest_from_before_schema_fingerprints_still_reads(tmp_path) -> None:
    # Rule: manifests written before per-file schema fingerprints existed stay readable.
    w = LakeWriter(str(tmp_path))
    for step in (0, 1):
        w.commit_step("r1", 0, step, [w.write_rollouts("r1", 0, step, 0, 0, _rows("r1", 0, step, 2))])
    path = tmp_path / "_manifests/run_id=r1/epoch=0/step=0.json"
    doc = json.loads(path.read_text())
    for entry in doc["files"]:
        del entry["schema"]
    doc["checksum"] = hashlib.sha256(json.dumps(doc["files"], sort_keys=True, separators=(",", ":"))
                                     .encode()).hexdigest()
    path.write_text(json.dumps(doc))
    with Lake(str(tmp_path)) as lake:
        assert [m.entries[0].schema is None for m in lake.manifests()] == [True, False]
        assert _count(lake) == 4
