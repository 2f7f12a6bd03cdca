"""Growing the siblings and the cross-prompt tree behind the step (`rhymerl.histospec.growth`): the
helper thread adds what the step would have added, from a copy of the engine's rows, and its errors
surface in the engine's thread."""

import numpy as np
import pytest

from rhymerl.histospec.drafter import SpecConfig
from rhymerl.histospec.growth import _gather
from rhymerl.histospec.index import HistoryBundle, PromptHistory
from rhymerl.histospec.suffix import has_arctic_inference
from rhymerl.vllm.histospec_proposer import BatchDrafter


def test_gather_copies_each_rows_slice_in_order():
    # Rule: part j is tokens[rows[j], held[j]:upto[j]]; parts follow each other, empty ones included.
    tokens = np.arange(40, dtype=np.int32).reshape(4, 10)
    flat, starts, ends = _gather(tokens, np.array([2, 0, 3]), np.array([1, 5, 7]), np.array([4, 5, 9]))
    assert flat.tolist() == [[21, 22, 23, 37, 38]]
    assert starts.tolist() == [0, 3, 3] and ends.tolist() == [3, 3, 5]
    tokens[:] = -1  # a copy: the engine may overwrite its rows while the helper reads
    assert flat.tolist() == [[21, 22, 23, 37, 38]]


def _steps(seed: int = 0, prompts: int = 2, samples: int = 3, length: int = 60):
    """A bundle, the rows' prompts and responses, and per step the tokens each row samples (1-4)."""
    rng = np.random.default_rng(seed)
    heads = [(1000 + p, 2000 + p) for p in range(prompts)]
    base = rng.integers(1, 40, (prompts, length))
    hists = [tuple(tuple(int(t) for t in np.where(rng.random(length) < 0.1, 7, base[p])) for _ in range(2))
             for p in range(prompts)]
    bundle = HistoryBundle(tuple(PromptHistory(h, r, (1.0, 0.0)) for h, r in zip(heads, hists)))
    live = [(p, np.where(rng.random(length) < 0.1, 9, base[p])) for p in range(prompts) for _ in range(samples)]
    return bundle, heads, live, rng


@pytest.mark.parametrize("tree", [False, True])
def test_growth_behind_the_step_ends_in_the_indexes_growth_in_the_step_builds(tree):
    # Rule: after the helper finishes, every prompt's siblings (sequences and occurrences) and the
    # tree's responses equal those of a drafter that grew them in the step, though the engine's
    # rows were overwritten meanwhile.
    if tree and not has_arctic_inference():
        pytest.skip("arctic-inference not installed (make setup builds it)")
    bundle, heads, live, rng = _steps()
    arms = {}
    for behind in (False, True):
        spec = SpecConfig(cost_aware=False, recent_responses=8 if tree else 0, grow_behind=behind, fail_backoff=0)
        arms[behind] = BatchDrafter(bundle, spec, k=4, max_model_len=80)
    rows = np.zeros((len(live), 80), np.int32)
    num = np.zeros(len(live), np.int64)
    for i, (p, resp) in enumerate(live):
        rows[i, :3] = (*heads[p], resp[0])
        num[i] = 3
    sampled = [[int(r[0])] for _, r in live]
    for _ in range(12):
        for behind, bd in arms.items():
            mine = rows.copy()
            bd.propose(sampled, num, mine)
            mine[:] = -3  # the engine reuses its rows while the helper works
            bd.growth.finish()
        inline, behind = arms[False], arms[True]
        for k, prompt in inline.prompts.items():
            a, b = prompt.index.side, behind.prompts[k].index.side
            assert [a.sequence(s) for s in range(len(a))] == [b.sequence(s) for s in range(len(b))]
            assert a.occurrences == b.occurrences > 0
        if tree:
            assert inline.recent.lengths == behind.recent.lengths and sum(inline.recent.lengths.values())
        sampled = []
        for i, (_, resp) in enumerate(live):
            new = resp[num[i] - 2:num[i] - 2 + int(rng.integers(1, 5))]
            rows[i, num[i]:num[i] + len(new)] = new
            num[i] += len(new)
            sampled.append(new.tolist())
    assert behind.stats.grow_seconds > 0 and inline.stats.grow_seconds == 0


def test_an_error_in_the_helper_surfaces_at_the_next_step():
    # Rule: growth that failed behind the step raises in the engine's thread when the next step starts.
    bundle, heads, live, _ = _steps(prompts=1, samples=2)
    bd = BatchDrafter(bundle, SpecConfig(cost_aware=False, recent_responses=0, grow_behind=True), k=4,
                      max_model_len=80)
    rows = np.zeros((2, 80), np.int32)
    for i, (_, resp) in enumerate(live):
        rows[i, :4] = (*heads[0], resp[0], resp[1])
    bd.propose([[int(resp[0])] for _, resp in live], np.array([3, 3]), rows)

    def broken(*args):
        raise RuntimeError("sibling table full")

    bd.sides.extend_rows = broken
    bd.propose([[int(resp[1])] for _, resp in live], np.array([4, 4]), rows)  # queues the growth
    with pytest.raises(RuntimeError, match="sibling table full"):
        bd.propose([[5], [5]], np.array([5, 5]), rows)
