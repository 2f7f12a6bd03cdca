"""History as flat columns (`rhymerl/histospec/bundle.py`): Arrow in without a Python object per
token, bundles for any set of prompts equal to the whole-epoch builder's."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest

from rhymerl.histospec.bundle import HistoryBundle, HistoryColumns, HistorySlicer, PromptHistory, bundle_for_epoch
from rhymerl.data.records import Prompt, prompt_id_of


def _prompt(ids: tuple[int, ...]) -> Prompt:
    return Prompt(prompt_id=prompt_id_of(ids), index=0, text="", token_ids=ids, answer="1")


A, B, C = _prompt((10, 11)), _prompt((12,)), _prompt((13, 14, 15))
# Rows of one prompt need not be adjacent (a warm start appends); "zzz" is in no bundle asked for;
# an empty response and a NULL reward appear once each.
ROWS = {"prompt_id": [A.prompt_id, B.prompt_id, "zzz", A.prompt_id, B.prompt_id],
        "response_token_ids": [[1, 2], [3], [4, 4], [5, 6, 7], []],
        "reward": [1.0, None, 1.0, 0.5, 0.0]}


def _arrow() -> pa.Table:
    return pa.table({"prompt_id": pa.array(ROWS["prompt_id"]),
                     "response_token_ids": pa.array(ROWS["response_token_ids"], type=pa.list_(pa.int32())),
                     "reward": pa.array(ROWS["reward"], type=pa.float64())})


def test_arrow_columns_are_flat_buffers_without_a_python_object_per_token():
    # Rule: tokens stay one int32 buffer, the Arrow list column's own (zero-copy); Python objects
    # exist per response row (its prompt id) only.
    table = _arrow()
    cols = HistoryColumns.from_arrow(table)
    assert cols.tokens.dtype == np.int32 and cols.offsets.dtype == np.int64 and cols.rewards.dtype == np.float64
    assert cols.offsets.tolist() == [0, 2, 3, 5, 8, 8] and cols.tokens.tolist() == [1, 2, 3, 4, 4, 5, 6, 7]
    assert cols.rewards.tolist() == [1.0, 0.0, 1.0, 0.5, 0.0]  # NULL reward -> 0
    assert len(cols.prompt_ids) == len(cols) == 5  # one object per row, not per token
    values = table.column("response_token_ids").chunk(0).values
    assert cols.tokens.__array_interface__["data"][0] == values.buffers()[1].address  # no copy


def test_sliced_arrow_column_keeps_only_its_rows():
    # Rule: a list column that is a slice of a larger one (offsets not from 0) reads its own tokens.
    cols = HistoryColumns.from_arrow(_arrow().slice(3, 2))
    assert cols.offsets.tolist() == [0, 3, 3] and cols.tokens.tolist() == [5, 6, 7]


def test_bundle_of_a_prompt_set_equals_the_whole_epoch_builder():
    # Rule: a bundle for prompts [C, A] holds exactly those, in that order, with their rows oldest
    # first (empty responses dropped), the same arrays the list-based builder makes.
    slicer = HistorySlicer(HistoryColumns.from_arrow(_arrow()))
    blob, info = slicer.bundle([C, A])
    assert blob.dtype == np.uint8
    with np.load(io.BytesIO(blob.tobytes()), allow_pickle=False) as z:  # no object arrays inside
        assert {z[k].dtype.kind for k in z.files} <= {"i", "f", "u"}
    fb = HistoryBundle.from_bytes(blob.tobytes())
    assert [fb.prompt(k).tolist() for k in range(len(fb))] == [[13, 14, 15], [10, 11]]
    tokens, lens, rewards = fb.history(1)
    assert tokens.tolist() == [1, 2, 5, 6, 7] and lens.tolist() == [2, 3] and rewards.tolist() == [1.0, 0.5]
    assert fb.history(0)[1].tolist() == []
    assert (info.prompts, info.prompts_with_history, info.responses, info.tokens) == (2, 1, 2, 5)
    old, _ = bundle_for_epoch([C, A], ROWS)
    assert old == blob.tobytes()


def test_bundle_of_b_alone_drops_its_empty_response():
    slicer = HistorySlicer(HistoryColumns.from_lists(ROWS))
    fb = HistoryBundle.from_bytes(slicer.bundle([B])[0].tobytes())
    assert fb.history(0)[0].tolist() == [3] and fb.history(0)[2].tolist() == [0.0]


def test_columns_that_disagree_are_refused():
    with pytest.raises(ValueError, match="disagree"):
        HistoryColumns(np.array(["a"], dtype=object), np.array([0, 3]), np.zeros(2, np.int32), np.zeros(1))
    with pytest.raises(ValueError, match="differ in length"):
        HistoryColumns.from_lists({"prompt_id": ["x"], "response_token_ids": [], "reward": []})


def test_bundle_round_trips_through_bytes():
    # Serialisation: prompts, responses (including none) and rewards survive.
    bundle = HistoryBundle.of((PromptHistory((1, 2, 3), ((4, 5), (6,)), (1.0, 0.0)), PromptHistory((7,)),
                               PromptHistory((8, 9), ((10, 11, 12),), (0.25,))))
    back = HistoryBundle.from_bytes(bundle.to_bytes())
    assert [back.prompt(k).tolist() for k in range(3)] == [[1, 2, 3], [7], [8, 9]]
    assert [[a.tolist() for a in back.history(k)] for k in range(3)] == [
        [[4, 5, 6], [2, 1], [1.0, 0.0]], [[], [], []], [[10, 11, 12], [3], [0.25]]]


def test_a_prompt_history_names_what_is_wrong():
    with pytest.raises(ValueError, match="one reward per response"):
        PromptHistory((1, 2), responses=((3,),), rewards=())
    with pytest.raises(ValueError, match="empty prompt"):
        PromptHistory(())
