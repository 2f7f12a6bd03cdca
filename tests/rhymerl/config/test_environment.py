"""The switchboard: environment settings, their precedence, and the table in docs/cluster.md that lists them."""

import json
from pathlib import Path

import pytest

from cli.main import main
from helpers.infra import settings_table
from rhymerl.config.run import load_config, resolve_config
from rhymerl.errors import ConfigError
from rhymerl.config.environment import ALL_ENV, CONFIG_ENV, env_layer, env_sources, merge

ROOT = Path(__file__).resolve().parents[2]
ENV = {"RHYMERL_LAKE": "s3://bucket/lake", "RHYMERL_MODEL": "/models/qwen",
       "RHYMERL_DATASET": "/data/gsm8k.jsonl", "MLFLOW_TRACKING_URI": "http://mlflow:5000",
       "MLFLOW_EXPERIMENT_NAME": "cluster"}


def test_every_config_setting_reaches_its_key():
    cfg = load_config(None, env=ENV)
    assert (cfg.lake.url, cfg.model.path, cfg.data.dataset, cfg.tracking.uri, cfg.tracking.experiment) == (
        "s3://bucket/lake", "/models/qwen", "/data/gsm8k.jsonl", "http://mlflow:5000", "cluster")


def test_precedence_default_file_env_set(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[lake]\nurl = "from-file"\n[tracking]\nuri = "sqlite:///file.db"\n')
    # default < file
    assert load_config(None).lake.url == "lake" and load_config(f).lake.url == "from-file"
    # file < env (only the keys the environment sets; the rest of the file stays)
    cfg = load_config(f, env={"RHYMERL_LAKE": "from-env"})
    assert (cfg.lake.url, cfg.tracking.uri) == ("from-env", "sqlite:///file.db")
    # env < --set
    assert load_config(f, ['lake.url="from-set"'], env={"RHYMERL_LAKE": "from-env"}).lake.url == "from-set"


def test_empty_variable_counts_as_unset_and_none_ignores_env():
    assert env_layer({"RHYMERL_LAKE": "", "MLFLOW_TRACKING_URI": "x"}) == {"tracking": {"uri": "x"}}
    assert load_config(None, env=None).lake.url == "lake"  # library callers see no environment


def test_resumed_config_takes_env_like_a_file():
    stored = {"lake": {"url": "stored"}, "epochs": 3}
    cfg = resolve_config(stored, ["epochs=5"], {"RHYMERL_LAKE": "env-lake"})
    assert (cfg.lake.url, cfg.epochs) == ("env-lake", 5)


def test_merge_keeps_siblings():
    # A layer sets one leaf of a table; the table's other keys survive.
    assert merge({"a": {"x": 1, "y": 2}, "b": 3}, {"a": {"y": 9}}) == {"a": {"x": 1, "y": 9}, "b": 3}


def test_cli_flag_beats_set_beats_env(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    assert main(["run", "--print-config", "--set", 'tracking.uri="sqlite:///x.db"', "--lake", "flag-lake"]) == 0
    out, err = capsys.readouterr()
    cfg = json.loads(out)
    assert cfg["lake"]["url"] == "flag-lake"  # --lake over --set/env
    assert cfg["tracking"]["uri"] == "sqlite:///x.db"  # --set over env
    assert cfg["model"]["path"] == "/models/qwen"  # env over configs/default.toml
    assert "model.path from $RHYMERL_MODEL" in err
    assert "lake.url from $RHYMERL_LAKE (overridden" in err


def test_env_values_are_validated_like_any_other(monkeypatch, capsys):
    # A bad value from the environment fails with the key's name, like a bad --set would.
    with pytest.raises(ConfigError, match="data.prompt_template"):
        resolve_config({}, ['data.prompt_template="x"'], {"RHYMERL_DATASET": "d.jsonl"})
    assert env_sources({"RHYMERL_DATASET": "d.jsonl"}) == {"data.dataset": "RHYMERL_DATASET"}


def test_settings_table_lists_every_setting_and_its_key():
    table = settings_table()
    assert set(table) >= {s.name for s in ALL_ENV}
    for s in CONFIG_ENV:  # the row names the config key the variable sets
        assert f"`{s.key}`" in table[s.name], s.name
