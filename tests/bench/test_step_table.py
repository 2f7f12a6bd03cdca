"""`bench.step_table`: a trace's steps grouped into generate calls and buckets of running requests."""

from __future__ import annotations

import pytest

from bench.step_table import main, summarise


def _write(path, steps):
    path.write_text("".join(f"{t:.6f} {s:.6f} {p:.6f} {r} {k}\n" for t, s, p, r, k in steps))


def test_calls_split_at_gaps_and_warm_ups_are_left_out(tmp_path):
    # Rule: a generate call ends at the step after which nothing runs; calls under a quarter of the largest call's scheduled
    # tokens (warm-ups) do not count; per
    # bucket, steps and seconds are per call, milliseconds and tokens per step.
    warm = [(i * 0.001, 0.001, 0.0, 2 if i < 9 else 0, 2) for i in range(10)]
    call = [(1.0 + i * 0.01, 0.004, 0.001, 4, 4) if i >= 300 else (1.0 + i * 0.01, 0.020, 0.001, 200, 200)
            for i in range(600)]
    call[-1] = call[-1][:3] + (0, 4)  # the last step: nothing runs after it
    second = [(7.0 + t - 1.0, s, p, r, k) for t, s, p, r, k in call]
    trace = tmp_path / "x-1.txt"
    _write(trace, warm + call + second)
    got = summarise(str(trace))
    assert got["calls"] == 2 and got["steps_per_call"] == 600
    assert got["tokens_per_call"] == 300 * 200 + 300 * 4
    tail, full = got["buckets"]
    assert tail == {"running": "0-8", "steps_per_call": 300, "ms_per_step": 5.0, "post_ms": 1.0,
                    "tokens_per_step": 4.0, "s_per_call": 1.5}
    assert full["running"] == "129+" and full["ms_per_step"] == 21.0 and full["s_per_call"] == 6.3


def test_no_trace_says_how_to_make_one(tmp_path):
    with pytest.raises(SystemExit, match="RHYMERL_TRACE_STEPS"):
        main(["none", "--dir", str(tmp_path)])


def test_emitted_tokens_give_tokens_per_second_by_bucket(tmp_path):
    # Rule: a trace that records the tokens each step emitted reports them per step and per second
    # of its steps (the drafts' effect: scheduled tokens count the verified drafts, emitted the accepted).
    steps = [(i * 0.01, 0.004, 0.001, 4 if i < 99 else 0, 12, 6) for i in range(100)]
    trace = tmp_path / "x-2.txt"
    trace.write_text("".join(f"{t:.6f} {s:.6f} {p:.6f} {r} {k} {e}\n" for t, s, p, r, k, e in steps))
    (bucket,) = summarise(str(trace))["buckets"]
    assert bucket["emitted_per_step"] == 6.0 and bucket["emitted_per_s"] == 1200.0
