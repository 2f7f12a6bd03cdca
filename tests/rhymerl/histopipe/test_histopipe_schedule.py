"""HistoPipe placement policies on hand-made steps."""

from __future__ import annotations

import pytest

from rhymerl.histopipe.costmodel import CostModel
from rhymerl.histopipe.forecast import build_history, forecast_lengths
from rhymerl.histopipe.schedule import POLICIES, Assignment, Demand, ScheduleRequest, Unit, schedule, split_groups
from rhymerl.histopipe.simulator import simulate

# Load = tokens: no per-iteration cost, one second per running request per iteration, no capacity limit.
TOKENS = CostModel(base_s=0.0, per_seq_s=1.0, capacity=1000)


def demands(**lengths: tuple[float, ...] | float) -> tuple[Demand, ...]:
    return tuple(Demand(p, v if isinstance(v, tuple) else (float(v),)) for p, v in lengths.items())


def ids(a: Assignment) -> list[list[str]]:
    return [[u.prompt_id for u in units] for units in a.workers]


def test_naive_is_contiguous_chunks_in_order() -> None:
    # naive placement: 5 groups on 2 workers -> sizes 3 and 2, in the given order
    a = schedule("naive", ScheduleRequest(demands(a=1, b=9, c=2, d=8, e=3), 2, TOKENS))
    assert ids(a) == [["a", "b", "c"], ["d", "e"]]


def test_round_robin_deals_groups_in_order() -> None:
    a = schedule("round_robin", ScheduleRequest(demands(a=1, b=9, c=2, d=8, e=3), 2, TOKENS))
    assert ids(a) == [["a", "c", "e"], ["b", "d"]]


def test_lpt_places_longest_first_on_least_loaded_and_admits_long_first() -> None:
    # classic LPT on totals 7,5,4,3,1: 7->w0, 5->w1, 4->w1 (9), 3->w0 (10), 1->w1 (10)
    a = schedule("lpt", ScheduleRequest(demands(e=1, c=4, a=7, d=3, b=5), 2, TOKENS))
    assert ids(a) == [["a", "d"], ["b", "c", "e"]]
    assert a.estimates(TOKENS) == [10.0, 10.0]
    a.check_covers(demands(e=1, c=4, a=7, d=3, b=5))


def test_ties_are_broken_by_given_order_and_lowest_worker() -> None:
    # four equal groups: first to w0, second to w1, then back to w0 -> reproducible
    a = schedule("lpt", ScheduleRequest(demands(a=5, b=5, c=5, d=5), 2, TOKENS))
    assert ids(a) == [["a", "c"], ["b", "d"]]


def test_tier2_alternates_worker_order_on_odd_steps() -> None:
    # same ties, odd step: the highest worker index is visited first
    even = schedule("tier2", ScheduleRequest(demands(a=5, b=5, c=5, d=5), 2, TOKENS, step=0, split_share=10.0))
    odd = schedule("tier2", ScheduleRequest(demands(a=5, b=5, c=5, d=5), 2, TOKENS, step=1, split_share=10.0))
    assert ids(even) == [["a", "c"], ["b", "d"]]
    assert ids(odd) == [["b", "d"], ["a", "c"]]


def giant_step() -> tuple[Demand, ...]:
    small = {f"s{i}": (10.0,) * 4 for i in range(6)}
    return demands(giant=(100.0,) * 4, **small)


def test_lpt_isolates_one_giant_prompt() -> None:
    # the giant group (400 tokens) alone on one worker; the six small ones (40 each) split 3/3
    a = schedule("lpt", ScheduleRequest(giant_step(), 3, TOKENS))
    assert ids(a)[0] == ["giant"]
    assert sorted(a.estimates(TOKENS)) == [120.0, 120.0, 400.0]


def test_tier2_spreads_one_giant_prompt_over_workers() -> None:
    # fair share 640/3 = 213; giant 400 > 0.25 * 213 is split into four 100s, small groups stay whole:
    # 100,100,100 on w0..w2, 100 -> w0 (200), then 40s -> w1,w2,w1,w2,w1,w2 -> 200, 220, 220
    req = ScheduleRequest(giant_step(), 3, TOKENS)
    assert split_groups(req) == {"giant"}
    a = schedule("tier2", req)
    a.check_covers(req.demands)
    assert a.estimates(TOKENS) == [200.0, 220.0, 220.0]
    # the simulator agrees under this cost model (time = tokens when everything runs at once)
    lengths = {(d.prompt_id, k): int(x) for d in req.demands for k, x in enumerate(d.lengths)}
    assert simulate(a, lengths, TOKENS).makespan == 220.0
    assert simulate(schedule("lpt", req), lengths, TOKENS).makespan == 400.0


def test_more_workers_than_prompts() -> None:
    req = ScheduleRequest(demands(a=(5.0,) * 4, b=(3.0,) * 4), 5, TOKENS, split_share=10.0)
    # naive and lpt keep groups whole: three workers get nothing
    assert [len(u) for u in schedule("naive", req).workers] == [1, 1, 0, 0, 0]
    assert sum(1 for u in schedule("lpt", req).workers if u) == 2
    # tier2 splits groups (longest first) until every worker can have a unit: 8 samples on 5 workers
    a = schedule("tier2", req)
    a.check_covers(req.demands)
    assert all(a.workers) and sum(len(a.requests(w)) for w in range(5)) == 8


def test_oracle_places_single_samples_by_true_length() -> None:
    # whole groups: w0 = 20, w1 = 2; samples: each worker gets one 10 and one 1 -> 11, 11
    exact = (Demand("a", (10.0, 10.0), exact=True), Demand("b", (1.0, 1.0), exact=True))
    assert schedule("lpt", ScheduleRequest(exact, 2, TOKENS)).estimates(TOKENS) == [20.0, 2.0]
    assert schedule("oracle", ScheduleRequest(exact, 2, TOKENS)).estimates(TOKENS) == [11.0, 11.0]


def test_unseen_prompts_are_scheduled_from_the_prior() -> None:
    history = build_history([{"prompt_id": "old", "epoch": 0, "length": 40},
                             {"prompt_id": "old", "epoch": 0, "length": 20}])
    forecasts = forecast_lengths(history, ["old", "new"])
    assert forecasts["new"].source == "prior" and forecasts["new"].mean == pytest.approx(30.0)
    req = ScheduleRequest(tuple(f.demand(2) for f in forecasts.values()), 2, TOKENS)
    for policy in POLICIES:
        schedule(policy, req).check_covers(req.demands)


def test_check_covers_catches_a_lost_sample() -> None:
    a = Assignment("handmade", ((Unit("a", (0,), 1.0, 1.0),), ()))
    with pytest.raises(ValueError, match=r"missing \[\('a', 1\)\]"):
        a.check_covers([Demand("a", (1.0, 1.0))])


def test_bad_requests_name_the_problem() -> None:
    with pytest.raises(ValueError, match="unknown scheduling policy 'fastest'.*lpt"):
        schedule("fastest", ScheduleRequest((), 1))
    with pytest.raises(ValueError, match="appears twice"):
        ScheduleRequest(demands(a=1) + demands(a=2), 2)
    with pytest.raises(ValueError, match="workers=0"):
        ScheduleRequest((), 0)
    with pytest.raises(ValueError, match="finite and >= 0"):
        Demand("a", (-1.0,))
    with pytest.raises(ValueError, match="lengths is empty"):
        Demand("a", ())
