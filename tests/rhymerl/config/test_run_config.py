"""Config loading: TOML + overrides, validated with errors that name the key."""

import pytest

from rhymerl.config.fields import flatten
from rhymerl.config.run import RunConfig, config_to_dict, load_config
from rhymerl.errors import ConfigError


def test_defaults_and_overrides(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('epochs = 2\n[rollout]\nn = 4\n')
    cfg = load_config(f, ["rollout.temperature=0.7", "train.loss_agg=sequence", 'lake.url="s3://b/p"'])
    assert (cfg.epochs, cfg.rollout.n, cfg.rollout.temperature) == (2, 4, 0.7)
    assert cfg.train.loss_agg == "sequence"  # bare words parse as strings
    assert cfg.lake.url == "s3://b/p"
    assert cfg.rollout.prompts_per_step == RunConfig().rollout.prompts_per_step


def test_int_becomes_float_but_not_reverse():
    assert load_config(None, ["train.lr=1"]).train.lr == 1.0
    with pytest.raises(ConfigError, match="'rollout.n'.*integer"):
        load_config(None, ["rollout.n=2.5"])


def test_unknown_key_lists_allowed():
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.nn'.*allowed keys here: .*\bn\b"):
        load_config(None, ["rollout.nn=3"])


def test_literal_names_allowed_values():
    with pytest.raises(ConfigError, match=r"'train.loss_agg'.*'token', 'sequence'"):
        load_config(None, ["train.loss_agg=mean"])


def test_range_checks_name_field():
    with pytest.raises(ConfigError, match="'rollout.n'.*>= 2"):
        load_config(None, ["rollout.n=1"])
    with pytest.raises(ConfigError, match="'data.prompt_template'"):
        load_config(None, ['data.prompt_template="no placeholder"'])


def test_bad_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("epochs = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(None, ["epochs"])


def test_flatten_for_params():
    flat = flatten(config_to_dict(RunConfig()))
    assert flat["rollout.n"] == RunConfig().rollout.n and "train.lr" in flat


def test_default_config_file_is_the_dataclass_defaults():
    # Rule: one source of defaults; `make run`'s file adds nothing to the dataclasses.
    from pathlib import Path
    cfg = load_config(Path(__file__).resolve().parents[3] / "configs" / "default.toml")
    assert cfg == RunConfig()
    assert (cfg.epochs, cfg.data.num_prompts, cfg.spec.history_epochs) == (10, 128, 4)  # what make run ran


def test_checkpoint_section_defaults_and_checks():
    # Rule: checkpoints after every step, keep 2, next to the lake unless a dir is given.
    cfg = load_config(None, [])
    assert (cfg.checkpoint.every_steps, cfg.checkpoint.keep, cfg.checkpoint.dir) == (1, 2, "")
    cfg = load_config(None, ["checkpoint.every_steps=0", 'checkpoint.dir="s3://b/ckpt"'])
    assert (cfg.checkpoint.every_steps, cfg.checkpoint.dir) == (0, "s3://b/ckpt")
    with pytest.raises(ConfigError, match="'checkpoint.every_steps'.*>= 0"):
        load_config(None, ["checkpoint.every_steps=-1"])
    with pytest.raises(ConfigError, match="'checkpoint.keep'.*>= 1"):
        load_config(None, ["checkpoint.keep=0"])
    with pytest.raises(ConfigError, match="'checkpoint.keep'.*integer"):
        load_config(None, ["checkpoint.keep=true"])


def test_greedy_training_is_refused_naming_the_key():
    # Rule: at temperature 0 every sample of a group is the same, every advantage 0: nothing trains.
    with pytest.raises(ConfigError, match="rollout.temperature.*nothing is learned"):
        load_config(None, ["rollout.temperature=0"])


def test_streamed_training_is_off_by_default_and_refused_where_it_cannot_stream():
    assert load_config(None, []).train.stream is False
    assert load_config(None, ["train.stream=true"]).train.stream is True
    # Only a step's first update streams; the sharded trainer takes the whole batch at once.
    with pytest.raises(ConfigError, match=r"'train.stream'.*updates_per_step = 1 \(got 2\).*train.stream=false"):
        load_config(None, ["train.stream=true", "train.updates_per_step=2"])
    with pytest.raises(ConfigError, match=r"'train.stream'.*world_size = 1 \(got 2\).*train.world_size=1"):
        load_config(None, ["train.stream=true", "train.world_size=2"])


def test_config_files_layer_key_by_key(tmp_path):
    # Rule: later files override earlier ones per key; tables merge at every depth, a list is replaced.
    base, layer = tmp_path / "base.toml", tmp_path / "layer.toml"
    base.write_text('epochs = 3\n[rollout]\nn = 4\nmax_tokens = 99\n[reward]\nfunctions = ["gsm8k", "math"]\n'
                    'weights = [1.0, 1.0]\n')
    layer.write_text('[rollout]\nn = 6\n[reward]\nfunctions = ["math"]\nweights = [2.0]\n[lake]\nurl = "s3://b/l"\n')
    cfg = load_config([base, layer])
    assert (cfg.epochs, cfg.rollout.n, cfg.rollout.max_tokens) == (3, 6, 99)
    assert (cfg.reward.functions, cfg.reward.weights, cfg.lake.url) == (("math",), (2.0,), "s3://b/l")
    assert load_config([layer, base]).rollout.n == 4  # the order decides
    # the environment and --set still come on top of every file
    cfg = load_config([base, layer], ["rollout.n=8"], env={"RHYMERL_LAKE": "elsewhere"})
    assert (cfg.rollout.n, cfg.lake.url) == (8, "elsewhere")
    assert load_config([]) == load_config(None) == RunConfig()


def test_a_bad_layer_is_named(tmp_path):
    base, layer = tmp_path / "base.toml", tmp_path / "layer.toml"
    base.write_text("[rollout]\nn = 4\n")
    with pytest.raises(ConfigError, match=r"config file .*missing\.toml does not exist"):
        load_config([base, tmp_path / "missing.toml"])
    layer.write_text("[rollout\n")
    with pytest.raises(ConfigError, match=r"config file .*layer\.toml is not valid TOML"):
        load_config([base, layer])
    # Rule: a bad key or value names the file that set it last...
    layer.write_text("[rollout]\nn = 1\n")
    with pytest.raises(ConfigError, match=r"^\S*layer\.toml: config key 'rollout.n': must be >= 2"):
        load_config([base, layer])
    layer.write_text("[rolout]\nn = 4\n")
    with pytest.raises(ConfigError, match=r"^\S*layer\.toml: unknown config key 'rolout'"):
        load_config([base, layer])
    # ...and no file when --set set it over the files
    with pytest.raises(ConfigError, match=r"^config key 'rollout.n': must be >= 2"):
        load_config([base], ["rollout.n=1"])
