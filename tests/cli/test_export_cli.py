"""`rhymerl export`: a run's checkpoint picked from the lake, exported as a loadable folder; errors first."""

from __future__ import annotations

import pytest
import torch

from cli.export import main
from helpers.export import tiny_source
from rhymerl.config.run import TrainConfig, config_from_dict, config_to_dict
from rhymerl.policy.trainer import Trainer
from storage.checkpoints import CheckpointStore
from storage.lake import LakeWriter

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A lake with run r1 (model.path = a tiny source) and its checkpoints after global steps 1
    (epoch 0) and 3 (epoch 1), each a different step's weights; run r0 has none. No RL run needed."""
    root = tmp_path_factory.mktemp("export")
    source = tiny_source(root / "source")
    lake = str(root / "lake")
    cfg = config_from_dict({"model": {"path": str(source)}, "lake": {"url": lake}})
    writer = LakeWriter(lake)
    writer.write_run("r1", "rhymerl", config_to_dict(cfg))
    writer.write_run("r0", "rhymerl", config_to_dict(cfg))
    trainer, store, weights = Trainer(str(source), TrainConfig(), threads=1), CheckpointStore(f"{lake}/_checkpoints"), {}
    for step, epoch in ((1, 0), (3, 1)):
        with torch.no_grad():
            for p in trainer.model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        weights[step] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        store.save("r1", step, trainer.state_bytes(), {"epoch": epoch, "step": step % 2, "policy_version": step + 1})
    return lake, weights


def _export(capsys, *argv):
    code = main(["export", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("epoch, step", [(None, 3), (0, 1)])
def test_exports_the_newest_or_the_epochs_checkpoint(run, tmp_path, capsys, epoch, step) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lake, weights = run
    extra = [] if epoch is None else ["--epoch", str(epoch)]
    code, out, err = _export(capsys, "r1", str(tmp_path / "out"), "--lake", lake, *extra)
    assert (code, err) == (0, "")
    assert f"global step {step}" in out and str(tmp_path / "out") in out
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for name, tensor in weights[step].items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert AutoTokenizer.from_pretrained(tmp_path / "out").encode("12+3")


@pytest.mark.parametrize("argv, message", [
    (["nope", "OUT"], r"has no run 'nope' \(its runs: r0, r1\)"),
    (["r0", "OUT"], r"run r0 has no committed checkpoint in .*nothing to export"),
    (["r1", "OUT", "--epoch", "5"], r"no checkpoint of epoch 5; its checkpoints: epoch 0 \(global step 1\), "
                                    r"epoch 1 \(global step 3\)"),
    (["r1", "TAKEN"], r"TAKEN already exists; remove it or choose another folder"),
])
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, argv, message) -> None:
    import re

    lake, _ = run
    (tmp_path / "TAKEN").mkdir()
    argv = [str(tmp_path / a) if a in ("OUT", "TAKEN") else a for a in argv]
    code, out, err = _export(capsys, *argv, "--lake", lake)
    assert code == 2 and out == "" and err.count("\n") == 1 and re.search(message, err), err
    assert not (tmp_path / "OUT").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["TAKEN"]  # nothing half-written left
