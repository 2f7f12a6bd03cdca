"""The long-tail built-in task: worked solutions, heavy-tailed lengths fixed by the problem, the reward."""

import statistics

import pytest

from rhymerl.data.long import (LONG_ALPHABET, LongProblemSettings, long_problems, long_question_of,
                                   long_solution_of, make_long_problem, parse_long_question)
from rhymerl.data.reward import score


def test_solution_counts_down_and_adds_the_step_each_line():
    # Rule: n lines "<left> <total>", left = n..1, total = s + k * d, then "#### s + n * d".
    assert long_question_of(37, 7, 3) == "s=37 d=7 n=3"
    assert long_solution_of(37, 7, 3) == "3 44\n2 51\n1 58\n#### 58"
    p = make_long_problem(4, 37, 7, 3)
    assert (p.index, p.answer) == (4, "58") and parse_long_question(p.question) == (37, 7, 3)


def test_lengths_are_heavy_tailed_like_reasoning_responses():
    # Rule (issue 19): median 100-300 tokens, 95th percentile >= 5x the median, longest >= 1,500
    # (one token per character, plus EOS).
    lengths = sorted(len(p.solution) + 1 for p in long_problems(500, seed=0))
    median = statistics.median(lengths)
    p95 = lengths[int(0.95 * len(lengths))]
    assert 100 <= median <= 300
    assert p95 >= 5 * median
    assert max(lengths) >= 1500
    assert max(lengths) <= 2048 - 64  # within configs/long-tail.toml's max_tokens


def test_a_prompts_length_follows_from_its_problem():
    # Rule: the same (num, seed) gives the same problems, so each prompt's answer length is the
    # same every epoch; a longer list extends a shorter one; questions are distinct.
    a, b = long_problems(200, seed=3), long_problems(50, seed=3)
    assert a[:50] == b and a == long_problems(200, seed=3) and a != long_problems(200, seed=4)
    assert len({p.question for p in a}) == 200
    for p in a:
        s, d, n = parse_long_question(p.question)
        assert p.solution == long_solution_of(s, d, n) and p.solution.count("\n") == n
        assert set(p.question + p.solution) <= set(LONG_ALPHABET)


def test_reward_checks_the_final_answer():
    # Rule: the exact worked solution scores 1; a slip that changes the total scores 0; no "#### " line is
    # unformatted.
    p = make_long_problem(0, 5, 9, 12)
    assert score(p.solution, p.answer).correct
    slipped = p.solution.replace("#### 113", "#### 112")
    assert score(slipped, p.answer).reward == 0.0 and score(slipped, p.answer).formatted
    assert not score(p.solution.rsplit("\n", 1)[0], p.answer).formatted


def test_bad_settings_and_questions_are_rejected():
    with pytest.raises(ValueError, match="median_steps"):
        LongProblemSettings(median_steps=500)
    with pytest.raises(ValueError, match="sigma"):
        LongProblemSettings(sigma=-1.0)
    with pytest.raises(ValueError, match="not a long built-in question"):
        parse_long_question("a=1 b=2")
    with pytest.raises(ValueError, match="num"):
        long_problems(-1, seed=0)
