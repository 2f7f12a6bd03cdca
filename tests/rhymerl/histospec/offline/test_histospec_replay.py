"""Offline replay: acceptance on hand-made histories, step by step."""

import dataclasses

import pytest

from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.offline.replay import RecordedResponse, accepted_prefix, history_for, replay
from rhymerl.histospec.drafter import new_index
from helpers.histospec_calls import replay_group

PROMPT = (100, 101, 102)
HIST = tuple(range(1, 11))  # 1..10


def test_accepted_prefix_stops_at_first_mismatch():
    assert accepted_prefix([1, 2, 9, 4], [1, 2, 3, 4]) == 2
    assert accepted_prefix([], [1]) == 0


def test_identical_response_replays_with_additive_budget():
    # Additive rule on an exact repeat: the prefill samples 1; drafts of 2 (all taken), 4 (all taken),
    # then 1 left, drafted but not taken (a response's last token is the model's own).
    cfg = SpecConfig(siblings=False, budget_rule="additive")
    index = new_index(cfg, [HIST], [1.0], prefix=PROMPT)
    s = replay_group(PROMPT, [HIST], cfg, index)
    assert (s.steps, s.tokens, s.drafted, s.accepted) == (3, 9, 7, 6)
    assert s.mean_accepted_length == pytest.approx(9 / 3)
    assert s.acceptance_by_position() == pytest.approx([2 / 3, 1.0, 1.0, 1.0])


def test_divergence_resets_the_budget_and_ends_drafting():
    # Rejection: after the prefill's 1, drafts [2,3] ok; [5,6,7,8] against 5,60 takes 1; after 60
    # nothing matches.
    response = (1, 2, 3, 4, 5, 60, 61, 62)
    cfg = SpecConfig(siblings=False, budget_rule="additive")
    s = replay_group(PROMPT, [response], cfg, new_index(cfg, [HIST], prefix=PROMPT))
    assert (s.steps, s.tokens, s.drafted, s.accepted) == (4, 7, 6, 3)
    assert s.mean_accepted_length == 1.75


def test_ngram_method_drafts_from_the_response_itself():
    # Prompt lookup: only at 1 2 3 1 2 does the tail [1,2] recur; it drafts 3 1 2, all taken.
    cfg = SpecConfig(method="ngram", min_match=2, max_match=3, max_budget=4)
    s = replay_group((100, 101), [(1, 2, 3, 1, 2, 3, 1, 2, 3)], cfg)
    assert (s.steps, s.tokens, s.drafted, s.accepted) == (5, 8, 3, 3)  # the first 1 is the prefill's


def test_siblings_draft_for_each_other_in_lockstep():
    # Siblings: B runs one token ahead in content (2 3 4 5 vs 1 2 3 4 5; the first token of each is
    # the prefill's), so in round 3 A's tail [2,3] is found in B followed by 4: A drafts [4], accepts
    # it and finishes a round early.
    group = [(1, 2, 3, 4, 5), (2, 3, 4, 5)]
    cfg = SpecConfig(min_match=2, max_match=3, budget_rule="additive", prompt_lookup=False)
    on = replay_group((100, 101), group, cfg)
    off = replay_group((100, 101), group, dataclasses.replace(cfg, siblings=False))
    assert (off.steps, off.drafted) == (7, 0)  # no history, no siblings: nothing to draft from
    assert (on.steps, on.tokens, on.drafted, on.accepted) == (6, 7, 1, 1)


def test_prompt_lookup_drafts_what_the_response_copies_from_its_prompt():
    # Prompt lookup: the index holds prefix + prompt = 4 | 1 2 3 4. After the prefill's 9 nothing
    # matches; after 2 it drafts the prompt's 3 4, both taken.
    prompt, response = (1, 2, 3, 4), (9, 2, 3, 4, 7)
    cfg = SpecConfig(min_match=1, max_match=1, siblings=False, recent_responses=0, max_spec_factor=0,
                     budget_rule="fixed", max_budget=4)
    on = replay_group(prompt, [response], cfg)
    off = replay_group(prompt, [response], dataclasses.replace(cfg, prompt_lookup=False))
    assert (on.steps, on.drafted, on.accepted) == (2, 2, 2)
    assert (off.steps, off.drafted) == (4, 0)


def test_prompt_lookup_loses_ties_to_history():
    # The prompt is the index's oldest sequence. After the prefill's 1 (tail [1]) the prompt
    # (2 | 1 5 6 2) continues 5 6 and the history response (2 | 1 7 7) 7 7: the draft follows the history.
    prompt, history, response = (1, 5, 6, 2), (1, 7, 7), (1, 7, 7, 0)
    cfg = SpecConfig(min_match=1, max_match=1, siblings=False, recent_responses=0, max_spec_factor=0,
                     budget_rule="fixed", max_budget=2)
    s = replay_group(prompt, [response], cfg, new_index(cfg, [history], prefix=prompt))
    # 7 7 taken whole (the prompt's 5 6 would be none), then the response's last token
    assert (s.drafts, s.drafted, s.accepted, s.accept_len_hist) == (1, 2, 2, [0, 0, 1])


def test_history_window_counts_epochs_that_saw_the_prompt():
    # History window: "the last epoch" means the last one that saw this prompt, not epoch - 1.
    a, b, c = (RecordedResponse("p", e, (e,)) for e in (0, 2, 3))
    epochs = {0: [a], 2: [b], 3: [c]}
    assert history_for(epochs, 3, 1) == [b]
    assert history_for(epochs, 3, 2) == [a, b]
    assert history_for(epochs, 2, 0) == []
    assert history_for(epochs, 0, 1) == []


def test_replay_reports_per_epoch():
    # Epoch 0 has no history (9 undrafted steps after the prefill's token); epoch 1 replays the
    # exact-repeat case above, and q's second token undrafted.
    records = [RecordedResponse("p", 0, HIST, 1.0, PROMPT), RecordedResponse("p", 1, HIST, 1.0, PROMPT),
               RecordedResponse("q", 1, (5, 6), 0.0, (7, 8, 9))]
    cfg = SpecConfig(siblings=False, budget_rule="additive", recent_responses=0, prompt_lookup=False)
    report = replay(records, cfg)
    assert report.per_epoch[0].steps == 9 and report.per_epoch[0].drafted == 0
    assert (report.per_epoch[1].steps, report.per_epoch[1].drafted) == (3 + 1, 7)
    assert report.overall().tokens == 9 + 9 + 1
    assert sorted(report.per_epoch) == [0, 1]
    assert report.per_epoch[1].index_tokens == 3 + 10  # one history sequence: prefix + response
    assert report.per_epoch[0].index_tokens == 0  # no history, and siblings are off


def test_replay_settings_compare_methods():
    records = [RecordedResponse("p", e, HIST, 1.0, PROMPT) for e in (0, 1)]
    settings = {"histospec": SpecConfig(siblings=False, budget_rule="additive"), "ngram": SpecConfig(method="ngram")}
    reports = {name: replay(records, cfg) for name, cfg in settings.items()}
    assert reports["histospec"].overall().accepted == 6  # epoch 1: the exact-repeat case above
    assert reports["ngram"].overall().accepted == 0  # 1..10 never repeats itself
