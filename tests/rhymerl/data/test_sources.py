"""Dataset sources: every file kind, lists, globs, save_to_disk folders and s3, with their errors."""

import json
from pathlib import Path
import random

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rhymerl.data.sources import check_columns, load_rows, pick_rows
from rhymerl.errors import ConfigError

ROWS = [{"question": "1+1", "answer": "2", "level": 1}, {"question": "2+3", "answer": "5", "level": 2}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_save_to_disk(folder, shards):
    """The folder `datasets.Dataset.save_to_disk` writes: Arrow IPC stream shards and state.json."""
    folder.mkdir()
    names = [f"data-{i:05d}-of-{len(shards):05d}.arrow" for i in range(len(shards))]
    for name, rows in zip(names, shards):
        table = pa.Table.from_pylist(rows)
        with pa.ipc.new_stream(folder / name, table.schema) as writer:
            writer.write_table(table)
    (folder / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": n} for n in names], "_fingerprint": "0", "_format_columns": None,
        "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False, "_split": None}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return folder


# ---------------------------------------------------------------- kinds


def test_jsonl_keeps_every_column_and_skips_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n")
    src = load_rows(str(path))
    assert src.rows == tuple(ROWS) and src.columns == ("question", "answer", "level")


@pytest.mark.parametrize("payload", [ROWS, {"data": ROWS}])
def test_json_is_a_list_or_a_data_field(tmp_path, payload):
    (tmp_path / "d.json").write_text(json.dumps(payload))
    assert load_rows(str(tmp_path / "d.json")).rows == tuple(ROWS)


def test_parquet(tmp_path):
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    assert load_rows(str(tmp_path / "d.parquet")).rows == tuple(ROWS)


def test_save_to_disk_folder_reads_its_shards_in_order(tmp_path):
    folder = write_save_to_disk(tmp_path / "ds", [[ROWS[1]], [ROWS[0]]])
    assert load_rows(str(folder)).rows == (ROWS[1], ROWS[0])


def test_list_and_glob(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ROWS[:1])
    write_jsonl(tmp_path / "b.jsonl", ROWS[1:])
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "c.parquet")
    assert load_rows(str(tmp_path / "*.jsonl")).rows == tuple(ROWS)  # sorted matches
    both = load_rows([str(tmp_path / "c.parquet"), str(tmp_path / "a.jsonl")])
    assert both.rows == (*ROWS, ROWS[0]) and both.name.startswith("[")


def test_s3_with_storage_options(s3_server):
    opts = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": s3_server.url,
                                                                     "region_name": "us-east-1"}}
    fs = fsspec.filesystem("s3", **opts)
    base = f"{s3_server.bucket}/sources-test"
    fs.pipe(f"{base}/a.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    with fs.open(f"{base}/p/b.parquet", "wb") as f:
        pq.write_table(pa.Table.from_pylist(ROWS[:1]), f)
    assert load_rows(f"s3://{base}/a.jsonl", opts).rows == tuple(ROWS)
    assert load_rows([f"s3://{base}/*.jsonl", f"s3://{base}/p/*.parquet"], opts).rows == (*ROWS, ROWS[0])
    with pytest.raises(ConfigError, match=r"data.dataset: the glob s3://.*/none/\*.jsonl matches nothing"):
        load_rows(f"s3://{base}/none/*.jsonl", opts)


# ---------------------------------------------------------------- errors


def bad_sources(tmp: Path):
    """(source, message) pairs: each bad source and the error naming it and the fix."""
    (tmp / "empty.jsonl").write_text("\n\n")
    (tmp / "junk.parquet").write_bytes(b"not parquet at all")
    (tmp / "d.csv").write_text("question,answer\n")
    (tmp / "badline.jsonl").write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    (tmp / "notobj.jsonl").write_text("[1, 2]\n")
    (tmp / "mixed.jsonl").write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"question": "q"}) + "\n")
    (tmp / "shape.json").write_text(json.dumps({"rows": ROWS}))
    write_jsonl(tmp / "one.jsonl", ROWS)
    write_jsonl(tmp / "other.jsonl", [{"prompt": "p", "answer": "a"}])
    (tmp / "dict").mkdir()
    (tmp / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    (tmp / "plain").mkdir()
    return [
        (tmp / "nope.jsonl", r"data.dataset: .*nope.jsonl does not exist; fix the path"),
        (tmp / "*.nothing", r"the glob .*\*.nothing matches nothing"),
        (tmp / "empty.jsonl", r"empty.jsonl is empty \(no rows\)"),
        (tmp / "junk.parquet", r"junk.parquet cannot be read as parquet: .*check that the file is complete"),
        (tmp / "d.csv", r"d.csv: unsupported file type; use .jsonl, .json, .parquet"),
        (tmp / "badline.jsonl", r"badline.jsonl line 2 is not valid JSON"),
        (tmp / "notobj.jsonl", r"notobj.jsonl line 1 is a JSON list, not an object"),
        (tmp / "mixed.jsonl", r"mixed.jsonl: mixed columns: line 2 has no columns \['answer', 'level'\] "
                              r"compared with line 1"),
        (tmp / "shape.json", r"shape.json must hold a list of JSON objects, or \{\"data\": \[objects\]\}"),
        ([str(tmp / "one.jsonl"), str(tmp / "other.jsonl")],
         r"mixed columns: .*other.jsonl has extra columns \['prompt'\]; no columns \['level', 'question'\]"),
        (tmp / "dict", r"holds a DatasetDict \(splits: train, test\); name one split's folder, e.g. .*dict/train"),
        (tmp / "plain", r"is a folder but not one written by datasets' save_to_disk"),
        ([], r"give a path, URL or glob"),
    ]


def test_every_bad_source_names_itself_and_the_fix(tmp_path):
    cases = bad_sources(tmp_path)
    assert len(cases) >= 12
    for source, message in cases:
        with pytest.raises(ConfigError, match=message):
            load_rows(source if isinstance(source, list) else str(source))


def test_missing_columns_name_the_setting_and_list_the_columns(tmp_path):
    src = load_rows(str(write_jsonl(tmp_path / "d.jsonl", ROWS)))
    check_columns(src, {"data.prompt_key": "question", "data.answer_key": "answer"})
    with pytest.raises(ConfigError, match=r"^data.answer_key = 'solution': missing column 'solution' in "
                                          r".*d.jsonl; columns are: question, answer, level$"):
        check_columns(src, {"data.prompt_key": "question", "data.answer_key": "solution"})


# ---------------------------------------------------------------- picking prompts


def test_pick_rows_shuffles_by_seed_with_stable_ids():
    rows = [f"r{i}" for i in range(10)]
    order = list(range(10))
    random.Random(7).shuffle(order)  # the rule: indices shuffled by random.Random(seed)
    picked = pick_rows(rows, 4, seed=7)
    assert picked == [(i, f"r{i}") for i in order[:4]]
    assert pick_rows(rows, 0, seed=7) == [(i, f"r{i}") for i in order]  # 0: every row
    assert sorted(pick_rows(rows, 0, seed=8)) == [(i, f"r{i}") for i in range(10)]


@pytest.mark.parametrize("n, message", [(11, r"data.num_prompts = 11 but d has 10 rows; set data.num_prompts "
                                             r"to at most 10, or 0 for every row"),
                                        (-1, r"data.num_prompts = -1: give a count >= 1, or 0 for every row")])
def test_pick_rows_errors(n, message):
    with pytest.raises(ConfigError, match=message):
        pick_rows(list(range(10)), n, seed=0, name="d")
