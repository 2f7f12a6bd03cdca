"""`rhymerl spec replay` on a small local lake whose epoch 1 repeats epoch 0."""

from __future__ import annotations

import json
import random
import sys

import pytest

from cli.main import main
from rhymerl.errors import ConfigError
from helpers.marks import needs_arctic
from rhymerl.histospec.offline.tuning import default_settings, parse_overrides, replay_configs
from rhymerl.policy.build import build_tokenizer
from rhymerl.data.records import prompt_id_of
from storage.lake import LakeWriter, rows_to_table

RUN = "r1"
PROMPTS, SAMPLES, LENGTH = 3, 4, 40


def _responses() -> dict[str, list[list[int]]]:
    """Per prompt, SAMPLES random responses: nothing repeats inside one, so n-gram lookup finds little."""
    rng = random.Random(0)
    return {f"p{i}": [[rng.randrange(1000) for _ in range(LENGTH)] for _ in range(SAMPLES)]
            for i in range(PROMPTS)}


def _texts() -> dict[str, str]:
    """Prompt id -> rendered prompt text, the id hashing the text's tokens as the run would."""
    tok = build_tokenizer()
    texts = [f"question {i}: add them up\n" for i in range(PROMPTS)]
    return {prompt_id_of(tok.encode(t, add_special_tokens=False)): t for t in texts}


def _write_lake(url: str, texts: dict[str, str]) -> str:
    """Run r1: epoch 0 as above; epoch 1 gives every prompt exactly its epoch-0 responses again."""
    w = LakeWriter(url)
    w.write_run(RUN, "spec-cli-test", {"epochs": 2})
    groups = dict(zip(texts, _responses().values()))
    for epoch in (0, 1):
        table = rows_to_table([{"run_id": RUN, "epoch": epoch, "step": 0, "prompt_id": pid, "sample_idx": k,
                                "prompt_text": texts[pid], "reward": float(k % 2), "response_token_ids": tokens,
                                "length": len(tokens)}
                               for pid, group in groups.items() for k, tokens in enumerate(group)])
        w.commit_step(RUN, epoch, 0, [w.write_rollouts(RUN, epoch, 0, 0, 0, table)])
    return url


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _write_lake(str(tmp_path_factory.mktemp("spec") / "lake"), _texts())


def _replay(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(["spec", "replay", *argv])
    out, err = capsys.readouterr()
    return code, out, err


RECOVERED = f"prompt tokens recovered for {PROMPTS} of {PROMPTS} prompts (the built-in byte-level tokenizer)"


def _rows(capsys: pytest.CaptureFixture, lake: str, *argv: str) -> dict[tuple[str, object], dict]:
    code, out, err = _replay(capsys, "--lake", lake, "--run", RUN, "--format", "json", *argv)
    expected = [] if "--without-prompts" in argv else [RECOVERED]
    assert code == 0 and [x for x in err.splitlines() if x != default_settings()[1]] == expected
    return {(r["setting"], r["epoch"]): r for r in json.loads(out)}


def test_prompts_are_recovered_from_their_text(lake: str, tmp_path, capsys: pytest.CaptureFixture) -> None:
    # Rule: each response replays after its prompt (re-encoded text whose hash is the prompt id), so
    # epoch 1's first tokens are drafted from history too: fewer steps than without prompts.
    on = _rows(capsys, lake, "--settings", "histospec")
    off = _rows(capsys, lake, "--settings", "histospec", "--without-prompts")
    assert on["histospec", 1]["steps"] < off["histospec", 1]["steps"]
    # a response's first token is the prefill's (not drafted for, not counted) once its prompt is known
    assert (on["histospec", 1]["tokens"], off["histospec", 1]["tokens"]) == (
        PROMPTS * SAMPLES * (LENGTH - 1), PROMPTS * SAMPLES * LENGTH)
    # A text that does not encode to its id (here: edited) replays without a prompt, and says so.
    texts = {pid: (t if i else t + "!") for i, (pid, t) in enumerate(_texts().items())}
    code, _, err = _replay(capsys, "--lake", _write_lake(str(tmp_path / "lake"), texts), "--run", RUN,
                           "--settings", "histospec", "--format", "json")
    assert code == 0 and f"prompt tokens recovered for {PROMPTS - 1} of {PROMPTS} prompts" in err
    assert "does not encode to their recorded prompt_id" in err


def test_repeated_epoch_is_drafted_from_history(lake: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: an exact repeat of last epoch is drafted from history; n-gram and epoch 0 have nothing to draft from.
    rows = _rows(capsys, lake)
    assert set(rows) == {(name, e) for name in default_settings()[0] for e in (0, 1, "all")}
    hist1, hist0, ngram1 = rows["histospec", 1], rows["histospec", 0], rows["ngram", 1]
    assert hist1["mean_accepted_length"] > 4 and hist1["acceptance_rate"] > 0.5
    assert hist0["mean_accepted_length"] < 1.2 and ngram1["mean_accepted_length"] < 1.2
    assert rows["siblings-only", 1]["mean_accepted_length"] < 1.2  # siblings differ from each other
    # Every setting emits every recorded token but the prefill's exactly once, per epoch and in the "all" row.
    assert all(r["tokens"] == PROMPTS * SAMPLES * (LENGTH - 1) * (2 if e == "all" else 1) for (_, e), r in rows.items())
    total = rows["histospec", "all"]
    assert total["steps"] == hist0["steps"] + hist1["steps"] and total["accepted"] == hist1["accepted"]


def test_epochs_filter_keeps_history(lake: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: --epochs 1 reports epoch 1 only, still drafted from epoch 0's responses.
    full = _rows(capsys, lake, "--settings", "histospec")
    only = _rows(capsys, lake, "--epochs", "1", "--settings", "histospec")
    assert set(only) == {("histospec", 1), ("histospec", "all")}
    assert only["histospec", 1] == full["histospec", 1] and only["histospec", "all"]["epoch"] == "all"
    assert only["histospec", "all"]["steps"] == full["histospec", 1]["steps"]


def test_set_applies_to_every_setting(lake: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: --set overrides every setting; a budget of 1 token caps a step at 2 tokens (draft + bonus).
    rows = _rows(capsys, lake, "--settings", "histospec", "histospec-additive", "--set", "max_budget=1")
    assert all(0 < r["mean_accepted_length"] <= 2 for r in rows.values())
    assert rows["histospec", 1]["mean_accepted_length"] == rows["histospec-additive", 1]["mean_accepted_length"]


@needs_arctic
def test_suffix_arms_draft_a_repeated_epoch(lake: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: every suffix cache here holds last epoch's responses (one step earlier), so the repeat is
    # drafted; epoch 0's random responses give nothing to draft from.
    rows = _rows(capsys, lake, "--settings", "suffix", "suffix-prompt", "suffix-step")
    assert all(rows[name, 1]["mean_accepted_length"] > 4 for name in ("suffix", "suffix-prompt", "suffix-step"))
    assert rows["suffix", 0]["mean_accepted_length"] < 1.2
    assert all(r["tokens"] == PROMPTS * SAMPLES * (LENGTH - 1) * (2 if e == "all" else 1) for (_, e), r in rows.items())


def test_suffix_without_library_names_make_setup(lake: str, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    # Rule: naming a suffix setting without arctic-inference is a one-line error that says to run make setup.
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import now fails
    code, out, err = _replay(capsys, "--lake", lake, "--run", RUN, "--settings", "suffix")
    assert (code, out) == (2, "") and "make setup" in err and len(err.splitlines()) == 1
    rows = _replay(capsys, "--lake", lake, "--run", RUN, "--format", "json")  # default: suffix left out
    assert rows[0] == 0 and "suffix" not in rows[1] and "skipped" in rows[2] and "make setup" in rows[2]


def test_table_format(lake: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: the table has a header naming the run, aligned columns and one line per (setting, epoch).
    code, out, _ = _replay(capsys, "--lake", lake, "--run", RUN, "--settings", "ngram")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(f"run {RUN}: {PROMPTS} prompts, {PROMPTS * SAMPLES * 2} responses")
    assert lines[1].split() == ["setting", "epoch", "mean_accepted_length", "acceptance_rate", "steps",
                                "tokens", "drafted", "accepted"]
    assert [line.split()[:2] for line in lines[3:6]] == [["ngram", "0"], ["ngram", "1"], ["ngram", "all"]]
    assert lines[-1] == "(3 rows)"


def test_unknown_run_lists_runs(lake: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: an unknown run id is a one-line error (exit 2) naming the runs the lake holds.
    code, out, err = _replay(capsys, "--lake", lake, "--run", "nope")
    assert (code, out) == (2, "")
    assert err == f"error: run 'nope' is not in lake {lake}; runs found: r1 (2 epochs, 24 responses)\n"


def test_missing_epoch_and_empty_lake(lake: str, tmp_path, capsys: pytest.CaptureFixture) -> None:
    # Rule: asking for an epoch the run lacks, or reading an empty or absent lake, is a one-line error.
    code, _, err = _replay(capsys, "--lake", lake, "--run", RUN, "--epochs", "1,5")
    assert code == 2 and "has no responses in epoch 5; epochs with responses: 0, 1" in err
    code, _, err = _replay(capsys, "--lake", str(tmp_path), "--run", RUN)
    assert code == 2 and err == f"error: lake {tmp_path} has no committed rollouts; point --lake at a run's lake\n"
    code, _, err = _replay(capsys, "--lake", str(tmp_path / "absent"), "--run", RUN)
    assert code == 2 and "does not exist" in err and len(err.splitlines()) == 1


def test_bad_set_and_setting_name_the_key(lake: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: a wrong override or setting fails before any replay, naming the key or the known names.
    code, out, err = _replay(capsys, "--lake", lake, "--run", RUN, "--set", "max_bugdet=32")
    assert (code, out) == (2, "") and "unknown config key 'spec.max_bugdet'" in err and "max_budget" in err
    code, _, err = _replay(capsys, "--lake", lake, "--run", RUN, "--set", "max_budget=lots")
    assert code == 2 and "'spec.max_budget': expected int, got 'lots'" in err
    code, _, err = _replay(capsys, "--lake", lake, "--run", RUN, "--set", "min_match=3", "max_match=2")
    assert code == 2 and "'spec.max_match'" in err  # SpecConfig's own check: max_match >= min_match
    code, _, err = _replay(capsys, "--lake", lake, "--run", RUN, "--settings", "fast")
    assert code == 2 and "unknown setting 'fast'; known settings: histospec," in err


def test_overrides_parse_like_toml() -> None:
    # Rule: values parse as TOML, bare words are strings, `spec.` is optional, bools are not ints.
    assert parse_overrides(["spec.max_budget=32", "budget_rule=additive", "siblings=false"]) == {
        "max_budget": 32, "budget_rule": "additive", "siblings": False}
    with pytest.raises(ConfigError, match="'spec.max_budget': expected int, got True"):
        parse_overrides(["max_budget=true"])
    with pytest.raises(ConfigError, match="unknown config key 'spec.enabled'"):
        parse_overrides(["enabled=false"])  # replay never reads it
    configs = replay_configs(["ngram", "siblings-only"], ["min_match=2"])
    assert (configs["ngram"].method, configs["ngram"].min_match) == ("ngram", 2)
    assert (configs["siblings-only"].history_epochs, configs["siblings-only"].min_match) == (0, 2)
