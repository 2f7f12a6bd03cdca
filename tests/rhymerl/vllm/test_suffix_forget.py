"""rhymerl/vllm/worker_ext.py `forget_requests`: a held-out evaluation leaves nothing in vLLM's
suffix drafter, whose cache of earlier responses drafts later requests."""

import pytest

pytest.importorskip("arctic_inference.suffix_decoding")


def test_forgotten_requests_no_longer_draft_and_the_kept_ones_still_do():
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    from rhymerl.vllm.worker_ext import forget_requests

    cache = SuffixDecodingCache(max_tree_depth=16, max_cached_requests=100)
    cache.start_request("train", [1, 2])
    cache.add_active_response("train", [3, 4, 5])
    cache.stop_request("train")  # finished: its response stays cached for other requests
    kept = set(cache.cached_requests)
    cache.start_request("eval", [7, 8])
    cache.add_active_response("eval", [9, 10, 11])  # finished, not yet stopped by the drafter
    cache.start_request("probe", [0])

    def drafts(pattern):
        return list(cache.speculate("probe", pattern, max_spec_tokens=4, max_spec_factor=4.0, min_token_prob=0.0).token_ids)

    assert drafts([9, 10]) == [11] and drafts([3, 4]) == [5]
    assert forget_requests(cache, kept | {"probe"}) == 2  # eval: its prompt (active) and its response
    # Rule: the eval response drafts nothing any more; the training response still does.
    assert drafts([9, 10]) == [] and drafts([3, 4]) == [5]
    assert set(cache.cached_requests) == kept | {"probe"} and set(cache.active_requests) == {"probe"}
