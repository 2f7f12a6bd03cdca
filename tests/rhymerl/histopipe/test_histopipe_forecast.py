"""HistoPipe length forecasts and forecast quality on a small hand-made lake."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from rhymerl.histopipe.forecast import (ForecastSettings, average_ranks, build_history, epoch_means, forecast_lengths,
                                        forecast_quality, history_from_summary, resample)


def rows(prompt: str, epoch: int, *lengths: int) -> list[dict]:
    return [{"prompt_id": prompt, "epoch": epoch, "sample_idx": k, "length": x} for k, x in enumerate(lengths)]


# A tiny lake: p1 lengthens between epochs, p2 is steady, p3 is seen only in epoch 1.
LAKE = rows("p1", 1, 14, 10) + rows("p1", 0, 10, 10) + rows("p2", 0, 30, 10) + rows("p2", 1, 30, 10) \
    + rows("p3", 1, 6, 2)


def test_history_groups_by_prompt_and_epoch_longest_first() -> None:
    h = build_history(LAKE)
    assert h["p1"].epochs == (0, 1) and h["p1"].lengths == ((10, 10), (14, 10))
    assert h["p3"].epochs == (1,) and h["p3"].lengths == ((6, 2),)


def test_forecast_carries_a_damped_trend() -> None:
    f = forecast_lengths(build_history(LAKE), ["p1", "p2"], ForecastSettings(trend_weight=0.5))
    # p1: mean 10 -> 12, trend 2/epoch; next epoch 12 + 0.5 * 2 = 13; spread scaled by 13/12
    assert f["p1"].trend == 2.0 and f["p1"].mean == pytest.approx(13.0)
    assert f["p1"].lengths == pytest.approx((14 * 13 / 12, 10 * 13 / 12))
    assert f["p1"].peak == pytest.approx(14 * 13 / 12) and f["p1"].last_epoch == 1
    # p2 is flat: forecast = last epoch
    assert f["p2"].lengths == (30.0, 10.0) and f["p2"].source == "history"


def test_forecast_extrapolates_to_a_later_target_and_clips() -> None:
    h = build_history(LAKE)
    # three epochs ahead: 12 + 0.5 * 2 * 3 = 15
    assert forecast_lengths(h, ["p1"], target_epoch=4)["p1"].mean == pytest.approx(15.0)
    # max_tokens caps every sample: 14 * 13/12 -> 14, 10 * 13/12 stays
    clipped = forecast_lengths(h, ["p1"], ForecastSettings(max_length=14))["p1"]
    assert clipped.lengths == pytest.approx((14.0, 10 * 13 / 12))


def test_prior_for_unseen_prompts_from_dataset_mean() -> None:
    h = build_history(rows("a", 0, 12, 8) + rows("b", 0, 30, 10))
    f = forecast_lengths(h, ["c"], ForecastSettings(prior="dataset"))["c"]
    # means 10 and 20 -> 15; typical shape: mean of [1.2, 0.8] and [1.5, 0.5] = [1.35, 0.65]
    assert f.source == "prior" and f.last_epoch is None
    assert f.lengths == pytest.approx((15 * 1.35, 15 * 0.65))


def test_prior_from_prompt_length_fits_a_line() -> None:
    h = build_history(rows("a", 0, 12, 8) + rows("b", 0, 30, 10))
    # mean 10 at prompt length 5, 20 at 10 -> 2 * length; a new prompt of length 8 -> 16
    f = forecast_lengths(h, ["c", "d"], prompt_lengths={"a": 5, "b": 10, "c": 8})
    assert f["c"].mean == pytest.approx(16.0)
    # a prompt whose length is unknown falls back to the dataset mean, not the line at length 0
    assert f["d"].mean == pytest.approx(15.0)


def test_cold_start_without_any_history() -> None:
    f = forecast_lengths({}, ["x"], ForecastSettings(cold_start=64.0))["x"]
    assert f.lengths == (64.0,) and f.source == "prior"


def test_quality_by_hand() -> None:
    # ranks: forecast 1,2,3,4; actual 1,2,4,3 -> rho = 1 - 6 * 2 / (4 * 15) = 0.8
    # percentiles 100 * (rank - 1) / 3: c and d each move 33 points > 25 -> 2 of 4 moved
    q = forecast_quality({"a": 1, "b": 2, "c": 3, "d": 4}, {"a": 10, "b": 20, "c": 40, "d": 30})
    assert q.prompts == 4
    assert q.spearman == pytest.approx(0.8)
    assert q.moved_fraction == 0.5
    assert q.as_metrics() == {"forecast_prompts": 4.0, "forecast_spearman": pytest.approx(0.8),
                              "forecast_moved_fraction": 0.5}


def test_quality_ties_and_degenerate_cases() -> None:
    # ties share the average of their ranks
    assert average_ranks([5, 5, 9]).tolist() == [1.5, 1.5, 3.0]
    # a constant forecast carries no ranking: rho is undefined, not a fake 0
    assert math.isnan(forecast_quality({"a": 1, "b": 1}, {"a": 1, "b": 2}).spearman)
    with pytest.raises(ValueError, match="need at least 2"):
        forecast_quality({"a": 1}, {"a": 1, "b": 2})


def test_epoch_means_and_arrow_input() -> None:
    table = pa.Table.from_pylist(LAKE)
    assert epoch_means(table, 1) == {"p1": 12.0, "p2": 20.0, "p3": 4.0}
    assert build_history(table) == build_history(LAKE)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['length'\]"):
        build_history(table.drop_columns(["length"]))


def test_history_from_lake_summary_rows() -> None:
    # 4 responses, mean 10, max 16: one at 16, three sharing 24 tokens
    h = history_from_summary([{"prompt_id": "p", "responses": 4, "mean_length": 10.0, "max_length": 16}], epoch=3)
    assert h["p"].epochs == (3,) and h["p"].lengths == ((16, 8, 8, 8),)
    with pytest.raises(ValueError, match="max_length >= mean_length"):
        history_from_summary([{"prompt_id": "p", "responses": 2, "mean_length": 9.0, "max_length": 4}], epoch=0)


def test_demand_resamples_the_spread_to_n() -> None:
    # midpoints of n equal strata: 8 values -> 4 picks at positions 1, 3, 5, 7
    assert resample((8, 7, 6, 5, 4, 3, 2, 1), 4) == (7, 5, 3, 1)
    f = forecast_lengths(build_history(LAKE), ["p2"])["p2"]
    assert f.demand(2).lengths == (30.0, 10.0) and f.demand(4).lengths == (30.0, 30.0, 10.0, 10.0)
    with pytest.raises(ValueError, match="n=0"):
        f.demand(0)
