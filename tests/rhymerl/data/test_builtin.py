"""The built-in addition task: exact worked solutions, deterministic draws, and a wide length spread."""

import pytest

from rhymerl.data.builtin import (ANSWER_MARKER, PROBLEM_ALPHABET, ProblemSettings, builtin_problems,
                                      make_problem, parse_terms, question_of, solution_of)


def test_worked_solution_by_hand():
    # Rule: "a=<a>", then one "<name>=<t> <total>+<t>=<new total>" line per term, then "#### <sum>".
    assert question_of([8, 7, 3, 5]) == "a=8 b=7 c=3 d=5"
    assert solution_of([8, 7, 3, 5]) == "a=8\nb=7 8+7=15\nc=3 15+3=18\nd=5 18+5=23\n#### 23"
    assert make_problem(4, [9, 0]).answer == "9"
    assert make_problem(4, [9, 0]).solution == "a=9\nb=0 9+0=9\n#### 9"


def test_same_seed_same_problems_and_prefix_stable():
    # Rule: problems are a pure function of (num, seed); a longer list extends a shorter one.
    assert builtin_problems(50, seed=3) == builtin_problems(50, seed=3)
    assert builtin_problems(20, seed=3) == builtin_problems(50, seed=3)[:20]
    assert builtin_problems(50, seed=3) != builtin_problems(50, seed=4)
    assert [p.index for p in builtin_problems(5, seed=0)] == [0, 1, 2, 3, 4]


def test_answers_and_every_line_recompute():
    # Rule: the answer is the sum of the question's numbers and every worked line is true.
    spec = ProblemSettings()
    for p in builtin_problems(300, seed=11):
        terms = [int(part.split("=")[1]) for part in p.question.split(" ")]
        assert spec.min_terms <= len(terms) <= spec.max_terms
        assert all(0 <= t <= spec.max_operand for t in terms)
        assert p.answer == str(sum(terms))
        first, *work, last = p.solution.split("\n")
        assert first == f"a={terms[0]}" and last == f"{ANSWER_MARKER}{p.answer}"
        assert len(work) == len(terms) - 1
        total = terms[0]
        for name, line, t in zip("bcdefghi", work, terms[1:]):
            assert line == f"{name}={t} {total}+{t}={total + t}"
            total += t
        assert set(p.question + p.solution) <= set(PROBLEM_ALPHABET)


def test_response_lengths_spread_at_least_4x():
    # Rule: response lengths vary widely (longest typical >= 4x shortest); one token per character.
    lengths = sorted(len(p.solution) + 1 for p in builtin_problems(500, seed=0))  # +1 for EOS
    p5, p95 = lengths[len(lengths) // 20], lengths[-len(lengths) // 20]
    assert lengths[-1] >= 4 * lengths[0]
    assert p95 >= 3 * p5


def test_parse_terms_round_trip_and_rejects_other_text():
    # Rule: parse_terms inverts question_of and refuses anything else.
    assert parse_terms(question_of([3, 0, 19])) == [3, 0, 19]
    for bad in ["a=3", "a=3 c=4", "b=3 a=4", "a=3 b=x", "a=3  b=4", "What is 3+4?"]:
        with pytest.raises(ValueError, match="not a built-in question"):
            parse_terms(bad)


def test_bad_specs_and_counts_are_rejected():
    # Rule: impossible task settings fail at construction with the field named.
    with pytest.raises(ValueError, match="min_terms"):
        ProblemSettings(min_terms=1)
    with pytest.raises(ValueError, match="max_terms"):
        ProblemSettings(min_terms=5, max_terms=4)
    with pytest.raises(ValueError, match="max_terms"):
        ProblemSettings(max_terms=27)  # one letter per term
    with pytest.raises(ValueError, match="max_operand"):
        ProblemSettings(max_operand=0)
    with pytest.raises(ValueError, match="num=-1"):
        builtin_problems(-1, seed=0)


def test_harder_spec_changes_the_draw():
    # Rule: the spec is part of the recipe: bigger operands give different, still correct problems.
    hard = builtin_problems(50, seed=0, spec=ProblemSettings(max_operand=99))
    assert any(t > 9 for p in hard for t in parse_terms(p.question))
    assert all(p.answer == str(sum(parse_terms(p.question))) for p in hard)
