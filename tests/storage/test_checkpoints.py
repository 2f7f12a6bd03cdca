"""Checkpoint store: commit by marker, torn writes ignored, pruning, round trip; local and S3."""

from __future__ import annotations

import pytest

from storage.checkpoints import MARKER, META_FILE, STATE_FILE, CheckpointStore, checkpoint_url, step_key
from storage.fs import LakeError, put_atomic


def _save(store: CheckpointStore, step: int, keep: int | None = None) -> bool:
    return store.save("r1", step, f"state-{step}".encode(), {"global_step": step, "epoch": 0}, keep=keep)


def test_checkpoint_url_defaults_next_to_the_lake():
    assert checkpoint_url("s3://b/lake/") == "s3://b/lake/_checkpoints"
    assert checkpoint_url("lake", "/elsewhere") == "/elsewhere"


def test_round_trip_and_latest(lake_url: str) -> None:
    # Rule: what save() wrote comes back byte for byte, and latest() is the newest commit.
    store = CheckpointStore(checkpoint_url(lake_url))
    assert store.latest("r1") is None
    blob = bytes(range(256)) * 100
    assert store.save("r1", 3, blob, {"epoch": 1, "history": [{"reward_mean": 0.5}]}) is True
    assert _save(store, 7) is True
    assert store.steps("r1") == [3, 7]
    first = store.load("r1", 3)
    assert first.trainer_state == blob and first.meta == {"epoch": 1, "history": [{"reward_mean": 0.5}]}
    latest = store.latest("r1")
    assert (latest.global_step, latest.trainer_state) == (7, b"state-7")
    assert store.latest("other") is None  # runs do not see each other's checkpoints
    assert store.latest_meta("r1") == (7, {"global_step": 7, "epoch": 0})  # state.json only
    assert store.latest_meta("other") is None


def test_second_commit_of_a_step_is_refused(lake_url: str) -> None:
    # Rule: a committed checkpoint is never overwritten; the first one stands.
    store = CheckpointStore(checkpoint_url(lake_url))
    assert _save(store, 2) is True
    assert store.save("r1", 2, b"other", {}) is False
    assert store.load("r1", 2).trainer_state == b"state-2"


def test_torn_write_is_invisible_then_pruned(lake_url: str) -> None:
    # Rule: files without a COMMITTED marker (a writer died mid-write) are not a checkpoint.
    store = CheckpointStore(checkpoint_url(lake_url))
    assert _save(store, 1) is True
    torn = store._path(step_key("r1", 2))
    put_atomic(store.fs, f"{torn}/{STATE_FILE}", b"half", exclusive=False)
    put_atomic(store.fs, f"{torn}/{META_FILE}", b"{}", exclusive=False)
    assert store.steps("r1") == [1] and store.latest("r1").global_step == 1
    with pytest.raises(LakeError, match="not committed"):
        store.load("r1", 2)
    # A rewrite of the torn step commits normally; the next commit prunes older torn folders.
    assert _save(store, 2) is True and store.latest("r1").trainer_state == b"state-2"
    put_atomic(store.fs, f"{store._path(step_key('r1', 3))}/{STATE_FILE}", b"half", exclusive=False)
    assert _save(store, 4, keep=5) is True
    assert sorted(store._listing("r1")) == [1, 2, 4]


def test_prune_keeps_the_newest_k(lake_url: str) -> None:
    # Rule: after each commit with keep=K only the K newest committed checkpoints remain.
    store = CheckpointStore(checkpoint_url(lake_url))
    for step in range(5):
        _save(store, step, keep=2)
        assert store.steps("r1") == list(range(max(0, step - 1), step + 1))
    assert sorted(store._listing("r1")) == [3, 4]  # no files left behind either
    assert store.prune("r1", 1) == [3] and store.steps("r1") == [4]


def test_damaged_state_is_refused(lake_url: str) -> None:
    # Rule: a state file that no longer matches the marker's digest is never loaded.
    store = CheckpointStore(checkpoint_url(lake_url))
    _save(store, 1)
    put_atomic(store.fs, f"{store._path(step_key('r1', 1))}/{STATE_FILE}", b"flipped", exclusive=False)
    with pytest.raises(LakeError, match=f"{STATE_FILE} is missing or damaged.*{MARKER}"):
        store.latest("r1")
    assert store.latest_meta("r1") == (1, {"global_step": 1, "epoch": 0})  # never reads the state
    put_atomic(store.fs, f"{store._path(step_key('r1', 1))}/{META_FILE}", b'{"epoch": 9}', exclusive=False)
    with pytest.raises(LakeError, match=f"{META_FILE} is missing or damaged"):
        store.latest_meta("r1")


def test_meta_must_be_json(tmp_path) -> None:
    store = CheckpointStore(str(tmp_path / "ck"))
    with pytest.raises(ValueError, match="JSON"):
        store.save("r1", 0, b"x", {"bad": object()})
    with pytest.raises(ValueError, match="run_id"):
        store.save("../evil", 0, b"x", {})
