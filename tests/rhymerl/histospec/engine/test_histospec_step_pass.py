"""The engine step's compiled bookkeeping (`step_pass`) and the counts it keeps (`ledger`)."""

from __future__ import annotations

import numpy as np

from rhymerl.histospec.engine import step_pass
from rhymerl.histospec.bundle import HistoryBundle, PromptHistory
from rhymerl.histospec.engine.requests import RequestTable, StepLedger
from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.stats import SpecStats
from rhymerl.histospec.goodput import AcceptanceCalibration
from rhymerl.histospec.engine.step_drafter import BatchDrafter
from helpers.histospec_calls import record_calibration, row_keys


def _table(drafted, n, plen, probs):
    """A RequestTable whose slots 0..len-1 hold these drafts, stored under their rows' keys."""
    req = RequestTable(width=probs.shape[1])
    slots = np.array([req.alloc() for _ in drafted])
    req.drafted[slots], req.n[slots], req.plen[slots], req.probs[slots] = drafted, n, plen, probs
    return req, slots


def test_begin_counts_each_verified_draft_as_recording_it_one_by_one():
    # Rule: the counts flushed into SpecStats equal SpecStats.record + record_positions of every row;
    # the lifetime's equal them without positions; the calibration equals counting each draft's estimates.
    rng = np.random.default_rng(3)
    drafted, sizes = np.array([3, 0, 5, 4, 2]), np.array([2, 1, 6, 1, 3])  # accepted: 1, 0, 5, 0, 2
    n, plen = np.array([40, 130, 520, 1500, 60]), np.array([10, 10, 10, 10, 50])
    probs = np.where(np.arange(6) < drafted[:, None], rng.random((5, 6)), 0.0)
    req, slots = _table(drafted, n, plen, probs)
    tokens = rng.integers(0, 50, (5, 2000))
    ends = n + sizes
    req.keep(row_keys(tokens, np.arange(5), n), slots, step=1, grace=4)
    ledger, calibration = StepLedger(6), AcceptanceCalibration()
    rows = step_pass.begin(req, ledger, calibration, sizes, ends, tokens, step=2, backoff=0, tree_chunk=64)
    assert rows.slots.tolist() == slots.tolist() and rows.accepted.tolist() == [1, 0, 5, 0, 2]
    assert rows.processed == 5 + int(drafted.sum())
    stats, lifetime = SpecStats(), SpecStats()
    ledger.flush(stats, lifetime)
    want, accepted = SpecStats(), np.minimum(sizes - 1, drafted)
    for d, a in zip(drafted.tolist(), accepted.tolist()):
        want.record(d, a)
    want.record_positions(n - plen, accepted)
    assert stats == want
    assert lifetime.draft_len_hist == want.draft_len_hist and lifetime.pos_steps == [0, 0, 0, 0]
    reference = AcceptanceCalibration()
    record_calibration(reference, [p[:d] for p, d in zip(probs.tolist(), drafted.tolist())], accepted, n - plen)
    assert calibration.tokens == reference.tokens and (calibration.accepted == reference.accepted).all()
    assert (calibration.drafted == reference.drafted).all()
    # each draft is counted in its response-position bucket (30, 120, 510, 1490, 10 tokens written)
    assert calibration.drafted.sum(1).tolist() == [3 + 2, 0, 5, 4]
    ledger.flush(stats, lifetime)  # flushed counts are gone: a second flush adds nothing
    assert stats == want


def test_begin_finds_requests_wherever_their_rows_moved_and_skips_rows_without_samples():
    rng = np.random.default_rng(4)
    req, slots = _table(np.zeros(3, np.int64), np.array([20, 30, 25]), np.zeros(3, np.int64), np.zeros((3, 2)))
    tokens = rng.integers(0, 1000, (3, 64))
    req.keep(row_keys(tokens, np.arange(3), np.array([20, 30, 25])), slots, step=1, grace=4)
    moved = tokens[[2, 0, 1]].copy()  # the engine reordered its rows
    moved = np.vstack([moved, rng.integers(0, 1000, (1, 64))])  # and a new request joined
    sizes, ends = np.array([1, 0, 1, 1]), np.array([26, 21, 31, 12])  # row 1 (slot 0) is in prefill
    rows = step_pass.begin(req, StepLedger(2), AcceptanceCalibration(), sizes, ends, moved, step=2, backoff=0,
                           tree_chunk=64)
    assert rows.live.tolist() == [0, 2, 3] and rows.before.tolist() == [25, 30, 11]
    assert rows.slots.tolist() == [slots[2], slots[1], -1] and rows.new.tolist() == [2]  # the new request's row j
    assert len(req) == 1  # slot 0's entry stays until keep decides (grace)


def test_plan_drafts_only_known_prompts_with_room_not_backing_off():
    req, slots = _table(np.zeros(4, np.int64), np.zeros(4, np.int64), np.zeros(4, np.int64), np.zeros((4, 8)))
    req.prompt[slots] = [0, -1, 1, 1]
    req.budget[slots] = [8, 8, 8, 3]
    req.resume[slots] = [0, 0, 9, 0]  # slot 2 backs off until step 9
    ends = np.array([10, 10, 10, 60])
    rows = step_pass.StepRows(np.arange(4), ends, ends - 1, slots, np.zeros(4, np.uint64), *[np.zeros(4, np.int64)] * 4,
                              0, np.zeros(0, np.int64))
    last_seen = np.zeros(2, np.int64)
    drafting, budgets = step_pass.plan(req, rows, last_seen, step=5, k=6, max_model_len=62)
    assert drafting.tolist() == [0, 3] and budgets.tolist() == [6, 2]  # k caps row 0; room (62 - 60) row 3
    assert last_seen.tolist() == [5, 5] and req.n[slots].tolist() == ends.tolist() and (req.step[slots] == 5).all()


def test_a_drafters_stats_count_every_step_when_read_and_a_replaced_one_keeps_its_steps():
    prompt, pattern = (50, 51), (1, 2, 3, 4, 5, 6, 7, 8)
    batch = BatchDrafter(HistoryBundle.of((PromptHistory(prompt, (pattern * 5,), (1.0,)),)),
                         SpecConfig(recent_responses=0, cost_aware=False), k=4, max_model_len=64)
    rows = np.zeros((1, 64), dtype=np.int64)
    rows[0, :4] = [*prompt, 1, 2]
    assert batch.propose([[2]], np.array([4]), rows) == [[3, 4, 5, 6]]
    rows[0, 4:9] = [3, 4, 5, 6, 7]  # all 4 accepted, and the bonus token
    batch.propose([[3, 4, 5, 6, 7]], np.array([9]), rows)
    first = batch.stats
    assert (first.steps, first.drafted, first.accepted) == (1, 4, 4) and batch.lifetime.accepted == 4
    batch.stats = SpecStats()  # as take_stats does
    rows[0, 9] = 99
    batch.propose([[99]], np.array([10]), rows)  # its draft (8, 1, 2, 3) wholly rejected
    assert (first.steps, batch.stats.steps, batch.stats.drafted, batch.stats.accepted) == (1, 1, 4, 0)
    assert (batch.lifetime.steps, batch.lifetime.drafted) == (2, 8)
