"""Tests for rhymerl.data.reward: number normalisation, the '#### <number>' format rule, scoring."""

from __future__ import annotations

import dataclasses

import pytest

from rhymerl.data.reward import (OutcomeRewards, RewardResult, extract_answer, normalise_number, score,
                            score_batch)


@pytest.mark.parametrize("text, expected", [
    ("42", "42"),
    ("1,234", "1234"),  # thousands commas are dropped
    ("1,234,567.25", "1234567.25"),
    ("-3.50", "-3.5"),  # trailing fraction zeros are dropped
    ("+7", "7"),  # a plus sign is dropped
    ("007", "7"),  # leading zeros are dropped
    (".5", "0.5"),  # a bare fraction gets a leading zero
    ("5.", "5"),  # a trailing dot is not part of the value
    ("3.000", "3"),
    ("-0", "0"),  # zero has one form, unsigned
    ("-0.00", "0"),
    ("  12  ", "12"),  # surrounding whitespace is ignored
    ("0.1000000000000000000001", "0.1000000000000000000001"),  # exact, no float rounding
])
def test_normalise_number_canonical_forms(text, expected):
    assert normalise_number(text) == expected


@pytest.mark.parametrize("text", [
    "", " ", "-", ".", "-.", "abc", "$5", "5%", "1e3", "3/4", "1 234", "1,23", "12,34,567",
    "1234,567", "--5", "5-", "1.2.3", "٣",  # Arabic-Indic three: only ASCII digits count
])
def test_normalise_number_rejects_non_numbers(text):
    assert normalise_number(text) is None


@pytest.mark.parametrize("text, expected", [
    ("6 * 7 = 42\n#### 42", "42"),
    ("6 * 7 = 42\n#### 42\n\n  \n", "42"),  # trailing blank lines are fine
    ("#### 1,234", "1234"),
    ("#### -3.50", "-3.5"),
    ("work\n   ####   17   ", "17"),  # whitespace around the line and the number is fine
    ("####8", "8"),  # the space after the marker is optional
    ("#### 3\nno wait\n#### 5", "5"),  # several markers: the last one counts
    ("#### 5.", "5"),
])
def test_extract_answer_well_formed(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text", [
    "",
    "the answer is 42",  # no marker
    "#### 42\nI hope this helps!",  # text after the answer line
    "#### 5\n#### 3 apples",  # the last marker line has more than a number
    "The answer is #### 42",  # the marker must start the line
    "#### $42",  # units are not part of the number
    "#### 42 dollars",
    "#### 4 2",
    "####",  # marker with no number
    "##### 42",
    "#### 1,23",  # malformed thousands grouping
])
def test_extract_answer_unformatted_is_none(text):
    assert extract_answer(text) is None


def test_score_correct_wrong_unformatted():
    cfg = OutcomeRewards(correct_reward=1.0, wrong_reward=-0.5, unformatted_reward=-1.0)
    # same number in another form is correct
    assert score("so\n#### 1,234", "1234", cfg) == RewardResult(1.0, True, True, "1234")
    # a different number is wrong but formatted
    assert score("#### 1233", "1234", cfg) == RewardResult(-0.5, False, True, "1233")
    # the right number outside the format never counts as correct
    assert score("the answer is 1234", "1234", cfg) == RewardResult(-1.0, False, False, None)
    assert score("#### 1234\nDone.", "1234", cfg) == RewardResult(-1.0, False, False, None)


def test_score_normalises_gold_and_uses_default_config():
    # gold "-3.50" and prediction "-3.5" are the same number; defaults are 1 / 0 / 0
    assert score("#### -3.5", "-3.50") == RewardResult(1.0, True, True, "-3.5")
    assert score("#### 3.5", "-3.50").reward == 0.0
    assert score("3.5", "-3.50").reward == 0.0


def test_score_rejects_non_numeric_gold():
    # a bad gold answer is a dataset bug, reported with the value
    with pytest.raises(ValueError, match="'forty-two' is not a number"):
        score("#### 42", "forty-two")


def test_score_batch_pairs_texts_with_golds():
    results = score_batch(["#### 1", "#### 2", "2"], ["1", "3", "2"])
    assert [(r.reward, r.correct, r.formatted) for r in results] == [
        (1.0, True, True), (0.0, False, True), (0.0, False, False)]


def test_score_batch_length_mismatch():
    with pytest.raises(ValueError, match="2 responses but 1 gold"):
        score_batch(["#### 1", "#### 2"], ["1"])


def test_reward_config_is_frozen_and_validated():
    cfg = OutcomeRewards()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.correct_reward = 2.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="wrong_reward must be a finite number"):
        OutcomeRewards(wrong_reward=float("nan"))
