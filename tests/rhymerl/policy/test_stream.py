"""rhymerl/policy/stream.py: a step fed group by group equals the batch step (gradients, metrics, weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from rhymerl.config.run import TrainConfig
from rhymerl.policy.stream import StreamedStep
from rhymerl.policy.trainer import Trainer, TrainExample


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64)
    path = Path(tmp_path_factory.mktemp("qwen2"))
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    return str(path)


def _ex(prompt, response, adv) -> TrainExample:
    return TrainExample(tuple(prompt), tuple(response), adv, tuple(-1.0 for _ in response))


# Three groups whose responses differ in length and count, so token- and sequence-level
# normalisers differ from each group's own: a per-group normaliser would give another update.
GROUPS = [
    [_ex((1, 2, 3), (4, 5), 1.0), _ex((1, 2, 3), (6, 7, 8, 9, 10, 11), -1.0)],
    [_ex((7,), (8, 9, 10), 0.7), _ex((7,), (11,), -0.7), _ex((7,), (12, 13), 0.0)],
    [_ex((13, 14), (15, 16, 17, 18, 19, 20, 21, 22), 1.2), _ex((13, 14), (), -1.2)],
]


def _pair(model_dir: str, **cfg) -> tuple[Trainer, Trainer]:
    config = TrainConfig(lr=1e-3, micro_batch_size=2, max_grad_norm=1e9, **cfg)  # no clipping: raw grads
    return Trainer(model_dir, config), Trainer(model_dir, config)


def _grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss_agg", ["token", "sequence"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_streamed_groups_equal_the_batch_step(model_dir: str, loss_agg: str, kl_coef: float) -> None:
    # a warm-up: the streamed update runs at the schedule's rate (half of lr in step 0 of 2) as the batch's
    batch_trainer, stream_trainer = _pair(model_dir, loss_agg=loss_agg, kl_coef=kl_coef, warmup_steps=2)
    if kl_coef:  # a reference that differs from the policy, so the KL term has a gradient
        for trainer in (batch_trainer, stream_trainer):
            with torch.no_grad():
                for p in trainer.ref_model.parameters():
                    p.add_(0.01 * torch.sin(torch.arange(p.numel(), dtype=p.dtype)).reshape(p.shape))
    whole = batch_trainer.train_step([ex for g in GROUPS for ex in g])
    step = StreamedStep(stream_trainer)
    for group in reversed(GROUPS):  # groups finish in any order
        step.add(group)
    streamed = step.finish()
    want, got = _grads(batch_trainer), _grads(stream_trainer)
    assert want.keys() == got.keys() and want
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-7, rtol=1e-5)
    for key in ("loss", "grad_norm", "kl", "clip_frac", "ratio_mean", "tokens", "logprob_abs_diff"):
        assert streamed[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-8), key
    if kl_coef:
        assert whole["kl"] > 0
    # Weights after AdamW: its first step is ~lr * grad / |grad|, which turns float noise on a
    # near-zero gradient into up to ~lr; 1% of lr still catches any scale error (that shows above).
    after = dict(stream_trainer.model.named_parameters())
    for name, p in batch_trainer.model.named_parameters():
        torch.testing.assert_close(after[name], p, atol=1e-5, rtol=0)
    assert stream_trainer.policy_version == batch_trainer.policy_version == 1
    assert streamed["lr"] == whole["lr"] == pytest.approx(5e-4)
    assert stream_trainer.lr_step == batch_trainer.lr_step == 1


def test_the_test_sees_a_per_group_normaliser(model_dir: str) -> None:
    # Power: normalising each group by its own token count (the mistake the scaling avoids) moves
    # the gradients far beyond the tolerance above.
    batch_trainer, group_trainer = _pair(model_dir)
    batch_trainer.train_step([ex for g in GROUPS for ex in g])
    acc: dict[str, torch.Tensor] = {}
    for group in GROUPS:
        group_trainer.optimizer.zero_grad(set_to_none=True)
        step = StreamedStep(group_trainer)
        step.add(group)
        step.finish()  # each group scaled by its own count
        for name, g in _grads(group_trainer).items():
            acc[name] = acc.get(name, 0) + g
    want = _grads(batch_trainer)
    worst = max(float((acc[n] - want[n]).abs().max() / want[n].abs().max().clamp(min=1e-12)) for n in want)
    assert worst > 0.05


def test_misuse_is_refused(model_dir: str) -> None:
    trainer = Trainer(model_dir, TrainConfig(updates_per_step=2))
    with pytest.raises(ValueError, match="updates_per_step=2"):
        StreamedStep(trainer)
    step = StreamedStep(Trainer(model_dir, TrainConfig()))
    with pytest.raises(ValueError, match="at least one group"):
        step.finish()
    step.add(GROUPS[0])
    step.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        step.add(GROUPS[1])
