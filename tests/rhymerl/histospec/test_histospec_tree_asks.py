"""The rows that ask the cross-prompt tree, asked on the helper thread as the drafting kernel finishes
them (`rhymerl.histospec.tree_asks`): the same drafts as asking after the kernel."""

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest

from helpers.marks import needs_arctic
from rhymerl.histospec.tree import RecentTree
from rhymerl.histospec.tree_asks import TreeAsks, rows_done

GATE = 0.3


def _step(rng: np.random.Generator, rows: int = 40, width: int = 12):
    """A tree of rhyming responses, an engine's token rows (half of them the tree's text, half unseen),
    each row's context end, budget and own draft (tokens, lengths, scores: about half under the gate)."""
    tree = RecentTree(capacity=8, depth=24)
    base = rng.integers(0, 30, 400)
    for _ in range(4):
        resp = np.where(rng.random(400) < 0.1, rng.integers(0, 30, 400), base)
        tree.extend_array(tree.start(), resp.astype(np.int32))
    tokens = np.stack([base if r % 2 == 0 else base + 100 for r in range(rows)]).astype(np.int32)
    ends = rng.integers(20, 390, rows)
    ends[3] = 0  # a row with no context never asks
    budgets = rng.integers(1, width + 1, rows)
    scores = rng.random(rows) * GATE * budgets * 2
    own = (rng.integers(0, 9, (rows, width)), rng.integers(0, width + 1, rows), rng.random((rows, width)))
    return tree, tokens, ends, budgets, scores, own


def _drafts(tree, tokens, ends, budgets, beside, own):
    asks = TreeAsks(tree, beside, tokens, np.arange(len(ends)), ends, budgets, GATE, 4.0, 0.0)
    return asks.drafts(own)


@needs_arctic
def test_rows_asked_as_the_kernel_finishes_them_get_the_drafts_asked_after_it():
    # Rule: with a helper, each row is asked for only once the kernel has published it as finished, from
    # its final score, and the step's drafts are those this thread gets asking after the kernel: a
    # helper that read a row's score early (unfinished rows hold +inf: never ask) or skipped rows at a
    # chunk's edge (the kernel publishes one row at a time here) would lose that row's tree draft.
    tree, tokens, ends, budgets, scores, (otoks, olens, oprobs) = _step(np.random.default_rng(5))
    calls = []
    asked = tree.speculate_rows
    tree.speculate_rows = lambda *a: calls.append(len(a[1])) or asked(*a)

    def kernel_after(out, progress, started):  # no helper: the rows are asked after the kernel
        assert started is None  # the kernel then keeps the GIL
        out[:] = scores
        return otoks.copy(), olens.copy(), None, out, oprobs.copy()

    want = _drafts(tree, tokens, ends, budgets, None, kernel_after)
    assert len(calls) == 1 and (want[1] != olens).any()  # some rows took the tree's draft

    def kernel_publishing(out, progress, started):  # finishes a row every 0.3 ms, the helper reading meanwhile
        out[:] = np.inf  # unfinished rows' scores: a row read early never asks
        started()
        for r in range(len(scores)):
            out[r] = scores[r]
            progress[0] = r + 1
            time.sleep(0.0003)
        return otoks.copy(), olens.copy(), None, out, oprobs.copy()

    calls.clear()
    seen = []
    rows_done(np.zeros(2, np.int64))  # compiled (or loaded) now, as the engine does, not while the kernel runs

    def kernel_watched(out, progress, started):
        seen.append(progress)
        return kernel_publishing(out, progress, started)

    with ThreadPoolExecutor(1) as helper:
        got = _drafts(tree, tokens, ends, budgets, helper.submit, kernel_watched)
    assert len(calls) > 3  # asked in pieces as rows finished
    for a, b in zip(want, got):
        assert np.array_equal(a, b)
    # a kernel that succeeded never tells the helper to stop (one that read the count and then waited for
    # the GIL would stop short of the last rows)
    assert seen[0].tolist() == [len(scores), 0]


@needs_arctic
def test_an_error_of_the_helper_is_raised_in_the_engines_thread():
    tree, tokens, ends, budgets, scores, (otoks, olens, oprobs) = _step(np.random.default_rng(7))

    def broken(*args):
        raise RuntimeError("tree failed")

    tree.speculate_rows = broken

    def kernel(out, progress, started):
        started()
        out[:] = scores
        progress[0] = len(scores)
        return otoks, olens, None, out, oprobs

    with ThreadPoolExecutor(1) as helper:
        with pytest.raises(RuntimeError, match="tree failed"):
            _drafts(tree, tokens, ends, budgets, helper.submit, kernel)


@needs_arctic
def test_a_kernel_that_fails_does_not_leave_the_helper_waiting():
    # Rule: if the kernel raises after the helper started, its error reaches the engine's thread and
    # the helper stops waiting for rows (it would otherwise hold the helper thread, and the next
    # step's growth queued behind it, forever).
    tree, tokens, ends, budgets, scores, _ = _step(np.random.default_rng(6))
    futures = []

    def beside(work):  # a daemon thread: were the helper left waiting, the test fails instead of hanging
        future = Future()
        threading.Thread(target=lambda: future.set_result(work()), daemon=True).start()
        futures.append(future)
        return future

    def kernel_failing(out, progress, started):
        started()  # no row ever counted
        raise RuntimeError("kernel failed")

    with pytest.raises(RuntimeError, match="kernel failed"):
        _drafts(tree, tokens, ends, budgets, beside, kernel_failing)
    assert futures[0].result(timeout=5.0) == ([], [], [], [])  # and it waited for the helper before raising
