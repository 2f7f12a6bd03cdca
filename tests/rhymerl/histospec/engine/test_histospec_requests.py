"""`rhymerl.histospec.engine.requests.group`: a step's rows grouped by prompt."""

import numpy as np

from rhymerl.histospec.engine.requests import group


def test_group_is_np_unique_up_to_order_and_leaves_its_scratch_clean():
    # Rule: group(keys, mark) -> (distinct, which) with distinct[which] == keys, distinct the keys'
    # values once each in first-seen order; the scratch is all -1 again after every call.
    rng = np.random.default_rng(3)
    mark = np.full(50, -1, np.int64)
    for size in (0, 1, 7, 256):
        keys = rng.integers(0, 50, size)
        distinct, which = group(keys, mark)
        assert (distinct[which] == keys).all() and sorted(distinct.tolist()) == np.unique(keys).tolist()
        assert distinct.tolist() == list(dict.fromkeys(keys.tolist())) and (mark == -1).all()
