"""Weight buckets: every tensor once, in order, no bucket over the limit unless one tensor is."""

from __future__ import annotations

import pytest
import torch

from rhymerl.policy.weight_sync import bucket_bytes_of, bucketed


def test_buckets_keep_order_and_limit() -> None:
    named = [("a", torch.zeros(4)), ("b", torch.zeros(4)), ("c", torch.zeros(10)), ("d", torch.zeros(2))]
    # float32: 16, 16, 40, 8 bytes; limit 32 -> [a, b], [c] (alone: larger than the limit), [d]
    buckets = list(bucketed(iter(named), bucket_bytes=32))
    assert [list(b) for b in buckets] == [["a", "b"], ["c"], ["d"]]
    assert [bucket_bytes_of(b) for b in buckets] == [32, 40, 8]
    assert list(bucketed(iter(named), bucket_bytes=10**9)) == [dict(named)]
    assert list(bucketed(iter([]), bucket_bytes=8)) == []
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(bucketed(iter(named), bucket_bytes=0))
