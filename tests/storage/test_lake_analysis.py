"""Analysis views on a small hand-made lake: rhyme, length-rank stability, length distributions.

The SQL is the same on every backend, so these run on a local lake only.
"""

from __future__ import annotations

import pytest
from scipy.stats import spearmanr

from storage.lake import Lake, LakeWriter, rows_to_table

# (run, epoch, prompt, sample, token ids) for the rhyme cases.
RHYME = [
    ("r", 0, "a", 0, [1, 2, 3, 4, 5, 6]),
    ("r", 0, "a", 1, [10, 11, 12]),
    ("r", 0, "b", 0, [7, 8, 9, 10, 11]),
    ("r", 0, "c", 0, [1, 1, 1, 1]),
    ("r2", 0, "a", 0, [0, 1, 2, 3, 9, 9]),  # another run: must never count for run r
    # a0: matches (1,2,3,4) at 2..5 and (3,4,5,6) at 7..10; (0,1,2,3) is only in run r2 -> 8/10
    ("r", 1, "a", 0, [0, 1, 2, 3, 4, 9, 3, 4, 5, 6]),
    # a1: shares only 3 tokens (10,11,12) with epoch 0: shorter than 4 -> 0/4
    ("r", 1, "a", 1, [10, 11, 12, 13]),
    # b0: (7,8,9,10) at 1..4 and 6..9, (8,9,10,11) at 2..5, overlaps counted once -> 9/9
    ("r", 1, "b", 0, [7, 8, 9, 10, 11, 7, 8, 9, 10]),
    # b1: (1,2,3,4) is prompt a's history, not b's -> 0/4
    ("r", 1, "b", 1, [1, 2, 3, 4]),
    ("r", 1, "d", 0, [1, 2, 3, 4]),  # new prompt: no previous epoch, no row
    # epoch 2 is compared with epoch 1 only: a0 -> 4/4 (epoch-1 a1); a1 (2,3,4,5) is only in
    # epoch 0, (3,4,5,6) is in epoch 1 -> 4/5
    ("r", 2, "a", 0, [10, 11, 12, 13]),
    ("r", 2, "a", 1, [2, 3, 4, 5, 6]),
]

# (epoch, prompt, lengths of its responses) for run "L".
LENGTHS = [
    (0, "p1", [10]), (0, "p2", [20]), (0, "p3", [30]), (0, "p4", [40]), (0, "p5", [50]),
    (1, "p1", [12]), (1, "p2", [40, 50]), (1, "p3", [33]), (1, "p4", [41]), (1, "p5", [60]),
    (1, "p6", [70]),  # only in epoch 1: left out of the (0, 1) ranking
    (2, "p1", [12]), (2, "p2", [12]), (2, "p3", [30]), (2, "p4", [40]), (2, "p5", [50]),
]


def _commit(w: LakeWriter, run: str, epoch: int, rows: list[dict]) -> None:
    table = rows_to_table([{"run_id": run, "epoch": epoch, "step": epoch, **r} for r in rows])
    w.commit_step(run, epoch, epoch, [w.write_rollouts(run, epoch, epoch, 0, 0, table)])


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    url = str(tmp_path_factory.mktemp("analysis") / "lake")
    w = LakeWriter(url)
    for run, epoch in sorted({(r[0], r[1]) for r in RHYME}):
        _commit(w, run, epoch, [{"prompt_id": p, "sample_idx": s, "response_token_ids": t, "length": len(t)}
                                for r, e, p, s, t in RHYME if (r, e) == (run, epoch)])
    for epoch in (0, 1, 2):
        _commit(w, "L", epoch, [
            {"prompt_id": p, "sample_idx": i, "length": n, "response_token_ids": [0] * n,
             "finish_reason": "length" if n == 50 else "stop"}
            for e, p, lengths in LENGTHS if e == epoch for i, n in enumerate(lengths)])
    with Lake(url) as opened:
        yield opened


def test_rhyme_per_response(lake: Lake) -> None:
    # Rule: covered = tokens inside a >= 4-token span seen in the previous epoch's responses to
    # the same prompt in the same run (see RHYME for each case).
    got = lake.sql("SELECT prev_epoch, epoch, prompt_id, sample_idx, tokens, covered_tokens "
                   "FROM rhyme_by_response(4) WHERE run_id = 'r' ORDER BY ALL").to_pylist()
    assert [tuple(r.values()) for r in got] == [
        (0, 1, "a", 0, 10, 8), (0, 1, "a", 1, 4, 0), (0, 1, "b", 0, 9, 9), (0, 1, "b", 1, 4, 0),
        (1, 2, "a", 0, 4, 4), (1, 2, "a", 1, 5, 4),
    ]


def test_rhyme_per_prompt_and_epoch(lake: Lake) -> None:
    # Rule: `rhyme` weights by tokens; `mean_response_rhyme` weights responses equally.
    per_prompt = lake.sql("SELECT prompt_id, epoch, responses, tokens, covered_tokens, rhyme, mean_response_rhyme "
                          "FROM rhyme WHERE run_id = 'r' ORDER BY epoch, prompt_id").to_pylist()
    assert per_prompt == [
        {"prompt_id": "a", "epoch": 1, "responses": 2, "tokens": 14, "covered_tokens": 8,
         "rhyme": pytest.approx(8 / 14), "mean_response_rhyme": pytest.approx((0.8 + 0) / 2)},
        {"prompt_id": "b", "epoch": 1, "responses": 2, "tokens": 13, "covered_tokens": 9,
         "rhyme": pytest.approx(9 / 13), "mean_response_rhyme": pytest.approx((1 + 0) / 2)},
        {"prompt_id": "a", "epoch": 2, "responses": 2, "tokens": 9, "covered_tokens": 8,
         "rhyme": pytest.approx(8 / 9), "mean_response_rhyme": pytest.approx((1 + 0.8) / 2)},
    ]
    per_epoch = lake.sql("SELECT epoch, prompts, responses, rhyme FROM rhyme_epochs "
                         "WHERE run_id = 'r' ORDER BY epoch").to_pylist()
    assert per_epoch == [{"epoch": 1, "prompts": 2, "responses": 4, "rhyme": pytest.approx(17 / 27)},
                         {"epoch": 2, "prompts": 1, "responses": 2, "rhyme": pytest.approx(8 / 9)}]


def test_rhyme_match_length_is_a_parameter(lake: Lake) -> None:
    # Rule: with k = 3 the 3-token overlap (10, 11, 12) of a1 now counts: 3 of 4 tokens.
    got = lake.sql("SELECT covered_tokens FROM rhyme_by_response(3) "
                   "WHERE run_id = 'r' AND epoch = 1 AND prompt_id = 'a' AND sample_idx = 1")
    assert got.column("covered_tokens").to_pylist() == [3]


def test_length_rank_moves(lake: Lake) -> None:
    # Rule: percentile = 100 (rank - 1) / (prompts - 1) over prompts in both epochs, average
    # ranks for ties; moved = |change| > 25 (p3 and p4 move exactly 25: not moved).
    got = lake.sql("SELECT epoch, prompt_id, prev_pct, pct, moved FROM length_rank_moves(25) "
                   "WHERE run_id = 'L' ORDER BY epoch, prompt_id").to_pylist()
    assert [tuple(r.values()) for r in got] == [
        (1, "p1", 0.0, 0.0, False), (1, "p2", 25.0, 75.0, True), (1, "p3", 50.0, 25.0, False),
        (1, "p4", 75.0, 50.0, False), (1, "p5", 100.0, 100.0, False),
        (2, "p1", 0.0, 12.5, False), (2, "p2", 75.0, 12.5, True), (2, "p3", 25.0, 50.0, False),
        (2, "p4", 50.0, 75.0, False), (2, "p5", 100.0, 100.0, False),
    ]


def test_length_rank_stability(lake: Lake) -> None:
    # Rule: Spearman of per-prompt mean lengths between epochs (as scipy computes it), and the
    # fraction of prompts that moved > 25 percentiles.
    got = lake.sql("SELECT epoch, prompts, spearman, moved_frac FROM length_rank_stability "
                   "WHERE run_id = 'L' ORDER BY epoch").to_pylist()
    # (0 -> 1): rank differences 0, 2, -1, -1, 0 -> 1 - 6 * 6 / (5 * 24) = 0.7
    # (1 -> 2): ranks (1, 4, 2, 3, 5) vs (1.5, 1.5, 3, 4, 5) -> 5.5 / sqrt(10 * 9.5)
    assert got == [{"epoch": 1, "prompts": 5, "spearman": pytest.approx(0.7), "moved_frac": 0.2},
                   {"epoch": 2, "prompts": 5, "spearman": pytest.approx(5.5 / 95 ** 0.5), "moved_frac": 0.2}]
    assert got[1]["spearman"] == pytest.approx(spearmanr([12, 45, 33, 41, 60], [12, 12, 30, 40, 50])[0])


def test_length_distribution_per_epoch(lake: Lake) -> None:
    # Rule: quantiles interpolate (p10 of 10..50 = 14); truncated_frac = share with finish 'length'.
    got = lake.sql("SELECT * EXCLUDE (run_id) FROM length_by_epoch WHERE run_id = 'L' AND epoch = 0")
    assert got.to_pylist() == [{"epoch": 0, "responses": 5, "mean": 30.0, "std": pytest.approx(200 ** 0.5),
                                "min": 10, "p10": pytest.approx(14.0), "p50": 30.0, "p90": pytest.approx(46.0),
                                "p99": pytest.approx(49.6), "max": 50, "truncated_frac": 0.2}]
    bins = lake.sql("SELECT bin_start, responses FROM length_histogram(25) WHERE run_id = 'L' AND epoch = 0 "
                    "ORDER BY bin_start").to_pylist()
    assert bins == [{"bin_start": 0, "responses": 2}, {"bin_start": 25, "responses": 2},
                    {"bin_start": 50, "responses": 1}]


def test_history_and_forecast_read_the_previous_epoch(lake: Lake) -> None:
    # Rule: previous_responses / length_forecast for epoch e read epoch e - 1 of the same run only.
    history = lake.previous_responses("r", 1).sort_by([("prompt_id", "ascending"), ("sample_idx", "ascending")])
    assert history.to_pylist() == [
        {"prompt_id": p, "sample_idx": s, "response_token_ids": t} for r, e, p, s, t in RHYME if (r, e) == ("r", 0)]
    forecast = lake.length_forecast("L", 2).sort_by("prompt_id").to_pylist()
    assert forecast[1] == {"prompt_id": "p2", "responses": 2, "mean_length": 45.0, "max_length": 50}
    assert [f["prompt_id"] for f in forecast] == ["p1", "p2", "p3", "p4", "p5", "p6"]
    assert lake.length_forecast("L", 0).num_rows == 0  # epoch 0 has no history
