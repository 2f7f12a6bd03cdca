"""The run configs users start from: every `examples/*/config.toml` passes the input checks of
`rhymerl run` (config, model, the task's data, chat template, rewards and evaluation set) as
written, without a server; every `configs/*.toml` resolves and its settings agree; and each
example's data files are what its generator script writes."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(ROOT.glob("examples/*/config.toml"))
CONFIGS = sorted(ROOT.glob("configs/*.toml"))
TASK_CHECKS = ("config", "model", "dataset")  # of flows.preflight.checks; the rest probe servers


def test_the_examples_are_there():
    assert {p.parent.name for p in EXAMPLES} >= {"math-boxed", "chat-reward"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_an_example_passes_the_input_checks_from_the_repository_root(path, monkeypatch):
    from flows.preflight import checks
    from rhymerl.config.run import load_config

    monkeypatch.chdir(ROOT)  # where the user runs it: its paths are relative to the repository root
    cfg = load_config(path.relative_to(ROOT))
    named = checks(cfg, {})
    assert [str(f) for name in TASK_CHECKS for f in named[name]()] == []
    assert not cfg.data.builtin and cfg.model.path == ""  # its own task, on the built-in model


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_config_resolves_and_its_settings_agree(path):
    from rhymerl.config.run import load_config
    from rhymerl.run.preflight import check_config

    assert check_config(load_config(path)) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_an_example_s_data_is_what_its_generator_writes(path):
    written = runpy.run_path(str(path.parent / "make_data.py"))["files"]()
    assert written and all(p.parent == path.parent for p in written)
    for file, rows in written.items():
        assert [json.loads(line) for line in file.read_text().splitlines()] == rows, file.name


def test_the_chat_example_s_reward_reads_the_row_s_tolerance():
    near_miss = runpy.run_path(str(ROOT / "examples/chat-reward/reward.py"))["near_miss"]
    row = {"answer": "18", "tolerance": 2}
    # Rule: 1 at the gold sum, falling by 1/(tolerance + 1) per unit off; 0 without a final "#### n" line.
    assert near_miss("", "a=9\nb=9 9+9=18\n#### 18", row) == 1.0
    assert near_miss("", "#### 17", row) == pytest.approx(2 / 3)
    assert near_miss("", "#### 17", {**row, "tolerance": 0}) == 0.0
    assert near_miss("", "#### 21", row) == 0.0
    assert near_miss("", "18", row) == near_miss("", "", row) == 0.0
