"""`rhymerl lake sql | summary | verify` on a local folder and on S3 (moto)."""

from __future__ import annotations

import json

import pytest

from cli.common import format_rows
from cli.lake import main
from storage.lake import LakeWriter, rows_to_table

EPOCH_QUERY = "SELECT epoch, avg(reward) AS reward FROM rollouts GROUP BY epoch ORDER BY epoch"


def _small_lake(url: str) -> LakeWriter:
    """Run r1: epoch 0 rewards (0, 1), epoch 1 rewards (1, 1); one run row."""
    w = LakeWriter(url)
    w.write_run("r1", "cli-test", {"epochs": 2})
    for epoch, rewards in ((0, [0.0, 1.0]), (1, [1.0, 1.0])):
        table = rows_to_table([{"run_id": "r1", "epoch": epoch, "step": epoch, "prompt_id": "p", "sample_idx": i,
                                "reward": r, "response_token_ids": [1, 2, 3], "length": 3}
                               for i, r in enumerate(rewards)])
        w.commit_step("r1", epoch, epoch, [w.write_rollouts("r1", epoch, epoch, 0, 0, table)])
    return w


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(["lake", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_sql_json_on_both_backends(lake_url: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: the acceptance query gives the same JSON on a local folder and on S3.
    _small_lake(lake_url)
    code, out, err = _run(capsys, "sql", EPOCH_QUERY, "--lake", lake_url, "--format", "json")
    assert (code, err) == (0, "")
    assert json.loads(out) == [{"epoch": 0, "reward": 0.5}, {"epoch": 1, "reward": 1.0}]


def test_summary_and_verify_on_both_backends(lake_url: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: summary counts committed rows per epoch from the manifests; verify of a healthy lake exits 0.
    _small_lake(lake_url)
    code, out, _ = _run(capsys, "summary", "--lake", lake_url, "--format", "json")
    rows = json.loads(out)
    assert code == 0 and [(r["name"], r["epoch"], r["steps"], r["responses"]) for r in rows] == [
        ("cli-test", 0, 1, 2), ("cli-test", 1, 1, 2)]
    assert all(r["bytes"] > 0 for r in rows)
    code, out, _ = _run(capsys, "verify", "--lake", lake_url, "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["clean"] and report["findings"] == [] and report["files_checked"] == 2


def test_verify_exit_codes_and_quarantine(tmp_path, capsys: pytest.CaptureFixture) -> None:
    # Rule: verify exits 1 while a problem remains, 0 once --quarantine moved it aside.
    url = str(tmp_path / "lake")
    w = _small_lake(url)
    key = w.write_rollouts("r1", 1, 1, 0, 1, rows_to_table([
        {"run_id": "r1", "epoch": 1, "step": 1, "prompt_id": "p", "sample_idx": 0}]))  # a superseded attempt
    code, out, _ = _run(capsys, "verify", "--lake", url)
    assert code == 1 and "leftover" in out and key[:40] in out and "--quarantine" in out
    code, out, _ = _run(capsys, "verify", "--lake", url, "--quarantine", "--format", "csv")
    assert code == 0 and out.splitlines()[0] == "kind,key,detail,rows,action"
    assert f"moved to _quarantine/{key}" in out
    assert _run(capsys, "verify", "--lake", url)[0] == 0


def test_table_and_csv_formats(tmp_path, capsys: pytest.CaptureFixture) -> None:
    # Rule: table aligns columns and counts rows; csv has a header and full-precision values.
    url = str(tmp_path / "lake")
    _small_lake(url)
    code, out, _ = _run(capsys, "sql", EPOCH_QUERY, "--lake", url)
    assert code == 0 and out.splitlines() == ["epoch  reward", "-----  ------", "    0     0.5", "    1       1", "(2 rows)"]
    code, out, _ = _run(capsys, "sql", "SELECT 1 / 3 AS third, [1, 2] AS ids", "--lake", url, "--format", "csv")
    assert out.splitlines() == ["third,ids", f"{1 / 3!r},\"[1, 2]\""]


def test_lake_from_env_and_params(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    # Rule: --lake defaults to $RHYMERL_LAKE; --param binds $NAME (JSON value, else a string).
    url = str(tmp_path / "lake")
    _small_lake(url)
    monkeypatch.setenv("RHYMERL_LAKE", url)
    code, out, _ = _run(capsys, "sql", "SELECT count(*) AS n FROM rollouts WHERE run_id = $run AND epoch = $ep",
                        "--param", "run=r1", "--param", "ep=1", "--format", "json")
    assert code == 0 and json.loads(out) == [{"n": 2}]


def test_errors_name_the_problem(tmp_path, capsys: pytest.CaptureFixture) -> None:
    # Rule: a missing lake folder, bad SQL, a bad --param and a truncated file each exit 2 with a
    # one-line message saying what to fix.
    code, _, err = _run(capsys, "sql", "SELECT 1", "--lake", str(tmp_path / "nope"))
    assert code == 2 and "does not exist" in err and "RHYMERL_LAKE" in err
    url = str(tmp_path / "lake")
    w = _small_lake(url)
    code, _, err = _run(capsys, "sql", "SELEC 1", "--lake", url)
    assert code == 2 and err.startswith("error:") and "syntax error" in err
    code, _, err = _run(capsys, "sql", "SELECT 1", "--lake", url, "--param", "1x=2")
    assert code == 2 and "NAME=VALUE" in err
    key = w.write_rollouts("r1", 2, 2, 0, 0, rows_to_table([
        {"run_id": "r1", "epoch": 2, "step": 2, "prompt_id": "p", "sample_idx": 0, "reward": 0.0}]))
    w.commit_step("r1", 2, 2, [key])
    (tmp_path / "lake" / key).write_bytes((tmp_path / "lake" / key).read_bytes()[:100])
    code, _, err = _run(capsys, "sql", EPOCH_QUERY, "--lake", url)
    assert code == 2 and key in err and "rhymerl lake verify" in err
    code, out, err = _run(capsys, "sql", EPOCH_QUERY, "--lake", url, "--skip-damaged", "--format", "json")
    assert code == 0 and len(json.loads(out)) == 2 and err.startswith("warning:") and "holding 1 rows" in err


def test_format_rows_elides_long_cells() -> None:
    # Rule: table cells wider than 48 characters end in an ellipsis; json keeps them whole.
    rows = [{"ids": list(range(40))}]
    assert format_rows(rows, ["ids"], "table").splitlines()[2].endswith("…")
    assert json.loads(format_rows(rows, ["ids"], "json")) == rows


def test_summary_counts_evaluations_and_verify_reads_their_files(tmp_path, capsys: pytest.CaptureFixture) -> None:
    # Rule: an evaluation's rows file is a table file (read whole by verify), never a leftover.
    url = str(tmp_path / "lake")
    w = _small_lake(url)
    w.write_evals("r1", -1, [{"run_id": "r1", "epoch": -1, "global_step": 0, "prompt_id": f"e{i}",
                              "sample_idx": 0, "reward": 1.0} for i in range(2)])
    code, out, _ = _run(capsys, "summary", "--lake", url)
    assert code == 0 and "1 held-out evaluation(s) of 2 samples (table evals)" in out
    code, out, _ = _run(capsys, "verify", "--lake", url, "--format", "json")
    assert code == 0 and json.loads(out)["findings"] == []
    (tmp_path / "lake/evals/run_id=r1/before-training.parquet").write_bytes(b"not parquet")
    code, out, _ = _run(capsys, "verify", "--lake", url)
    assert code == 1 and "corrupt" in out and "evals/run_id=r1/before-training.parquet" in out
