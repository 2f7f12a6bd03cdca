"""Recovering a run's prompt token ids from the lake's prompt text (`rhymerl.histospec.offline.tuning`)."""

import json

from rhymerl.histospec.offline.tuning import RecoveredPrompts, recover_prompts, run_tokenizer
from rhymerl.data.records import prompt_id_of


def test_built_in_runs_use_the_byte_level_tokenizer():
    # Rule: a run without model.path was tokenized by the built-in tokenizer: one token per ASCII byte.
    encode, source = run_tokenizer(json.dumps({"model": {"path": ""}}))
    assert source == "the built-in byte-level tokenizer"
    assert len(encode("a=6 b=0\n")) == 8


def test_a_missing_model_or_broken_config_says_why():
    # Rule: no tokenizer is a reason in words, not an exception (replay then runs without prompts).
    assert run_tokenizer("{not json") == "the run's recorded config has no readable model section"
    assert run_tokenizer(json.dumps({"model": {"path": "/nowhere/model"}})) == (
        "the run's model.path /nowhere/model is not a folder here (run from where the run was)")
    assert run_tokenizer(json.dumps({"model": None}))[1] == "the built-in byte-level tokenizer"


def test_a_model_folder_without_a_tokenizer_is_a_reason(tmp_path):
    # Rule: a folder that exists but holds no tokenizer costs the prompts, not the replay.
    got = run_tokenizer(json.dumps({"model": {"path": str(tmp_path)}}))
    assert isinstance(got, str) and got.startswith(f"the tokenizer of the run's model.path {tmp_path} did not load")
    line = RecoveredPrompts({}, 3, got, no_tokenizer=True).describe()
    assert line == f"all 3 prompts replay without their prompt tokens: {got}"


def test_only_texts_that_hash_to_their_prompt_id_are_kept():
    # Rule: an id is recovered only when the encoded text hashes to it; the rest are counted missing.
    encode, source = run_tokenizer(None)
    good, other = "question 1\n", "question 2\n"
    texts = {prompt_id_of(encode(good)): good, prompt_id_of(encode(other)): other + " ", "abc": None}
    got = recover_prompts(texts, encode, source)
    assert got.token_ids == {prompt_id_of(encode(good)): tuple(encode(good))} and got.missing == 2
    assert got.describe().startswith("prompt tokens recovered for 1 of 3 prompts (the built-in byte-level")
    assert recover_prompts({}, encode, source).describe() == (
        "prompt tokens recovered for 0 of 0 prompts (the built-in byte-level tokenizer)")


def test_a_run_with_model_path_uses_that_tokenizer(tmp_path):
    # Rule: a run with model.path reads that folder's tokenizer (here the built-in one, saved there).
    from rhymerl.policy.build import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path)
    encode, source = run_tokenizer(json.dumps({"model": {"path": str(tmp_path)}}))
    assert source == f"the tokenizer of {tmp_path}"
    assert encode("a=6\n") == run_tokenizer(None)[0]("a=6\n") and len(encode("a=6\n")) == 4
