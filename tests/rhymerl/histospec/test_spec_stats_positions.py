"""`SpecStats` by response position: which bucket a verification step lands in, what it emitted."""

from __future__ import annotations

import numpy as np

from rhymerl.histospec.stats import POSITION_EDGES, SpecStats, position_labels

from helpers.histospec_calls import counted


def test_steps_land_in_their_position_bucket_with_the_tokens_they_emitted():
    s = SpecStats()
    # positions 0 and 99 -> [0,100); 100 and 299 -> [100,300); 300 -> [300,1000); 1000 and 5000 -> [1000,inf)
    s.record_positions(np.array([0, 99, 100, 299, 300, 1000, 5000]), np.array([0, 3, 1, 1, 4, 7, 9]))
    assert POSITION_EDGES == (100, 300, 1000)
    assert s.pos_steps == [2, 2, 1, 2]
    assert s.pos_tokens == [1 + 4, 2 + 2, 5, 8 + 10]  # accepted + 1 each


def test_merge_adds_buckets_and_metrics_name_them():
    a, b = SpecStats(), SpecStats()
    a.record_positions(np.array([10]), np.array([2]))
    b.record_positions(np.array([20, 2000]), np.array([0, 5]))
    a.merge(b)
    assert a.pos_steps == [2, 0, 0, 1] and a.pos_tokens == [4, 0, 0, 6]
    m = a.as_metrics("spec/")
    assert position_labels() == ["pos0_100", "pos100_300", "pos300_1000", "pos1000_inf"]
    assert m["spec/steps_pos0_100"] == 2.0 and m["spec/tokens_pos1000_inf"] == 6.0
    assert "spec/steps_pos0_100" not in SpecStats().as_metrics("spec/")  # nothing recorded: no columns


def test_counted_steps_add_what_recording_step_by_step_adds():
    # Rule: an engine step's counts (a Tally added to SpecStats) == record(d[j], a[j]) for each j +
    # record_positions(p, a); positions=False leaves the buckets alone.
    rng = np.random.default_rng(3)
    d = rng.integers(0, 9, 300)
    d[:40] = 0
    a = (d * rng.random(300)).astype(np.int64)
    p = rng.integers(0, 3000, 300)
    one = SpecStats()
    for dj, aj in zip(d.tolist(), a.tolist()):
        one.record(dj, aj)
    one.record_positions(p, a)
    assert counted(d, a, p) == one
    lifetime = counted(d, a, p, with_positions=False)
    assert lifetime.draft_len_hist == one.draft_len_hist and lifetime.pos_steps == [0, 0, 0, 0]
    empty = counted([0, 0], [0, 0], [5, 5])
    assert (empty.steps, empty.tokens, empty.draft_len_hist) == (2, 2, [])
