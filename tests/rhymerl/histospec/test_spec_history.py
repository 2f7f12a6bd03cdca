"""HistoSpec's per-epoch history: the lake query, the bundle, the engine settings, the counters."""

from __future__ import annotations

import pytest

from rhymerl.config.run import load_config

from rhymerl.errors import ConfigError
from rhymerl.vllm.engine import stats_from_counters
from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.bundle import HistoryBundle, HistoryColumns, bundle_for_epoch, uses_bundle
from rhymerl.vllm.speculation import engine_speculation
from rhymerl.data.records import Prompt, prompt_id_of
from storage.lake import Lake, LakeWriter, rows_to_table


def _prompt(ids: tuple[int, ...]) -> Prompt:
    return Prompt(prompt_id=prompt_id_of(ids), index=0, text="", token_ids=ids, answer="1")


def _commit(w: LakeWriter, run: str, epoch: int, rows: list[tuple[str, int, list[int], float]]) -> None:
    table = rows_to_table([{"run_id": run, "epoch": epoch, "step": 0, "prompt_id": p, "sample_idx": s,
                            "response_token_ids": t, "reward": r, "length": len(t)} for p, s, t, r in rows])
    w.commit_step(run, epoch, 0, [w.write_rollouts(run, epoch, 0, 0, 0, table)])


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    url = str(tmp_path_factory.mktemp("hist") / "lake")
    w = LakeWriter(url)
    _commit(w, "r", 0, [("a", 0, [1, 2], 0.0), ("a", 1, [3], 1.0), ("b", 0, [4], 0.0)])
    _commit(w, "r", 1, [("a", 0, [5, 6], 1.0)])  # b not seen in epoch 1
    _commit(w, "r", 2, [("a", 0, [7], 0.0), ("b", 0, [8], 1.0)])
    _commit(w, "other", 2, [("a", 0, [99], 1.0)])  # another run never leaks in
    with Lake(url) as lk:
        yield lk


def _history(lake: Lake, epoch: int, k: int) -> list[tuple]:
    t = lake.prompt_history("r", epoch, k).to_pydict()
    return list(zip(t["prompt_id"], t["epoch"], t["response_token_ids"], t["reward"]))


def test_history_is_the_last_k_epochs_that_saw_each_prompt(lake):
    # Rule: the window counts epochs that saw the prompt, so b (skipped by epoch 1) still gets
    # epoch 0 as its last epoch before 2; only the run asked for, only epochs before ep.
    assert _history(lake, 2, 1) == [("a", 1, [5, 6], 1.0), ("b", 0, [4], 0.0)]
    assert _history(lake, 3, 2) == [("a", 1, [5, 6], 1.0), ("a", 2, [7], 0.0),
                                    ("b", 0, [4], 0.0), ("b", 2, [8], 1.0)]
    assert _history(lake, 0, 1) == []


def test_bundle_holds_every_prompt_and_only_their_history():
    # Rule: every epoch prompt is in the bundle (siblings need it), history rows of other
    # prompts and empty responses are dropped, NULL rewards count as 0; no settings ride along.
    a, b = _prompt((10, 11)), _prompt((12,))
    hist = {"prompt_id": [a.prompt_id, a.prompt_id, "zzz", b.prompt_id],
            "response_token_ids": [[1, 2], [3], [4], []], "reward": [1.0, None, 1.0, 0.0]}
    blob, info = bundle_for_epoch([a, b], hist)
    bundle = HistoryBundle.from_bytes(blob)
    assert [bundle.prompt(k).tolist() for k in range(len(bundle))] == [[10, 11], [12]]
    assert [a.tolist() for a in bundle.history(0)] == [[1, 2, 3], [2, 1], [1.0, 0.0]]
    assert len(bundle.history(1)[1]) == 0
    assert (info.prompts, info.prompts_with_history, info.responses, info.tokens) == (2, 1, 2, 3)
    with pytest.raises(ValueError, match="differ in length"):
        bundle_for_epoch([a], {"prompt_id": ["x"], "response_token_ids": [], "reward": []})


def test_engine_settings_follow_the_spec_section():
    # Rule: HistoSpec plugs in as vLLM's custom_class drafter with the exact verifier by
    # default; n-gram is vLLM's own; off means no speculation and no bundle.
    hs = engine_speculation(SpecConfig(max_budget=12))
    assert (hs.method, hs.num_speculative_tokens, hs.verifier) == ("custom_class", 12, "exact")
    assert hs.model.endswith("HistoSpecProposer") and uses_bundle(SpecConfig())
    ng = engine_speculation(SpecConfig(method="ngram", verifier="vllm"))
    assert (ng.method, ng.verifier) == ("ngram", "vllm") and not uses_bundle(SpecConfig(method="ngram"))
    assert engine_speculation(SpecConfig(enabled=False)) is None


def test_run_config_has_a_checked_spec_section():
    cfg = load_config(None, ["spec.budget_rule=additive", "spec.siblings=false"])
    assert cfg.spec.budget_rule == "additive" and cfg.spec.siblings is False and cfg.spec.enabled
    with pytest.raises(ConfigError, match="spec.budget_rule"):
        load_config(None, ["spec.budget_rule=linear"])
    with pytest.raises(ConfigError, match="unknown config key 'spec.foo'"):
        load_config(None, ["spec.foo=1"])


def test_vllm_counters_become_spec_stats():
    # Hand-computed: 10 drafts of 3 tokens; position 0 accepted 6 times, 1: 4, 2: 1 -> drafts
    # with exactly 0/1/2/3 accepted: 4/2/3/1; 11 accepted of 100 emitted tokens -> 89 steps.
    stats = stats_from_counters({"drafts": 10, "drafted": 30, "accepted": 11, "tokens": 100,
                                 "accepted_at": [6, 4, 1]})
    assert stats.accept_len_hist == [4, 2, 3, 1] and stats.draft_len_hist == [0, 0, 0, 10]
    assert stats.steps == 89 and stats.mean_accepted_length == pytest.approx(100 / 89)
    assert stats.acceptance_by_position() == pytest.approx([0.6, 0.4, 0.1])  # of drafts reaching j
    assert stats_from_counters({}).steps == 0


def test_warm_start_fills_only_prompts_without_history(lake):
    # Rule: another run's history joins only for prompts this run has not seen; own rows win.
    def rows(c: HistoryColumns) -> list[tuple]:
        return [(p, c.tokens[c.offsets[i]:c.offsets[i + 1]].tolist(), float(c.rewards[i]))
                for i, p in enumerate(c.prompt_ids)]

    own = HistoryColumns.from_lists({"prompt_id": ["a"], "response_token_ids": [[1]], "reward": [1.0]})
    warm = HistoryColumns.from_arrow(lake.prompt_history("other", 2**31 - 1, 1))  # run "other": prompt a only
    assert rows(own.merged(warm)) == rows(own)
    merged = HistoryColumns.empty().merged(HistoryColumns.from_arrow(lake.prompt_history("r", 2**31 - 1, 1)))
    assert rows(merged) == [("a", [7], 0.0), ("b", [8], 1.0)]
