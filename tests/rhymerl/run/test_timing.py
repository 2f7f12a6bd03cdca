"""`rhymerl.run.timing.Stopwatch`: named parts add up, a failing part still counts."""

import time

import pytest

from rhymerl.run.timing import Stopwatch


def test_parts_add_up_and_a_failing_part_counts():
    watch = Stopwatch()
    with watch("a"):
        time.sleep(0.01)
    with watch("a"):  # the same part twice: the seconds add up
        time.sleep(0.01)
    with pytest.raises(RuntimeError), watch("b"):
        raise RuntimeError("boom")
    assert watch.seconds["a"] >= 0.02 and "b" in watch.seconds
    assert watch.total() >= watch.seconds["a"] + watch.seconds["b"]


def test_lap_listeners_see_every_start_and_end_until_removed():
    from rhymerl.run.timing import on_lap

    seen = []
    remove = on_lap(lambda name, started: seen.append((name, started)))
    watch = Stopwatch()
    with watch("a"):
        pass
    with pytest.raises(RuntimeError), watch("b"):  # a part that raised still ends
        raise RuntimeError("boom")
    remove()
    with watch("c"):
        pass
    assert seen == [("a", True), ("a", False), ("b", True), ("b", False)]
