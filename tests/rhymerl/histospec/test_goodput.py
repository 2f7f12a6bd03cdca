"""The goodput controller driven by a synthetic engine: a step costs c0 + c1 x tokens processed, and
draft token j of request i is accepted while independent coin flips of chance p_i keep landing."""

from __future__ import annotations

from typing import Callable

import numpy as np

from rhymerl.histospec.goodput import PROBE_EVERY, keep_lengths
from rhymerl.vllm.draft_gate import GoodputGate

WIDTH = 8


def drive(p: Callable[[int, int], float], c0: float, c1: float, steps: int = 120, batch: int = 8,
          seed: int = 0) -> tuple[np.ndarray, GoodputGate]:
    """Run `steps` engine steps of `batch` requests whose drafter proposes 1..WIDTH tokens (p(i, step):
    request i's per-token chance); returns the verified draft lengths [step, request] and the gate."""
    rng = np.random.default_rng(seed)
    clock = [0.0]
    gate = GoodputGate(WIDTH, clock=lambda: clock[0])
    ids = [f"req-{i}" for i in range(batch)]
    sampled, written, kept, proposed, emitted, seconds, accepted_log = [1] * batch, [0] * batch, [], [], [], [], []
    for step in range(steps):
        drafts = [[7] * int(rng.integers(1, WIDTH + 1)) for _ in ids]
        proposed.append([len(d) for d in drafts])
        out = gate.gate(ids, sampled, written, drafts)
        kept.append([len(d) for d in out])
        for i, d in enumerate(out):
            flips = rng.random(len(d)) < p(i, step)
            accepted = int(np.argmin(flips)) if not flips.all() else len(d)
            sampled[i], written[i] = accepted + 1, written[i] + accepted + 1
            accepted_log.append((step, accepted))
        seconds.append(c0 + c1 * (batch + sum(map(len, out))))  # the verified step's cost
        emitted.append(sum(sampled))
        clock[0] += seconds[-1]
    gate.proposed_lengths, gate.emitted, gate.seconds = np.array(proposed), np.array(emitted), np.array(seconds)
    gate.accepted_total = sum(a for s, a in accepted_log if s < steps - 1)  # the last step is never closed
    return np.array(kept), gate


def test_no_draft_pays_when_acceptance_is_too_low():
    # p 0.1 and a token costing a tenth of the fixed cost: a draft token would pay only above ~0.4.
    # Past the warm-up only the starved table's re-checks (one step in ~70) verify anything.
    kept, gate = drive(lambda i, s: 0.1, c0=1.0, c1=0.1, steps=400)
    assert kept[:8].sum() > 0  # untrimmed until the cost fit has its 8 steps
    assert (kept[20:].sum(1) > 0).mean() <= 0.03 and kept[20:].sum() <= 0.02 * gate.proposed_lengths[20:].sum()
    assert gate.stats.proposed > kept.sum() and gate.stats.timed_steps > 100


def test_full_drafts_when_verification_is_free():
    # Tokens cost a billionth of the step: every proposed token is verified, even at p 0.3 (the 8th
    # token, at 0.3 ** 8 ~ 7e-5, still pays).
    kept, gate = drive(lambda i, s: 0.3, c0=1.0, c1=1e-9, seed=1)
    probes = kept.sum(1) == 0  # the draft-free steps that keep the price of verifying measured
    assert probes.sum() <= len(kept) // PROBE_EVERY + 1
    assert (kept[~probes] == gate.proposed_lengths[~probes]).all()


def test_good_and_poor_requests_split_as_the_optimum_does():
    # Half the requests draft well (p 0.9), half poorly (p 0.3); c1 / c0 = 0.05. With the true
    # chances the optimum keeps most of the good drafts and nothing of the poor ones; the gate, which
    # learns the chances from a pooled table and each request's record, splits the same way and gets
    # within 10% of the optimum's tokens per second, well above sampling without drafts.
    def p(i, s):
        return 0.9 if i % 2 == 0 else 0.3

    q = np.array([[p(i, 0) ** (j + 1) for j in range(WIDTH)] for i in range(8)])
    best = keep_lengths(q, np.full(8, WIDTH), lambda t: 1.0 + 0.05 * t, 8, 8)
    assert best[0::2].min() >= 5 and best[1::2].max() <= 1
    for seed in (2, 4):
        kept, gate = drive(p, c0=1.0, c1=0.05, steps=200, seed=seed)
        assert kept[100:, 0::2].mean() >= 1.5 and kept[100:, 1::2].mean() <= 1.0
        rate = gate.emitted[100:].sum() / gate.seconds[100:].sum()
        oracle_e, oracle_t = 0.0, 0.0
        for lengths in gate.proposed_lengths[100:]:
            keep = keep_lengths(q, lengths, lambda t: 1.0 + 0.05 * t, 8, 8)
            oracle_e += 8 + sum(q[i, :k].sum() for i, k in enumerate(keep.tolist()))
            oracle_t += 1.0 + 0.05 * (8 + keep.sum())
        assert rate >= 0.9 * oracle_e / oracle_t and rate >= 1.3 * 8 / 1.4
        assert abs(gate.stats.predicted_s / gate.stats.measured_s - 1) < 0.05  # the cost forecast holds
        # the gate counts what was verified and accepted as the engine's counters would
        assert gate.stats.drafted == kept[:-1].sum() and gate.stats.accepted == gate.accepted_total
        assert gate.stats.steps == 8 * (len(kept) - 1) and gate.stats.tokens == gate.stats.steps + gate.stats.accepted


def test_a_request_whose_drafts_stop_matching_is_cut_within_a_few_steps():
    # All requests at p 0.95 until step 80, then request 0's drafts never match: from step 83 it
    # verifies at most a probing token now and then (its record fades between failures, so a request
    # whose drafts match again is not shut out for good) while the others keep drafting.
    kept, _ = drive(lambda i, s: 0.0 if (i == 0 and s >= 80) else 0.95, c0=1.0, c1=0.05, steps=100, seed=3)
    assert kept[60:80, 0].mean() >= 2
    assert kept[83:, 0].mean() <= 0.5 and kept[83:, 0].max() <= 2
    assert kept[83:, 1:].mean() >= 2


def test_keep_lengths_follows_a_nonlinear_cost():
    # A step that costs 1 s up to 16 tokens and 1 s more for each token beyond: the 8 surest
    # tokens ride free, the 9th would cost a whole second for < 1 token.
    q = np.full((4, 4), 0.5)
    kept = keep_lengths(q, np.full(4, 4), lambda t: 1.0 + np.maximum(t - 16, 0), 8, 8)
    assert kept.sum() == 8


def test_only_rows_where_a_draft_can_pay_are_drafted():
    # Rule: the drafter is asked only for the rows where a full draft at this step's chances keeps
    # a token (vLLM's n-gram drafter then skips the others; suffix decoding skips their look-up):
    # exactly the rows the trim keeps a full draft of; none where no draft pays, none on a probe.
    ids = [f"req-{i}" for i in range(8)]
    _, low = drive(lambda i, s: 0.1, c0=1.0, c1=0.1, steps=200)  # as in the test above: nothing pays
    low.begin(ids, [1] * 8, [100] * 8)
    assert low.rows_worth_drafting().tolist() == []
    _, mixed = drive(lambda i, s: 0.95 if i % 2 == 0 else 0.05, c0=1.0, c1=0.1, steps=150, seed=5)
    mixed.begin(ids, [2] * 8, [100] * 8)
    paying = mixed.rows_worth_drafting().tolist()
    trimmed = mixed.finish([[7] * WIDTH for _ in ids])
    assert paying == [i for i, d in enumerate(trimmed) if d] and {0, 2, 4, 6} <= set(paying)
    fit = mixed.cost.for_rows(len(ids))  # the fit that prices this step's band
    fit.since_plain, fit.xtx[2, 2] = PROBE_EVERY, fit.xtx[0, 0]  # a probe is due
    mixed.begin(ids, [1] * 8, [101] * 8)
    assert mixed.rows_worth_drafting().tolist() == []


def test_a_plain_step_after_a_drafted_one_counts_its_verified_drafts_then_only_counts():
    # Rule (the switch's plain steps behind vLLM's drafters): the plain step that follows a drafted one
    # closes it as ever (its drafts counted as verified); the next plain step only counts its rows.
    gate = GoodputGate(WIDTH, clock=lambda: 0.0)
    ids = ["a", "b"]
    assert gate.gate(ids, [1, 1], [0, 0], [[7, 7], [7]]) == [[7, 7], [7]]  # no fit yet: drafts pass
    assert gate.plain(ids, [3, 1], [3, 1]) == [[], []]  # a took both draft tokens, b none
    assert (gate.stats.steps, gate.stats.drafted, gate.stats.accepted, gate.stats.tokens) == (2, 3, 2, 4)
    assert gate.plain(ids, [1, 1], [4, 2]) == [[], []]
    assert (gate.stats.steps, gate.stats.drafted, gate.stats.tokens) == (4, 3, 6)
