"""The README's plain-DuckDB one-liner works on a lake the writer made (no RhymeRL code in the read)."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest

from storage.lake import LakeWriter, rows_to_table

DUCKDB = Path(sys.executable).parent / "duckdb"  # from the duckdb-cli package, in the venv
ONE_LINER = ("SELECT epoch, count(*) AS n, avg(reward) AS r FROM read_parquet('lake/rollouts/**/*.parquet', "
             "hive_partitioning=true) GROUP BY epoch ORDER BY epoch")


@pytest.mark.skipif(not DUCKDB.exists(), reason="duckdb-cli is not installed in this environment")
def test_plain_duckdb_reads_the_lake(tmp_path):
    w = LakeWriter(str(tmp_path / "lake"))
    for epoch, rewards in ((0, [0.0, 1.0, 0.0]), (1, [1.0, 1.0])):
        table = rows_to_table([{"run_id": "r", "epoch": epoch, "step": 0, "prompt_id": "p", "sample_idx": i,
                                "reward": x} for i, x in enumerate(rewards)])
        w.commit_step("r", epoch, 0, [w.write_rollouts("r", epoch, 0, 0, 0, table)])
    out = subprocess.run([str(DUCKDB), "-csv", "-c", ONE_LINER], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["epoch"], r["n"], float(r["r"])) for r in rows] == [("0", "3", pytest.approx(1 / 3)),
                                                                    ("1", "2", 1.0)]
