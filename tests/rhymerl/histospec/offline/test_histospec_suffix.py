"""vLLM's suffix decoding (Arctic Inference) as a comparison arm: config, engine settings, replay scopes."""

import sys

import pytest

from rhymerl.config.run import load_config

from rhymerl.errors import ConfigError
from rhymerl.histospec.bundle import counted_by_vllm, uses_bundle
from rhymerl.histospec.offline.replay import (RecordedResponse, SuffixArm, replay, replay_suffix_batch,
                                              responses_per_step)
from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.stats import SpecStats
from rhymerl.vllm.speculation import engine_speculation
from rhymerl.config.spec import (SuffixUnavailable, has_arctic_inference,
                                      require_arctic_inference)
from rhymerl.run.preflight import check_config
from helpers.marks import needs_arctic

HIST = tuple(range(1, 11))  # 1..10
SUFFIX = SpecConfig(method="suffix")


def test_missing_library_names_make_setup(monkeypatch):
    # Rule: without arctic-inference, every path that needs it says to run `make setup`.
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import now fails
    with pytest.raises(SuffixUnavailable, match="make setup"):
        require_arctic_inference()
    assert not has_arctic_inference()
    with pytest.raises(SuffixUnavailable, match="make setup"):
        engine_speculation(SUFFIX)
    with pytest.raises(SuffixUnavailable, match="make setup"):
        replay([RecordedResponse("p", 0, HIST)], SUFFIX)
    found = check_config(load_config(None, ["spec.method=suffix"]))  # `rhymerl run` checks before starting
    assert [f.area for f in found] == ["config"] and "make setup" in found[0].message


def test_suffix_is_a_spec_method_without_bundle():
    # Rule: "suffix" is vLLM's own drafter: no history bundle; counted by the goodput controller, or by
    # vLLM's metrics when the controller is off.
    assert not counted_by_vllm(SUFFIX) and not counted_by_vllm(SpecConfig(method="ngram"))
    assert counted_by_vllm(SpecConfig(method="suffix", cost_aware=False))
    assert counted_by_vllm(SpecConfig(method="ngram", cost_aware=False))
    assert not counted_by_vllm(SpecConfig()) and not counted_by_vllm(SpecConfig(method="suffix", enabled=False))
    assert not uses_bundle(SUFFIX)
    with pytest.raises(ConfigError, match="'histospec', 'ngram', 'suffix'"):
        SpecConfig(method="eagle")


@needs_arctic
def test_engine_runs_stock_suffix_with_the_exact_verifier():
    # Rule: stock settings (no suffix_decoding_* keys), drafts capped at max_budget, exact verifier.
    spec = engine_speculation(SpecConfig(method="suffix", max_budget=12))
    assert (spec.method, spec.num_speculative_tokens, spec.verifier, spec.options) == ("suffix", 12, "exact", ())


def test_arm_checks_its_fields():
    with pytest.raises(ValueError, match="scope"):
        SuffixArm(scope="engine")
    with pytest.raises(ValueError, match="max_cached_requests"):
        SuffixArm(max_cached_requests=0)


def test_responses_per_step_is_the_median_step():
    # Steps of 2, 3 and 8 responses -> median 3.
    recs = ([RecordedResponse("p", 0, (1,), step=0)] * 2 + [RecordedResponse("p", 0, (1,), step=1)] * 3
            + [RecordedResponse("p", 1, (1,), step=2)] * 8)
    assert responses_per_step(recs) == 3 and responses_per_step([]) == 0


@needs_arctic
@pytest.mark.parametrize("arm", [SuffixArm(), SuffixArm(scope="prompt")], ids=["global", "prompt"])
def test_exact_repeat_drafts_grow_with_the_match(arm):
    # An exact repeat of last epoch, stock factor 1 (a draft is at most as long as the match, which
    # the library counts as context length - 1): tokens 1, 2 undrafted; then [3] at 2, [5,6,7] at 4,
    # [9,10] at 8 of which only 9 counts (the last token is the model's). 5 steps, 6 drafted, 5 taken.
    report = replay([RecordedResponse("p", 0, HIST), RecordedResponse("p", 1, HIST)], SUFFIX, arm=arm)
    e0, e1 = report.per_epoch[0], report.per_epoch[1]
    assert (e0.steps, e0.drafted) == (10, 0)
    assert (e1.steps, e1.tokens, e1.drafted, e1.accepted) == (5, 10, 6, 5)
    assert e1.draft_len_hist == [0, 1, 1, 1]


@needs_arctic
def test_one_step_cache_keeps_the_last_step_only():
    # Rule: cache_steps=1 holds the previous step's responses besides the step in flight (steps of 1
    # response here: 2 slots), so p's epoch 0 is drafted from one step later but evicted (FIFO) two
    # steps later, when q's response came in between.
    other = tuple(range(20, 30))
    near = [RecordedResponse("p", 0, HIST, step=0), RecordedResponse("p", 1, HIST, step=1)]
    far = [RecordedResponse("p", 0, HIST, step=0), RecordedResponse("q", 0, other, step=1),
           RecordedResponse("p", 1, HIST, step=2)]
    arm = SuffixArm(cache_steps=1.0)
    assert replay(near, SUFFIX, arm=arm).per_epoch[1].accepted == 5
    assert replay(far, SUFFIX, arm=arm).per_epoch[1].drafted == 0
    assert replay(far, SUFFIX, arm=SuffixArm()).per_epoch[1].accepted == 5  # the stock cache keeps it


@needs_arctic
def test_prompt_scope_holds_only_the_prompts_history():
    # Rule: per-prompt caches do not see other prompts; the stock global cache does.
    recs = [RecordedResponse("p", 0, HIST), RecordedResponse("q", 1, HIST)]
    assert replay(recs, SUFFIX, arm=SuffixArm(scope="prompt")).per_epoch[1].drafted == 0
    assert replay(recs, SUFFIX, arm=SuffixArm()).per_epoch[1].accepted == 5
    # history_epochs=0: nothing but siblings, so the repeat of p's epoch 0 is not drafted either
    same = [RecordedResponse("p", 0, HIST), RecordedResponse("p", 1, HIST)]
    none = replay(same, SpecConfig(method="suffix", history_epochs=0), arm=SuffixArm(scope="prompt"))
    assert none.per_epoch[1].drafted == 0


@needs_arctic
def test_siblings_draft_for_each_other_in_lockstep():
    # Same case as HistoSpec's sibling test: B runs one token ahead, so in round 3 A's tail [1,2]
    # finds 2 -> 3 in B and drafts [3] (match 1, factor 1), accepted. 8 steps, 9 tokens, 1 of 1.
    requests = [("a", (), (1, 2, 3, 4, 5)), ("b", (), (2, 3, 4, 5))]
    stats = replay_suffix_batch(SuffixArm().new_cache(-1), requests, SUFFIX, SuffixArm(), SpecStats())
    assert (stats.steps, stats.tokens, stats.drafted, stats.accepted) == (8, 9, 1, 1)


@needs_arctic
def test_only_epochs_still_feed_the_global_cache():
    # Rule: an epoch left out of the report still fills the global cache (it was generated).
    recs = [RecordedResponse("p", 0, HIST), RecordedResponse("p", 1, HIST)]
    report = replay(recs, SUFFIX, only_epochs={1}, arm=SuffixArm())
    assert set(report.per_epoch) == {1} and report.per_epoch[1].accepted == 5


@needs_arctic
def test_a_steps_groups_run_together_in_the_global_cache():
    # Rule: groups of one step run concurrently (as on one engine), so an identical response of
    # another prompt in the same step is never ahead to draft from; one step later it is.
    same_step = [RecordedResponse("p", 0, HIST, step=0), RecordedResponse("q", 0, HIST, step=0)]
    next_step = [RecordedResponse("p", 0, HIST, step=0), RecordedResponse("q", 0, HIST, step=1)]
    assert replay(same_step, SUFFIX, arm=SuffixArm()).per_epoch[0].drafted == 0
    assert replay(next_step, SUFFIX, arm=SuffixArm()).per_epoch[0].accepted == 5
