"""`rhymerl run --config A --config B`: the files layer in order, under the environment and --set;
a missing or malformed file is bad input naming it; --resume with --config takes the files."""

from __future__ import annotations

import json

import pytest

from cli.main import EXIT_BAD_INPUT, main

SWITCHBOARD = ("RHYMERL_LAKE", "RHYMERL_MODEL", "RHYMERL_DATASET", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in SWITCHBOARD:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "run.toml").write_text('name = "layered"\n[rollout]\nn = 4\nmax_tokens = 99\n[lake]\nurl = "here"\n')
    (tmp_path / "cluster.toml").write_text('[lake]\nurl = "s3://bucket/lake"\n[tracking]\nuri = "http://mlflow:5000"\n')
    return tmp_path


def printed(capsys, *argv: str) -> dict:
    assert main(["run", *argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


def test_later_files_override_earlier_ones_key_by_key(files, capsys, monkeypatch):
    cfg = printed(capsys, "--config", "run.toml", "--config", "cluster.toml")
    assert (cfg["name"], cfg["rollout"]["n"], cfg["rollout"]["max_tokens"]) == ("layered", 4, 99)
    assert (cfg["lake"]["url"], cfg["tracking"]["uri"]) == ("s3://bucket/lake", "http://mlflow:5000")
    assert printed(capsys, "--config", "cluster.toml", "--config", "run.toml")["lake"]["url"] == "here"
    # the environment, then --set, over every file
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///m.db")
    cfg = printed(capsys, "--config", "run.toml", "--config", "cluster.toml", "--set", "rollout.n=6")
    assert (cfg["tracking"]["uri"], cfg["rollout"]["n"]) == ("sqlite:///m.db", 6)


def test_resume_with_config_files_takes_the_files(files, capsys):
    # Rule: --resume without --config reads the run's stored config; with --config, the files.
    cfg = printed(capsys, "--resume", "layered-1", "--config", "run.toml", "--config", "cluster.toml")
    assert (cfg["rollout"]["n"], cfg["lake"]["url"]) == (4, "s3://bucket/lake")


@pytest.mark.parametrize("second, content, message", [
    ("missing.toml", None, "error: config file missing.toml does not exist; pass an existing TOML file to --config"),
    ("bad.toml", "[lake\n", "error: config file bad.toml is not valid TOML"),
    ("typo.toml", "[lake]\nuri = 'x'\n", "error: typo.toml: unknown config key 'lake.uri'"),
])
def test_a_bad_file_is_bad_input_naming_it(files, capsys, second, content, message):
    if content is not None:
        (files / second).write_text(content)
    assert main(["run", "--config", "run.toml", "--config", second, "--print-config"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
