"""Damaged lakes: truncated, missing and corrupt files, broken manifests, leftovers; quarantine."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pytest

from storage.lake import Lake, LakeError, LakeWarning, LakeWriter, rows_to_table
from storage.verify import verify_lake


def _rows(step: int, n: int) -> pa.Table:
    return rows_to_table([{"run_id": "r1", "epoch": 0, "step": step, "prompt_id": f"p{i}", "sample_idx": 0,
                           "response_token_ids": list(range(50)), "length": 50} for i in range(n)])


def _lake_with_two_steps(url: str) -> tuple[LakeWriter, str, str]:
    """Step 0 (3 rows) and step 1 (5 rows), committed; returns the writer and both data keys."""
    w = LakeWriter(url)
    keys = []
    for step, n in ((0, 3), (1, 5)):
        keys.append(w.write_rollouts("r1", 0, step, 0, 0, _rows(step, n)))
        w.commit_step("r1", 0, step, [keys[-1]])
    return w, keys[0], keys[1]


def _count(lake: Lake) -> int:
    return lake.sql("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py()


def _replace(w: LakeWriter, key: str, data: bytes) -> None:
    w.fs.pipe_file(f"{w.root}/{key}", data)


def test_truncated_file_is_never_a_silent_wrong_count(lake_url: str) -> None:
    # Rule: a truncated committed file stops the lake from opening (naming it and verify), or is
    # skipped with a warning that says how many rows are left out; quarantine keeps the rest.
    w, healthy, damaged = _lake_with_two_steps(lake_url)
    blob = w.fs.cat_file(f"{w.root}/{damaged}")
    _replace(w, damaged, blob[: len(blob) // 2])

    with pytest.raises(LakeError, match="rhymerl lake verify") as info:
        Lake(lake_url)
    assert damaged in str(info.value) and "truncated" in str(info.value)
    with pytest.warns(LakeWarning, match="holding 5 rows"):
        lake = Lake(lake_url, on_damaged="skip")
    assert _count(lake) == 3 and [(s.key, s.state, s.rows) for s in lake.skipped] == [(damaged, "truncated", 5)]
    assert lake.summary().select(["responses", "skipped_rows"]).to_pylist() == [{"responses": 3, "skipped_rows": 5}]

    report = verify_lake(lake_url)
    assert [(f.kind, f.key, f.rows) for f in report.findings] == [("truncated", damaged, 5)]
    assert not report.clean and not w.fs.exists(f"{w.root}/_quarantine/{damaged}")

    moved = verify_lake(lake_url, quarantine=True)
    assert moved.clean and moved.findings[0].action == f"moved to _quarantine/{damaged}"
    assert w.fs.cat_file(f"{w.root}/_quarantine/{damaged}") == blob[: len(blob) // 2]
    assert not w.fs.exists(f"{w.root}/{damaged}") and w.fs.exists(f"{w.root}/{healthy}")
    with pytest.warns(LakeWarning, match="quarantined"):
        lake = Lake(lake_url)  # opens now: the loss is acknowledged, and still announced
    assert _count(lake) == 3
    again = verify_lake(lake_url)
    assert again.findings == () and again.quarantined_before == 1


def test_missing_file_is_reported_and_recorded(lake_url: str) -> None:
    # Rule: a manifest pointing at a missing file is an error until verify --quarantine records it.
    w, _, gone = _lake_with_two_steps(lake_url)
    w.fs.rm_file(f"{w.root}/{gone}")
    with pytest.raises(LakeError, match="missing"):
        Lake(lake_url)
    assert [(f.kind, f.key) for f in verify_lake(lake_url).findings] == [("missing", gone)]
    fixed = verify_lake(lake_url, quarantine=True)
    assert fixed.findings[0].action.startswith("recorded")
    record = json.loads(w.fs.cat_file(f"{w.root}/_quarantine/{gone}.reason.json"))
    assert record["kind"] == "missing" and record["rows"] == 5 and record["moved_to"] is None
    with pytest.warns(LakeWarning, match="1 committed file"):
        assert _count(Lake(lake_url)) == 3


def test_same_size_corruption_is_caught_by_the_hash(lake_url: str) -> None:
    # Rule: deep verify compares SHA-256 with the manifest; --quick checks sizes only.
    w, _, key = _lake_with_two_steps(lake_url)
    blob = bytearray(w.fs.cat_file(f"{w.root}/{key}"))
    blob[len(blob) // 3] ^= 0xFF
    _replace(w, key, bytes(blob))
    assert verify_lake(lake_url, deep=False).findings == ()
    assert [(f.kind, f.key) for f in verify_lake(lake_url).findings] == [("corrupt", key)]


def test_unreadable_steps_file_is_named_or_skipped(lake_url: str) -> None:
    # Rule: a file DuckDB cannot read is named with the verify hint, or skipped with a warning.
    w, _, _ = _lake_with_two_steps(lake_url)
    w.write_steps_row("r1", 0, 0, {"reward_mean": 0.5})
    key = "steps/run_id=r1/epoch=0/step=0.parquet"
    blob = w.fs.cat_file(f"{w.root}/{key}")
    _replace(w, key, blob[:-20])
    with pytest.raises(LakeError, match=f"cannot read {key}.*rhymerl lake verify"):
        Lake(lake_url)
    with pytest.warns(LakeWarning, match=f"leaving out {key}"):
        lake = Lake(lake_url, on_damaged="skip")
    assert _count(lake) == 8  # rollouts are unaffected
    assert lake.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == 0
    report = verify_lake(lake_url, quarantine=True)
    assert [(f.kind, f.key) for f in report.findings] == [("corrupt", key)]
    with Lake(lake_url) as lake:
        assert lake.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == 0


def test_bad_manifest_is_quarantined_and_the_step_recommits(lake_url: str) -> None:
    # Rule: an unreadable manifest blocks the lake; quarantining it uncommits the step, and a
    # re-run commits it again with its rows counted once.
    w, _, key = _lake_with_two_steps(lake_url)
    manifest = "_manifests/run_id=r1/epoch=0/step=1.json"
    _replace(w, manifest, b"{not json")
    with pytest.raises(LakeError, match="manifest"):
        Lake(lake_url)
    report = verify_lake(lake_url, quarantine=True)
    # The step's data file is not committed by any readable manifest: pending, kept in place.
    assert [(f.kind, f.key) for f in report.findings] == [("bad_manifest", manifest), ("pending", key)]
    assert not w.is_committed("r1", 0, 1) and w.fs.exists(f"{w.root}/{key}")
    assert w.commit_step("r1", 0, 1, [key]) is True
    with Lake(lake_url) as lake:
        assert _count(lake) == 8


def test_leftovers_and_pending_files(lake_url: str) -> None:
    # Rule: an unlisted file of a committed step is a leftover at once; one of an uncommitted
    # step is pending (a writer may be at work) until it is older than the grace period.
    w, _, _ = _lake_with_two_steps(lake_url)
    superseded = w.write_rollouts("r1", 0, 1, 0, 1, _rows(1, 5))  # lost the commit race
    in_flight = w.write_rollouts("r1", 0, 2, 0, 0, _rows(2, 4))
    kinds = {f.key: f.kind for f in verify_lake(lake_url).findings}
    assert kinds == {superseded: "leftover", in_flight: "pending"}
    report = verify_lake(lake_url, quarantine=True)
    assert {f.key: f.action.split(" ")[0] for f in report.findings} == {superseded: "moved", in_flight: ""}
    assert report.clean  # pending files need no action
    assert w.fs.exists(f"{w.root}/{in_flight}")
    old = verify_lake(lake_url, grace_s=0).findings
    assert [(f.kind, f.key) for f in old] == [("leftover", in_flight)]
    with Lake(lake_url) as lake:
        assert _count(lake) == 8


def test_temp_file_of_a_killed_local_put_is_a_leftover(tmp_path) -> None:
    # Rule: a temp file left by a writer killed inside an atomic local put is cleaned up by verify.
    url = str(tmp_path / "lake")
    _lake_with_two_steps(url)
    tmp = tmp_path / "lake/_manifests/run_id=r1/epoch=0/step=2.json.tmp-0123"
    tmp.write_text("{")
    os.utime(tmp, (time.time() - 7200, time.time() - 7200))
    report = verify_lake(url, quarantine=True)
    assert [(f.kind, f.key) for f in report.findings] == [("leftover", str(tmp.relative_to(tmp_path / "lake")))]
    assert not tmp.exists()
    assert _count(Lake(url)) == 8


def test_verify_refuses_a_negative_grace(tmp_path) -> None:
    # Rule: bad input is refused with the fix.
    with pytest.raises(ValueError, match="grace_s must be >= 0"):
        verify_lake(str(tmp_path), grace_s=-1)
