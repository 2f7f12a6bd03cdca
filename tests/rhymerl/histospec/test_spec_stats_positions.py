"""`SpecStats` by response position: which bucket a verification step lands in, what it emitted."""

from __future__ import annotations

import numpy as np

from rhymerl.histospec.stats import POSITION_EDGES, SpecStats, position_labels


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
