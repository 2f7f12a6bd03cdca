"""Speculative decoding in the simulator under the goodput rule: what it keeps and what a step gains."""

from __future__ import annotations

import numpy as np
import pytest

from rhymerl.histopipe.cost_surface import CostSurface
from rhymerl.histopipe.schedule import Assignment, Unit
from rhymerl.histopipe.simulator import simulate
from rhymerl.histopipe.spec_pace import chain_acceptance, choose_drafts, draft_table, paced_cost


def surface(base_s: float, token_s: float) -> CostSurface:
    return CostSurface(model="m", device="d", base_s=base_s, token_s=token_s, kv_s=0.0, attn_s=0.0,
                       points=4, r2=1.0, max_rel_err=0.0)


FREE = surface(0.01, 0.0)  # verification costs nothing: a step is 10 ms whatever it feeds
DEAR = surface(0.0, 1e-3)  # every token costs as much as a one-request step: drafts never pay


def test_chain_acceptance_sums_to_the_accepted_drafts() -> None:
    q = chain_acceptance(4.0, 6.2)
    # W = round(6.2) positions, nonincreasing, 3 accepted draft tokens (4 per step minus the bonus)
    assert len(q) == 6 and np.all(np.diff(q) < 0) and q.sum() == pytest.approx(3.0)
    assert chain_acceptance(1.0, 3.0).tolist() == [0.0, 0.0, 0.0]  # nothing accepted: q = 0
    assert chain_acceptance(9.0, 4.0).tolist() == [1.0] * 4  # more than drafted: capped at 1
    with pytest.raises(ValueError, match="drafted"):
        chain_acceptance(2.0, 0.2)


def test_free_verification_keeps_every_draft_and_dear_tokens_keep_none() -> None:
    q = chain_acceptance(4.0, 6.0)
    for b in (1, 64, 256):
        free = choose_drafts(FREE, q, b, 1024)
        # all 6 drafts kept: 4 tokens per step for the price of one
        assert free.draft_len == 6 and free.speedup == pytest.approx(4.0)
        dear = choose_drafts(DEAR, q, b, 1024)
        # a draft token costs a full token and is accepted with chance < 1: speculation off
        assert dear.draft_len == 0 and dear.speedup == pytest.approx(1.0)
        assert choose_drafts(DEAR, q, b, 1024, controlled=False).speedup < 1.0  # fixed drafts lose
    rows = draft_table(DEAR, q, (1024,), (1, 256))
    assert [r["off"] for r in rows] == [True, True] and [r["fixed_draft_len"] for r in rows] == [6, 6]


def test_the_rule_trims_drafts_as_the_batch_grows() -> None:
    # 5 ms per step + 20 us per token: at batch 1 a token with q ~ 0.02 still pays; at 256 the step
    # is compute-bound and only the likelier draft tokens are kept, never fewer tokens/s than plain
    mixed = surface(0.005, 2e-5)
    q = chain_acceptance(3.0, 8.0)
    kept = [choose_drafts(mixed, q, b, 1024) for b in (1, 32, 256)]
    assert kept[0].draft_len == 8 and kept[0].draft_len > kept[1].draft_len > kept[2].draft_len > 0
    assert all(c.speedup >= choose_drafts(mixed, q, c.batch, 1024, controlled=False).speedup for c in kept)
    assert all(c.speedup >= 1.0 for c in kept)


def test_the_simulator_runs_a_paced_worker() -> None:
    # one worker, two requests of 40 and 20 tokens, capacity 2
    step = Assignment("handmade", ((Unit("a", (0,), 1.0, 1.0), Unit("b", (0,), 1.0, 1.0)),))
    lengths = {("a", 0): 40, ("b", 0): 20}
    q = chain_acceptance(4.0, 6.0)
    plain = simulate(step, lengths, FREE.cost_model(1024, capacity=2)).makespan
    assert plain == pytest.approx(0.40)  # 40 steps of 10 ms
    # free verification: 4 tokens per step, 10 steps
    assert simulate(step, lengths, paced_cost(FREE, q, 1024, capacity=2)).makespan == pytest.approx(0.10)
    # dear tokens: the rule switches speculation off, exactly plain decoding
    dear_plain = simulate(step, lengths, DEAR.cost_model(1024, capacity=2)).makespan
    assert simulate(step, lengths, paced_cost(DEAR, q, 1024, capacity=2)).makespan == pytest.approx(dear_plain)
    assert simulate(step, lengths, paced_cost(DEAR, q, 1024, capacity=2, controlled=False)).makespan > dear_plain


def test_one_step_keeps_the_young_requests_drafts_and_none_of_the_old() -> None:
    # 5 ms + 20 us per token at batch 64: a draft token pays while its chance beats ~0.02 ms x the
    # step's tokens per ms (~0.2-0.4 here); half the batch drafts well (0.9..0.6), half badly (0.05)
    mixed = surface(0.005, 2e-5)
    q = np.array([[0.9, 0.8, 0.7, 0.6], [0.05, 0.05, 0.05, 0.05]])
    step = choose_drafts(mixed, q, 64, 1024, weights=np.array([1.0, 1.0]))
    assert step.draft_len == pytest.approx(2.0)  # 32 requests x 4 drafts over 64
    assert step.tokens_per_step == pytest.approx(1.0 + 32 * 3.0 / 64)
    assert choose_drafts(mixed, q, 64, 1024, False, np.array([1.0, 1.0])).speedup < step.speedup
