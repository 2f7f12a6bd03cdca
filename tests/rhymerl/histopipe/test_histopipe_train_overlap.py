"""rhymerl/histopipe/train_overlap.py: groups train in finish order on a trainer of their own; the
step keeps only what is left when the rollout ends."""

import pytest

from rhymerl.histopipe.simulator import RequestSpan
from rhymerl.histopipe.train_overlap import group_finish, streamed_train


def span(pid: str, k: int, end: float, worker: int = 0, start: float = 0.0) -> RequestSpan:
    return RequestSpan(pid, k, worker, start, end, 0)


def test_only_the_last_groups_stay_in_the_step() -> None:
    # a finishes at 1 (cost 2: 20 tokens x 0.1 s), b at 4 (cost 4): a trains 1-3, b 4-8; rollout ends at 4.
    spans = [span("a", 0, 0.5), span("a", 1, 1.0), span("b", 0, 4.0), span("b", 1, 2.0)]
    tokens = {("a", 0): 10, ("a", 1): 10, ("b", 0): 30, ("b", 1): 10}
    out = streamed_train(spans, tokens, 0.1)
    assert out.batch_s == pytest.approx(6.0) and out.tail_s == pytest.approx(4.0)


def test_a_busy_trainer_queues_groups() -> None:
    # a (cost 5) finishes at 1 and keeps the trainer busy until 6; b (cost 1) finished at 2 waits: 6-7.
    spans = [span("a", 0, 1.0), span("b", 0, 2.0)]
    out = streamed_train(spans, {("a", 0): 50, ("b", 0): 10}, 0.1)
    assert out.tail_s == pytest.approx(7.0 - 2.0) and out.batch_s == pytest.approx(6.0)


def test_a_migrated_sample_finishes_with_its_last_span() -> None:
    spans = [span("a", 0, 3.0, worker=0), RequestSpan("a", 0, 1, 3.0, 9.0, 5, migrated=True), span("b", 0, 2.0)]
    assert group_finish(spans) == {"a": 9.0, "b": 2.0}
