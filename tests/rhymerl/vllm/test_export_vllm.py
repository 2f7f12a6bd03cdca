"""An exported checkpoint gives the trainer's log-probs in transformers and in vLLM, for a one-rank
(trainer.pt) and a two-rank (sharded DCP) checkpoint.

The checkpoints come from trainers that take GRPO steps and save, as a run's would (no RL run):
a `Trainer`'s state bytes after one step in the checkpoint store, and a 2-rank `ShardedTrainer`
(FSDP2 on gloo, two spawned processes) writing DCP shards after two steps, committed by the store
(`helpers.export.trained_exports`, the `exports` fixture of this folder's conftest). Each is
exported from its checkpoint step folder (`rhymerl.policy.export.export_checkpoint`). One vLLM
engine starts with `LLM(OUT)` on the one-rank export (`export_engine`, shared with
test_engine_weight_sync); the two-rank export, written by the same `export_hf` and checked to hold
the same files and config, is then loaded into that engine in place as a run's weight sync loads
the trainer's weights: the model's whole state dict, `lm_head.weight` included (a tied export's
files hold only the embedding, which vLLM's in-place reload does not tie by itself).

Log-probs are of fixed token sequences (`probe_ids`): ids[i + 1] given ids[:i + 1]. Tolerances,
float32 on CPU: transformers 1e-5 (the trainer's own forward, only the load in between); vLLM
1e-4 (its own kernels; the run's weight sync accepts 1e-3).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]
HF_TOL, VLLM_TOL = 1e-5, 1e-4


def _hf_logprobs(folder, ids: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    return logp.gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).tolist()


@pytest.mark.parametrize("kind", ["one-rank", "two-rank"])
def test_transformers_gives_the_trainers_logprobs(exports, kind: str) -> None:
    found, ids = exports
    folder, want = found[kind]
    assert _hf_logprobs(folder, ids) == pytest.approx(want, abs=HF_TOL)


def test_vllm_gives_the_trainers_logprobs(exports, export_engine) -> None:
    import json

    from transformers import AutoModelForCausalLM

    found, ids = exports
    (one, one_lp), (two, two_lp) = found["one-rank"], found["two-rank"]
    assert max(abs(a - b) for a, b in zip(one_lp, two_lp)) > 10 * VLLM_TOL  # the check can tell them apart
    # The same folder layout and config: what `LLM(OUT)` reads of the one-rank export holds for both.
    assert sorted(f.name for f in one.iterdir()) == sorted(f.name for f in two.iterdir())
    assert json.loads((one / "config.json").read_text()) == json.loads((two / "config.json").read_text())
    # The engine started on the one-rank export (probed before any test loaded other weights).
    assert export_engine.started_logprobs == pytest.approx(one_lp, abs=VLLM_TOL), one.name
    # The two-rank export's weights, in place as a weight sync loads them (whole state dict).
    engine = export_engine.engine
    engine.load_weights(AutoModelForCausalLM.from_pretrained(two).state_dict().items())
    assert engine.probe_logprobs(ids) == pytest.approx(two_lp, abs=VLLM_TOL), two.name
