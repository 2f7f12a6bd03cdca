"""The vLLM adapter's HistoSpec proposer on plain arrays (no engine): which prompt and request a batch
row is, per-request budgets, siblings, settings from `additional_config`, the bundle file."""

from types import SimpleNamespace

import numpy as np

from rhymerl.histospec.bundle import HistoryBundle, PromptHistory
from rhymerl.histospec.engine.requests import PromptTable
from rhymerl.config.spec import SpecConfig
from helpers.histospec_calls import tree_rules
from rhymerl.data.records import prompt_id_of
from rhymerl.histospec.engine.step_drafter import BatchDrafter
from rhymerl.vllm.histospec_proposer import INDEX_ENV, HistoSpecProposer
from rhymerl.vllm.speculation import drafter_settings, engine_speculation


class FakeBatch:
    """Rows of prompt + response tokens as vLLM's input batch keeps them."""

    def __init__(self, rows, width=64):
        self.tokens = np.zeros((len(rows), width), dtype=np.int32)
        self.num = np.zeros(len(rows), dtype=np.int32)
        for i, r in enumerate(rows):
            self.tokens[i, :len(r)] = r
            self.num[i] = len(r)

    def append(self, i, toks):
        n = self.num[i]
        self.tokens[i, n:n + len(toks)] = toks
        self.num[i] += len(toks)


def test_disabled_spec_drafts_nothing():
    prompt = (50, 51, 52)
    bundle = HistoryBundle.of((PromptHistory(prompt, ((1, 2, 3, 4),), (0.0,)),))
    bd = BatchDrafter(bundle, tree_rules(enabled=False), k=8, max_model_len=64)
    batch = FakeBatch([prompt + (1,)])
    assert bd.propose([[1]], batch.num, batch.tokens) == [[]]


def test_prompt_table_prefers_the_longest_known_prompt():
    table = PromptTable([(5, 6), (5, 6, 7)])
    assert table.lookup(np.array([5, 6, 7, 9, 0], dtype=np.int32), 4) == 1
    assert table.lookup(np.array([5, 6, 8, 9], dtype=np.int32), 4) == 0
    assert table.lookup(np.array([4, 6, 8], dtype=np.int32), 3) is None
    # A row must hold at least one response token beyond the prompt.
    assert table.lookup(np.array([5, 6, 7, 0], dtype=np.int32), 3) == 0


def test_batch_drafter_drafts_from_history_and_adapts_the_budget():
    prompt, hist = (50, 51, 52), (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    bundle = HistoryBundle.of((PromptHistory(prompt, (hist,), (1.0,)),))
    bd = BatchDrafter(bundle, tree_rules(siblings=False, budget_rule="additive"), k=8, max_model_len=64)
    batch = FakeBatch([prompt + (1,)])  # after prefill the row holds the prompt and one token
    assert bd.propose([[1]], batch.num, batch.tokens) == [[2, 3]]  # additive rule starts at 2
    batch.append(0, [2, 3, 4])  # both drafts accepted, plus the bonus token
    assert bd.propose([[2, 3, 4]], batch.num, batch.tokens) == [[5, 6, 7, 8]]  # budget 2 -> 4
    batch.append(0, [5, 77])  # one accepted, then the model disagreed
    assert bd.propose([[5, 77]], batch.num, batch.tokens) == [[]]  # no match after 77
    assert (bd.stats.steps, bd.stats.drafted, bd.stats.accepted) == (2, 6, 3)


class ScriptedSwitch:
    """A `SpecSwitch` stand-in answering `start` from a script (True: the step drafts)."""

    def __init__(self, modes):
        self.modes, self.calls = list(modes), []

    def start(self, rows, emitted):
        self.calls.append((rows, emitted))
        return self.modes.pop(0)


def test_steps_the_switch_runs_plainly_draft_nothing_and_drafting_resumes_after():
    # Rule: a plain step (the switch's choice) returns no draft and does none of the drafter's work;
    # when drafting resumes, the request is found again by its prompt and drafts from its history.
    prompt, hist = (50, 51, 52), tuple(range(1, 13))
    bundle = HistoryBundle.of((PromptHistory(prompt, (hist,), (1.0,)),))
    switch = ScriptedSwitch([True, False, False, True])
    bd = BatchDrafter(bundle, tree_rules(siblings=False, budget_rule="fixed", max_budget=3, max_spec_factor=0),
                      k=8, max_model_len=64, switch=switch)
    batch = FakeBatch([prompt + (1,)])
    assert bd.propose([[1]], batch.num, batch.tokens) == [[2, 3, 4]]
    batch.append(0, [2, 3, 4, 5])  # the draft accepted, plus the bonus token
    assert bd.propose([[2, 3, 4, 5]], batch.num, batch.tokens) == [[]]
    assert (bd.stats.steps, bd.stats.drafted, bd.stats.accepted) == (1, 3, 3)  # the verified draft counted
    step = bd.step
    batch.append(0, [6])
    assert bd.propose([[6]], batch.num, batch.tokens) == [[]]
    # after a plain step, a plain step does no work: its request's step is only counted
    assert (bd.step, bd.stats.steps, bd.stats.tokens, bd.stats.drafted) == (step, 2, 5, 3)
    batch.append(0, [7])
    assert bd.propose([[7]], batch.num, batch.tokens) == [[8, 9, 10]]
    assert (bd.stats.steps, bd.stats.tokens) == (3, 6)  # the step it was found again in counted too
    assert switch.calls == [(1, 1), (1, 4), (1, 1), (1, 1)]  # rows decoding, tokens they sampled


def test_batch_drafter_tracks_requests_that_move_rows_and_shares_siblings():
    # Rows are identified by content, so a request moved to another row keeps its state; an
    # unknown prompt gets no draft; a sibling that is ahead drafts for the one behind.
    prompt = (50, 51, 52)
    bundle = HistoryBundle.of((PromptHistory(prompt),))
    spec = tree_rules(min_match=2, max_match=3, budget_rule="fixed", max_budget=8,
                      recent_responses=0)  # siblings only (the cross-prompt tree lags by < TREE_CHUNK)
    bd = BatchDrafter(bundle, spec, k=8, max_model_len=64)
    batch = FakeBatch([prompt + (1, 2, 3, 4), prompt + (9,), (7, 7, 7, 7)])
    out = bd.propose([[4], [9], [7]], batch.num, batch.tokens)
    assert out == [[], [], []]  # siblings so far: 1 2 3 4 and 9, nothing repeats
    batch2 = FakeBatch([prompt + (9, 1, 2), prompt + (1, 2, 3, 4, 5)])  # rows swapped, one gone
    # Row 0 now holds the second request, two tokens longer; row 1 the first, one token longer.
    out = bd.propose([[1, 2], [5]], batch2.num, batch2.tokens)
    assert out[0] == [3, 4, 5]  # from the sibling 1 2 3 4 5
    assert bd.stats.steps == 2  # both requests were recognised, not restarted
    assert prompt_id_of(prompt) == prompt_id_of(list(batch2.tokens[0, :3]))


def test_batch_drafter_copies_from_the_prompt_without_history():
    # Rule: with spec.prompt_lookup a prompt without history drafts what its request copies from the
    # prompt (after 51, the prompt's 52 53 54); without it there is nothing to draft from (the siblings'
    # rows start with the prompt's last max_match = 7 tokens only: 60..66).
    prompt = (50, 51, 52, 53, 54, 60, 61, 62, 63, 64, 65, 66)
    bundle = HistoryBundle.of((PromptHistory(prompt),))
    drafts = {}
    for lookup in (True, False):
        spec = tree_rules(budget_rule="fixed", max_budget=3, max_spec_factor=0, recent_responses=0,
                          prompt_lookup=lookup)
        bd = BatchDrafter(bundle, spec, k=3, max_model_len=64)
        batch = FakeBatch([prompt + (9, 51)])
        drafts[lookup] = bd.propose([[9, 51]], batch.num, batch.tokens)
    assert drafts == {True: [[52, 53, 54]], False: [[]]}


def test_histospec_settings_reach_the_proposer_through_additional_config():
    # One typed value: SpecConfig -> EngineSpeculation -> (vLLM) -> the same SpecConfig in the proposer.
    spec = tree_rules(max_budget=16, min_match=2, siblings=False)
    engine = engine_speculation(spec)
    assert engine.speculative_config() == {"method": "custom_class", "num_speculative_tokens": 16,
                                           "model": "rhymerl.vllm.histospec_proposer.HistoSpecProposer"}
    assert drafter_settings(dict(engine.additional_config), 16) == spec
    assert drafter_settings(None, 4) == SpecConfig(max_budget=4)  # an engine built without them
    assert engine_speculation(tree_rules(enabled=False)) is None
    assert engine_speculation(tree_rules(method="ngram", max_budget=4)).speculative_config()["prompt_lookup_max"] == 7


def test_proposer_reads_the_published_bundle_when_it_changes(tmp_path, monkeypatch):
    # The worker finds the bundle through the environment and re-reads it once it is (re)written.
    path = tmp_path / "histospec.npz"
    monkeypatch.setenv(INDEX_ENV, str(path))
    spec = tree_rules(siblings=False, budget_rule="fixed", max_budget=8)
    vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                                  model_config=SimpleNamespace(max_model_len=64),
                                  additional_config=dict(engine_speculation(spec).additional_config))
    proposer = HistoSpecProposer(vllm_config)
    proposer.load_model(object())
    prompt, hist = (50, 51, 52), (1, 2, 3, 4, 5, 6, 7)
    batch = FakeBatch([prompt + (1,)])
    assert proposer.propose([[1]], batch.num, batch.tokens) == [[]]  # nothing published yet
    path.write_bytes(HistoryBundle.of((PromptHistory(prompt, (hist,), (0.0,)),)).to_bytes())
    batch = FakeBatch([prompt + (1,)])  # a new request after the bundle appeared
    assert proposer.propose([[1]], batch.num, batch.tokens) == [[2, 3, 4, 5]]  # k=4 caps budget 8
    batch.append(0, [2, 3, 4, 5, 6])
    proposer.propose([[2, 3, 4, 5, 6]], batch.num, batch.tokens)
    stats = proposer.take_stats()
    assert (stats.steps, stats.drafted, stats.accepted) == (1, 4, 4)
    assert proposer.take_stats().steps == 0  # taking resets


def test_a_new_bundle_keeps_what_the_drafter_learnt_about_the_engine(tmp_path, monkeypatch):
    # Rule: bundles now change every step (each worker's own prompts), so a reload keeps the
    # cross-prompt tree, the step cost model and the acceptance per position; it drops the bundle.
    path = tmp_path / "histospec.npz"
    monkeypatch.setenv(INDEX_ENV, str(path))
    vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                                  model_config=SimpleNamespace(max_model_len=64),
                                  additional_config=dict(engine_speculation(tree_rules()).additional_config))
    path.write_bytes(HistoryBundle.of((PromptHistory((50, 51), ((1, 2),), (0.0,)),)).to_bytes())
    proposer = HistoSpecProposer(vllm_config)
    old = proposer._batch
    path.write_bytes(HistoryBundle.of((PromptHistory((60,), ((3,),), (0.0,)),)).to_bytes())
    batch = FakeBatch([(60, 3)])
    proposer.propose([[3]], batch.num, batch.tokens)
    new = proposer._batch
    assert new is not old and len(new.bundle) == 1 and new.bundle.prompt(0).tolist() == [60]
    assert new.recent is old.recent and new.cost is old.cost and new.lifetime is old.lifetime
    assert new.switch is old.switch and new.switch is not None  # the run's defaults switch per band


def test_a_large_history_builds_in_the_background_and_the_step_drafts_from_siblings_meanwhile(monkeypatch):
    # Rule: a step never waits for a history build: until it is attached the prompt drafts from its
    # siblings; once attached, from its history too.
    import threading

    import rhymerl.histospec.engine.batch as hp

    release = threading.Event()
    real_build = hp.FlatIndex.build

    def slow_build(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():  # the background build only
            release.wait(10)  # (not the kernels' warm-up in the drafter's constructor)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(hp, "INLINE_TOKENS", 0)  # every history goes to the background thread
    monkeypatch.setattr(hp.FlatIndex, "build", slow_build)
    prompt, hist = (50, 51, 52), (1, 2, 3, 4, 5, 6, 7, 8)
    spec = tree_rules(budget_rule="fixed", max_budget=4, recent_responses=0, cost_aware=False)
    bundle = HistoryBundle.of((PromptHistory(prompt, (hist, hist), (0.0, 0.0)),))
    bd = BatchDrafter(bundle, spec, k=4, max_model_len=64)
    batch = FakeBatch([prompt + (1, 2, 3, 9, 1), prompt + (1,)])
    out = bd.propose([[1], [1]], batch.num, batch.tokens)
    assert bd.building == 1
    assert out[1] == [2, 3, 9, 1]  # from the sibling "1 2 3 9 1"; the history would say 2 3 4 5
    release.set()
    bd.wait_for_builds()
    # two history responses and the prompt itself (spec.prompt_lookup), each after the prompt's tail
    assert bd.building == 0 and bd.stats.index_tokens == 2 * (len(prompt) + len(hist)) + 2 * len(prompt)
    batch.append(1, [2])
    out = bd.propose([[2]], batch.num[1:], batch.tokens[1:])
    assert out == [[3, 4, 5, 6]]  # after "1 2" the history's two occurrences outvote the sibling's one


def test_request_key_is_its_length_and_tail():
    # O(1) per request: the state key reads the length and the last KEY_TAIL tokens, not the whole
    # row; all rows' keys come from one gather. Different length or tail: different key.
    from helpers.histospec_calls import row_keys

    from rhymerl.histospec.engine.requests import KEY_TAIL

    rows = np.stack([np.arange(100, dtype=np.int32)] * 3)
    rows[1, :50] = 0
    rows[2, 79] = 7
    k0, k1, k2 = row_keys(rows, np.array([0, 1, 2]), np.array([80, 80, 80])).tolist()
    assert k0 == k1 != k2 and k0 != row_keys(rows, np.array([0]), np.array([81]))[0]
    short = rows.copy()
    short[0, 3:] = 5  # a row of 3 tokens: only they (and the length) count
    assert row_keys(rows, np.array([0]), np.array([3]))[0] == row_keys(short, np.array([0]), np.array([3]))[0]
    assert 80 > KEY_TAIL


def test_equal_keys_each_find_their_own_state():
    # Two requests with the same length and tail (siblings that began alike) keep two states; a
    # state not seen for STATE_GRACE_STEPS steps is freed.
    from helpers.histospec_calls import find

    from rhymerl.histospec.engine.requests import RequestTable

    table = RequestTable(width=4)
    x, y, z = table.alloc(), table.alloc(), table.alloc()
    table.keep(np.array([5, 7, 5], np.uint64), np.array([x, y, z]), step=0, grace=4)
    # equal keys pair in order (x before z); a key stored once is found once; an unknown key finds none
    assert find(table, np.array([5, 5, 5, 9, 7, 7], np.uint64)).tolist() == [x, z, -1, -1, y, -1]
    assert len(table) == 0
    a, b = table.alloc(), table.alloc()
    table.step[[a, b]] = 1
    table.keep(np.array([3, 3], np.uint64), np.array([a, b]), step=1, grace=4)
    assert sorted(find(table, np.array([3, 3, 3], np.uint64)).tolist()) == [-1, a, b]
    table.keep(np.array([], np.uint64), np.array([], np.int64), step=2, grace=4)  # both gone from the table
    assert len(table) == 0
    c = table.alloc()
    table.step[c] = 2
    table.keep(np.array([4], np.uint64), np.array([c]), step=2, grace=4)
    table.keep(np.array([], np.uint64), np.array([], np.int64), step=5, grace=4)  # unseen, within grace
    assert find(table, np.array([4], np.uint64)).tolist() == [c]
    table.keep(np.array([4], np.uint64), np.array([c]), step=5, grace=4)
    table.keep(np.array([], np.uint64), np.array([], np.int64), step=9, grace=4)  # past grace: freed
    assert len(table) == 0 and table.alloc() == c


def rhyming_rows(rng, prompts, samples, history, length, vocab=50, change=0.1):
    """Per prompt a random base response; its history and live samples copies with `change` of tokens
    replaced. (prompt tuples, their histories, the live rows' full responses)."""
    heads, hists, live = [], [], []
    for p in range(prompts):
        base = rng.integers(0, vocab, length)
        copies = np.repeat(base[None], history + samples, axis=0)
        hit = rng.random(copies.shape) < change
        copies[hit] = rng.integers(0, vocab, int(hit.sum()))
        heads.append((1000 + p, 2000 + p))
        hists.append(tuple(tuple(r) for r in copies[:history].tolist()))
        live += [(len(heads) - 1, r) for r in copies[history:]]
    return heads, hists, live


def test_batched_drafts_equal_the_per_row_python_drafter_step_by_step():
    # Rule: the compiled batch path (BatchDrafter.batched) drafts exactly what the Python drafter drafts
    # per row, step after step, with siblings, histories, the cross-prompt tree and rows moving.
    from rhymerl.config.spec import has_arctic_inference

    rng = np.random.default_rng(0)
    heads, hists, live = rhyming_rows(rng, prompts=3, samples=4, history=3, length=120)
    rewards = [tuple(float(x) for x in rng.random(len(h)).round(1)) for h in hists]
    bundle = HistoryBundle.of(tuple(PromptHistory(p, h, w) for p, h, w in zip(heads, hists, rewards)))
    for reward_weighted in (False, True):
        spec = tree_rules(budget_rule="doubling", max_budget=8, cost_aware=False, reward_weighted=reward_weighted,
                          recent_responses=8 if has_arctic_inference() else 0)
        arms = [BatchDrafter(bundle, spec, k=8, max_model_len=200, batched=b) for b in (True, False)]
        batch = FakeBatch([heads[k] + (int(r[0]),) for k, r in live], width=200)
        order = np.arange(len(live))
        sampled = [[int(r[0])] for _, r in live]
        for _ in range(40):
            outs = [bd.propose(sampled, batch.num, batch.tokens) for bd in arms]
            assert outs[0] == outs[1]
            drafted = sum(map(len, outs[0]))
            sampled = []
            for row, draft in enumerate(outs[0]):  # accept the draft's prefix the true response continues
                resp = live[order[row]][1]
                at = int(batch.num[row]) - 2
                ok = 0
                while ok < len(draft) and at + ok < len(resp) and draft[ok] == resp[at + ok]:
                    ok += 1
                new = [int(t) for t in resp[at:at + ok + 1]] or [7]
                batch.append(row, new)
                sampled.append(new)
            if rng.random() < 0.3:  # requests move rows
                perm = rng.permutation(len(live))
                batch.tokens, batch.num, order = batch.tokens[perm], batch.num[perm], order[perm]
                sampled = [sampled[j] for j in perm]
        assert drafted > 0 and arms[0].stats.accepted == arms[1].stats.accepted > 0


def test_requests_arriving_with_long_prefixes_catch_up_within_each_steps_allowance(monkeypatch):
    # Rule: a step adds at most its requests' new tokens plus SIDE_CATCH_UP more to the siblings
    # (TREE_CATCH_UP more to the tree); what is left waits for later steps, the siblings drafting
    # from what is indexed meanwhile; caught up, each sibling and tree response holds its whole row.
    import rhymerl.histospec.engine.step_drafter as hp
    from rhymerl.histospec.drafter import TREE_CHUNK

    monkeypatch.setattr(hp, "SIDE_CATCH_UP", 8)
    monkeypatch.setattr(hp, "TREE_CATCH_UP", 6)
    prompt = (50, 51, 52)
    spec = tree_rules(min_match=2, max_match=3, budget_rule="fixed", max_budget=4, cost_aware=False)
    bd = BatchDrafter(HistoryBundle.of((PromptHistory(prompt),)), spec, k=4, max_model_len=64)
    body = tuple(range(1, 21))  # both requests arrive 20 tokens in (moved from another worker)
    batch = FakeBatch([prompt + body, prompt + body[:12] + (99,) * 8])
    out = bd.propose([[20], [99]], batch.num, batch.tokens)
    side = bd.prompts[0].index.side
    # the first request takes its sampled token plus the whole allowance (1 + 8); the second its token
    assert side.lens[:2].tolist() == [3 + 9, 3 + 1] and bd.lagging == 11 + 19 + 13 + 19
    assert bd.recent.lengths == {0: 7, 1: 1}
    assert out == [[], []]  # nothing repeats yet in what is indexed
    steps = 1
    while bd.lagging:
        for i in range(2):
            batch.append(i, [7])
        held = side.num_tokens, bd.recent.num_tokens
        bd.propose([[7], [7]], batch.num, batch.tokens)
        assert side.num_tokens - held[0] <= 2 + 8  # the step's 2 new tokens, 8 more
        # a request in step adds its last < TREE_CHUNK tokens and this step's, 6 more in all
        assert bd.recent.num_tokens - held[1] <= 2 * (TREE_CHUNK - 1 + 1) + 6
        steps += 1
    assert steps == 5  # the siblings' 30 tokens behind, 8 a step after the first
    for seq, row in enumerate(batch.tokens):
        n = int(batch.num[seq])
        assert side.sequence(seq) == [*prompt, *row[3:n].tolist()]
        assert bd.recent.lengths[seq] >= n - 3 - (TREE_CHUNK - 1)  # the tree lags by < TREE_CHUNK


def test_a_request_whose_drafts_keep_failing_pauses_longer_each_time():
    # Rule (spec.fail_backoff): from a request's second fully rejected draft in a row it skips
    # drafting 2, 4, 8, ... steps (capped); a draft with an accepted token resets the count.
    prompt, hist = (50, 51, 52), (1, 2) * 30  # every context ending in 1 drafts 2 1 2 1
    bundle = HistoryBundle.of((PromptHistory(prompt, (hist,), (1.0,)),))
    spec = tree_rules(siblings=False, recent_responses=0, cost_aware=False, min_match=1, max_match=2,
                      max_spec_factor=0.0, budget_rule="fixed", max_budget=4, fail_backoff=8)
    bd = BatchDrafter(bundle, spec, k=4, max_model_len=512)
    batch = FakeBatch([prompt + (1,)], width=512)
    drafted_at = []
    for step in range(1, 29):
        if step > 1:
            batch.append(0, [1])  # the model disagrees with the draft's first token (2) every time
        if bd.propose([[1]], batch.num, batch.tokens)[0]:
            drafted_at.append(step)
    assert drafted_at == [1, 2, 5, 10, 19, 28]  # pauses of 2, 4, 8, then 8 (the cap)
    batch.append(0, [2, 2])  # step 28's draft 2 1 2 1: its first token accepted, then a 2 sampled
    assert bd.propose([[2, 2]], batch.num, batch.tokens)[0] == [1, 2, 1, 2]  # drafts again at once
    assert (bd.stats.steps, bd.stats.drafted, bd.stats.accepted) == (28, 6 * 4, 1)  # the same request
    off = BatchDrafter(bundle, tree_rules(**{**spec.__dict__, "fail_backoff": 0}), k=4, max_model_len=512)
    batch = FakeBatch([prompt + (1,)], width=512)
    for _ in range(6):  # without the back-off every step drafts
        assert off.propose([[1]], batch.num, batch.tokens)[0] == [2, 1, 2, 1]
        batch.append(0, [1])


def test_the_first_step_compiles_nothing(monkeypatch):
    # Rule: every compiled function the engine step calls is compiled (or loaded from numba's cache,
    # ~5-10 ms each) when the drafter is built, not in the first step it serves: two that were not
    # held that step ~18 ms (2026-12-05). A first step that opens requests with history, siblings,
    # grouping, widened rows and the cross-prompt tree must not reach numba's compiler.
    from numba.core import dispatcher

    prompt = (50, 51, 52)
    hist = tuple(range(150_000, 150_199))  # a real vocabulary's ids: the inline builds re-rank contexts
    spec = tree_rules(budget_rule="fixed", max_budget=4, cost_aware=False)
    bundle = HistoryBundle.of((PromptHistory(prompt, (hist, hist), (0.0, 1.0)), PromptHistory((60, 61), (hist,), (0.0,))))
    bd = BatchDrafter(bundle, spec, k=4, max_model_len=256)
    compiled = []
    real = dispatcher.Dispatcher.compile
    monkeypatch.setattr(dispatcher.Dispatcher, "compile",
                        lambda self, sig: compiled.append(self.py_func.__qualname__) or real(self, sig))
    batch = FakeBatch([prompt + hist[:150]] * 17 + [(60, 61) + hist[:100]], width=256)  # 17 rows: more than ROWS
    bd.propose([[t] for t in batch.tokens[np.arange(18), batch.num - 1].tolist()], batch.num, batch.tokens)
    assert compiled == []
