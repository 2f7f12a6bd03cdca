"""Export: one-rank and sharded checkpoints of a tiny random Qwen2 to a folder AutoModelForCausalLM loads."""

import json

import pytest
import torch

from rhymerl.config.run import TrainConfig
from rhymerl.policy.checkpoint import save_trainer
from rhymerl.policy.build import build_tokenizer
from rhymerl.policy.export import ExportError, export_checkpoint, export_hf, read_checkpoint_weights
from rhymerl.policy.trainer import Trainer
from helpers.export import tiny_source

TOL = 1e-6  # same weights, same CPU kernels: the log-probs agree exactly; allow float32 noise


def _source(folder, hidden=16, layers=2):
    return tiny_source(folder, hidden, layers)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A trainer on a tiny random Qwen2 whose weights moved away from its source folder's."""
    source = _source(tmp_path_factory.mktemp("source"))
    trainer = Trainer(str(source), TrainConfig(), threads=1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return source, trainer


def logprobs(model, ids):
    """(B, T-1) log-probability of each next token of the fixed sequences."""
    with torch.no_grad():
        logp = model(input_ids=ids).logits.float().log_softmax(-1)
    return logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)


def assert_round_trip(trainer, out):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(3, trainer.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    before, after = logprobs(trainer.model.eval(), ids), logprobs(loaded, ids)
    assert (before - after).abs().max().item() <= TOL
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert AutoTokenizer.from_pretrained(out).encode("12+3") == trainer_tokens("12+3")
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 1


def trainer_tokens(text):
    return build_tokenizer().encode(text)


def test_one_rank_checkpoint_round_trip(trained, tmp_path):
    source, trainer = trained
    step = tmp_path / "step-00000003"
    step.mkdir()
    (step / "trainer.pt").write_bytes(trainer.state_bytes())
    out = export_checkpoint(step, source, tmp_path / "hf")  # a step folder holding trainer.pt
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in out.iterdir()}
    assert_round_trip(trainer, out)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # save_trainer without a process group
def test_sharded_checkpoint_round_trip(trained, tmp_path):
    source, trainer = trained
    save_trainer(trainer, str(tmp_path / "dcp"))  # DCP format, as the sharded trainer writes it
    weights = read_checkpoint_weights(tmp_path / "dcp")
    assert set(weights) == set(trainer.model.state_dict())
    assert_round_trip(trainer, export_hf(weights, source, tmp_path / "hf"))


def test_errors_name_the_problem(trained, tmp_path):
    source, trainer = trained
    with pytest.raises(ExportError, match=r"is not a checkpoint: give a trainer.pt file"):
        read_checkpoint_weights(tmp_path)
    (tmp_path / "x.pt").write_bytes(b"junk")
    with pytest.raises(ExportError, match=r"x.pt cannot be read as a torch checkpoint"):
        read_checkpoint_weights(tmp_path / "x.pt")
    torch.save({"weights": {}}, tmp_path / "y.pt")
    with pytest.raises(ExportError, match=r"y.pt holds no 'model' state dict"):
        read_checkpoint_weights(tmp_path / "y.pt")
    other = _source(tmp_path / "other", hidden=16, layers=1)  # one layer fewer
    with pytest.raises(ExportError, match=r"do not fit .*other's architecture: unknown names \['model.layers.1"):
        export_hf(trainer.model.state_dict(), other, tmp_path / "hf")
    with pytest.raises(ExportError, match=r"has no config.json"):
        export_hf(trainer.model.state_dict(), tmp_path, tmp_path / "hf")
    (tmp_path / "taken").mkdir()
    with pytest.raises(ExportError, match=r"taken already exists"):
        export_hf(trainer.model.state_dict(), source, tmp_path / "taken")
    assert not list(tmp_path.glob(".hf.tmp-*"))  # nothing half-written left behind


def test_bfloat16_weights_export_as_bfloat16(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    source, trainer = trained
    weights = {k: v.to(torch.bfloat16) for k, v in trainer.model.state_dict().items()}
    out = export_hf(weights, source, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in weights.items())
