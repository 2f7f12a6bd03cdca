"""`freeze_startup_heap`: what is alive at start-up leaves the collector's walks; later garbage does not."""

import gc

from rhymerl.run.heap import freeze_startup_heap, frozen_heap


class _Node:
    def __init__(self) -> None:
        self.other = None


def _in_generations(obj) -> bool:
    return any(o is obj for gen in range(3) for o in gc.get_objects(generation=gen))


def test_startup_objects_are_frozen_and_later_cycles_still_collected():
    kept = [_Node() for _ in range(3)]  # alive at "start-up": the process keeps them
    try:
        # (Not an exact count: a frozen object that dies, e.g. in another thread, leaves the count.)
        assert freeze_startup_heap() >= len(kept)
        assert not _in_generations(kept[0])  # a full collection no longer walks it
        a, b = _Node(), _Node()  # a cycle made after start-up is garbage the collector still finds
        a.other, b.other = b, a
        assert _in_generations(a)
        del a, b
        assert gc.collect() >= 2
    finally:
        gc.unfreeze()
    assert _in_generations(kept[0])


def test_frozen_heap_hands_the_heap_back_when_the_block_ends():
    kept = _Node()
    with frozen_heap() as frozen:
        assert frozen >= 1 and not _in_generations(kept)
    assert _in_generations(kept) and gc.get_freeze_count() == 0
