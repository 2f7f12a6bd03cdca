"""Trainer on a tiny random Qwen2 (no tokenizer): log-probs, GRPO steps, weights out."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers

from rhymerl.config.run import TrainConfig
from rhymerl.policy.trainer import Trainer, TrainExample


def _tiny_qwen2(path: Path, tie: bool) -> str:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64,
        tie_word_embeddings=tie)
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _tiny_qwen2(tmp_path_factory.mktemp("qwen2"), tie=False)


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _tiny_qwen2(tmp_path_factory.mktemp("qwen2_tied"), tie=True)


BATCH = [
    TrainExample(prompt_ids=(1, 2, 3), response_ids=(4, 5), advantage=1.0),
    TrainExample(prompt_ids=(7,), response_ids=(8, 9, 10, 11, 12), advantage=-0.5),
    TrainExample(prompt_ids=(3, 4, 5, 6), response_ids=(), advantage=0.0),
    TrainExample(prompt_ids=(13, 14), response_ids=(15, 16, 17), advantage=0.0),
]


def _hand_logprobs(model_dir: str, ex: TrainExample) -> list[float]:
    """One unpadded sequence through a fresh model: log_softmax at p-1+t, picked at token t."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([ex.prompt_ids + ex.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    p = len(ex.prompt_ids)
    return [logp[p - 1 + t, tok].item() for t, tok in enumerate(ex.response_ids)]


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("micro_batch_size", [1, 3, 8])
def test_sequence_logprobs_match_unpadded_forward(model_dir: str, micro_batch_size: int) -> None:
    trainer = Trainer(model_dir, TrainConfig(micro_batch_size=micro_batch_size))
    got = trainer.sequence_logprobs(BATCH)
    # right padding and batching must not change any response token's log-prob
    assert [len(row) for row in got] == [2, 5, 0, 3]
    for ex, row in zip(BATCH, got):
        assert row == pytest.approx(_hand_logprobs(model_dir, ex), abs=1e-5)


@pytest.mark.parametrize("advantage, direction", [(1.0, 1.0), (-1.0, -1.0)])
def test_train_step_moves_logprob_with_advantage_sign(model_dir: str, advantage: float,
                                                      direction: float) -> None:
    trainer = Trainer(model_dir, TrainConfig(lr=1e-3))
    ex = TrainExample(prompt_ids=(1, 2, 3), response_ids=(4, 5, 6), advantage=advantage)
    before_w = _weights(trainer)
    before = sum(trainer.sequence_logprobs([ex])[0])
    metrics = trainer.train_step([ex])
    after = sum(trainer.sequence_logprobs([ex])[0])
    # GRPO: a positive advantage raises the response's log-prob, a negative one lowers it
    assert direction * (after - before) > 0
    assert any(not torch.equal(before_w[k], v) for k, v in trainer.model.state_dict().items())
    assert trainer.policy_version == 1
    # first update of a step: the old policy is the current one, so every ratio is 1
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["clip_frac"] == 0.0
    assert metrics["tokens"] == 3.0
    assert set(metrics) == {"loss", "grad_norm", "clip_frac", "ratio_mean", "kl", "tokens",
                            "seconds", "tokens_per_s", "lr"}


def test_micro_batch_size_does_not_change_the_update(model_dir: str) -> None:
    # the loss normaliser is the whole batch's token count, so accumulation == one big batch
    whole = Trainer(model_dir, TrainConfig(lr=1e-3, micro_batch_size=4))
    split = Trainer(model_dir, TrainConfig(lr=1e-3, micro_batch_size=1))
    m_whole, m_split = whole.train_step(BATCH), split.train_step(BATCH)
    assert m_split["loss"] == pytest.approx(m_whole["loss"], abs=1e-6)
    assert m_split["grad_norm"] == pytest.approx(m_whole["grad_norm"], rel=1e-5)
    # the last update's (clipped) gradients stay on the parameters: compare them directly,
    # since Adam's first step is ~lr * sign(grad) and would hide a wrongly scaled gradient
    split_params = dict(split.model.named_parameters())
    for name, p in whole.model.named_parameters():
        torch.testing.assert_close(split_params[name].grad, p.grad, atol=1e-7, rtol=1e-4)


def test_several_updates_per_step_clip_against_the_start_of_step(model_dir: str) -> None:
    cfg = TrainConfig(lr=5e-2, updates_per_step=4, max_grad_norm=100.0)
    trainer = Trainer(model_dir, cfg)
    metrics = trainer.train_step(BATCH)
    # later updates see ratios away from 1, and some leave the clip range
    assert metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-3)
    assert metrics["clip_frac"] > 0
    assert trainer.policy_version == 1


def test_kl_penalty_uses_a_frozen_reference(model_dir: str) -> None:
    assert Trainer(model_dir, TrainConfig()).ref_model is None  # no KL, no reference copy
    trainer = Trainer(model_dir, TrainConfig(lr=1e-2, kl_coef=0.1, updates_per_step=2))
    ref_before = {k: v.clone() for k, v in trainer.ref_model.state_dict().items()}
    metrics = trainer.train_step(BATCH)
    # k3 is 0 on the first update (policy == reference) and > 0 once the policy moved
    assert metrics["kl"] > 0
    for name, w in trainer.ref_model.state_dict().items():
        assert torch.equal(w, ref_before[name])


def test_state_dict_for_engine_loads_into_a_fresh_model(model_dir: str) -> None:
    trainer = Trainer(model_dir, TrainConfig(lr=1e-3))
    trainer.train_step(BATCH)
    sd = trainer.state_dict_for_engine()
    assert set(sd) == set(trainer.model.state_dict())
    assert all(t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad
               for t in sd.values())
    fresh = transformers.Qwen2ForCausalLM(trainer.model.config).eval()
    fresh.load_state_dict(sd, strict=True)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids).logits, trainer.model(ids).logits)
    # a snapshot: training on does not change tensors already handed out
    frozen = {k: v.clone() for k, v in sd.items()}
    trainer.train_step(BATCH)
    assert all(torch.equal(sd[k], frozen[k]) for k in sd)


def test_state_dict_for_engine_keeps_tied_embeddings_identical(tied_model_dir: str) -> None:
    trainer = Trainer(tied_model_dir, TrainConfig(lr=1e-2))
    trainer.train_step(BATCH)
    sd = trainer.state_dict_for_engine()
    # tied weights share one tensor in the model, so they share one snapshot too
    assert sd["lm_head.weight"] is sd["model.embed_tokens.weight"]


def test_save_writes_a_loadable_dir_and_copies_tokenizer_files(model_dir: str,
                                                               tmp_path: Path) -> None:
    trainer = Trainer(model_dir, TrainConfig(lr=1e-3))
    trainer.train_step(BATCH)
    out = trainer.save(tmp_path / "no_tok")  # the source has no tokenizer: nothing to copy
    assert list(out.glob("*.safetensors")) and not (out / "tokenizer.json").exists()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    for name, w in trainer.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], w)

    src = tmp_path / "with_tok"
    transformers.AutoModelForCausalLM.from_pretrained(model_dir).save_pretrained(src)
    (src / "tokenizer_config.json").write_text('{"model_max_length": 64}')
    out2 = Trainer(str(src), TrainConfig()).save(tmp_path / "out2")
    assert (out2 / "tokenizer_config.json").read_text() == '{"model_max_length": 64}'


def _step_lrs(trainer: Trainer) -> list[float]:
    """Records the learning rate of every optimizer step the trainer takes from now on."""
    seen: list[float] = []
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    return seen


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_each_optimizer_step_runs_at_the_schedules_rate(model_dir: str, schedule: str) -> None:
    # Rule: optimizer step k (counted over updates, not train steps) runs at lr_at(k); the step's
    # `lr` metric is the mean over its updates. 3 train steps x 2 updates = the run's 6 steps.
    from rhymerl.policy.lr_schedule import lr_at

    cfg = TrainConfig(lr=1e-3, lr_schedule=schedule, warmup_steps=2, updates_per_step=2)
    trainer = Trainer(model_dir, cfg, total_steps=6)
    seen = _step_lrs(trainer)
    metrics = [trainer.train_step(BATCH) for _ in range(3)]
    want = [lr_at(k, 6, 1e-3, schedule, 2) for k in range(6)]
    assert seen == pytest.approx(want, rel=1e-12, abs=0)
    assert [m["lr"] for m in metrics] == pytest.approx([(a + b) / 2 for a, b in zip(want[::2], want[1::2])])
    assert trainer.lr_step == 6


def test_decaying_schedule_needs_the_run_length(model_dir: str) -> None:
    from rhymerl.errors import ConfigError

    with pytest.raises(ConfigError, match="train.lr_schedule = 'cosine' decays"):
        Trainer(model_dir, TrainConfig(lr_schedule="cosine"))


def test_load_state_resumes_exactly(model_dir: str) -> None:
    # Rule: weights, Adam moments and the learning-rate schedule come back (the lr continues).
    from rhymerl.policy.lr_schedule import lr_at

    trainer = Trainer(model_dir, TrainConfig(lr=1e-3, lr_schedule="linear"), total_steps=4)
    trainer.train_step(BATCH)
    saved = trainer.state()
    trainer.train_step(BATCH[:2])
    expected = _weights(trainer)
    trainer.load_state(saved)
    assert trainer.policy_version == 1 and trainer.lr_step == 1
    seen = _step_lrs(trainer)
    trainer.train_step(BATCH[:2])  # same step again from the restored weights + Adam moments
    assert trainer.policy_version == 2
    assert seen == pytest.approx([lr_at(1, 4, 1e-3, "linear")]) == [0.75e-3]
    for name, w in trainer.model.state_dict().items():
        torch.testing.assert_close(w, expected[name], atol=0, rtol=0)


def test_state_bytes_restore_a_fresh_trainer(model_dir: str) -> None:
    # Rule: a new trainer (a resumed run's new process) loaded from bytes continues exactly.
    cfg = TrainConfig(lr=1e-3, lr_schedule="cosine", warmup_steps=1)
    trainer = Trainer(model_dir, cfg, total_steps=3)
    trainer.train_step(BATCH)
    blob = trainer.state_bytes()
    trainer.train_step(BATCH[:2])
    fresh = Trainer(model_dir, cfg, total_steps=3)
    fresh.load_state_bytes(blob)
    assert fresh.policy_version == 1 and fresh.lr_step == 1
    fresh.train_step(BATCH[:2])
    assert fresh.lr_step == 2 and fresh.optimizer.param_groups[0]["lr"] == trainer.optimizer.param_groups[0]["lr"]
    for name, w in fresh.model.state_dict().items():
        torch.testing.assert_close(w, trainer.model.state_dict()[name], atol=0, rtol=0)


def test_bad_inputs_get_clear_errors(model_dir: str) -> None:
    trainer = Trainer(model_dir, TrainConfig())
    with pytest.raises(ValueError, match="empty batch"):
        trainer.train_step([])
    with pytest.raises(ValueError, match="empty prompt"):
        trainer.sequence_logprobs([TrainExample((), (1, 2), 1.0)])
    with pytest.raises(ValueError, match=r"outside \[0, 32\)"):
        trainer.train_step([TrainExample((1,), (40,), 1.0)])
    with pytest.raises(ValueError, match="unknown dtype"):
        Trainer(model_dir, TrainConfig(), dtype="fp8")
    with pytest.raises(ValueError, match="Trainer.state"):
        trainer.load_state({"model": {}})


def test_logprobs_are_the_sampling_distributions(model_dir: str) -> None:
    # Rule: at temperature 0.7 and top-p 0.9 the trainer's log-probs are those of logits / 0.7 with
    # the nucleus renormalised (what the engine sampled from), not of the raw softmax.
    from rhymerl.policy.sampling import sampling_probs

    trainer = Trainer(model_dir, TrainConfig(), temperature=0.7, top_p=0.9)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    got = trainer.sequence_logprobs(BATCH)
    for ex, row in zip(BATCH, got):
        ids = torch.tensor([ex.prompt_ids + ex.response_ids])
        with torch.no_grad():
            probs = sampling_probs(model(ids).logits[0], 0.7, 0.9)
        p = len(ex.prompt_ids)
        want = [math.log(max(probs[p - 1 + t, tok].item(), 1e-300)) for t, tok in enumerate(ex.response_ids)]
        inside = [probs[p - 1 + t, tok].item() > 0 for t, tok in enumerate(ex.response_ids)]
        assert [g for g, i in zip(row, inside) if i] == pytest.approx([w for w, i in zip(want, inside) if i], abs=1e-5)
    raw = Trainer(model_dir, TrainConfig()).sequence_logprobs(BATCH)
    assert max(abs(a - b) for r, q in zip(got, raw) for a, b in zip(r, q)) > 0.05


def test_train_step_reports_engine_vs_trainer_logprob_difference(model_dir: str) -> None:
    # Rule: logprob_abs_diff is the mean |sampler - trainer| log-prob before the update: ~0 when
    # the sampler used the trainer's weights and settings, large when its temperature differed.
    trainer = Trainer(model_dir, TrainConfig(lr=1e-3), temperature=0.7, top_p=0.9)
    batch = [ex for ex in BATCH if ex.response_ids]
    same = [TrainExample(ex.prompt_ids, ex.response_ids, ex.advantage, tuple(lp))
            for ex, lp in zip(batch, trainer.sequence_logprobs(batch))]
    at_t1 = [TrainExample(ex.prompt_ids, ex.response_ids, ex.advantage, tuple(lp))
             for ex, lp in zip(batch, Trainer(model_dir, TrainConfig()).sequence_logprobs(batch))]
    assert trainer.train_step(same)["logprob_abs_diff"] < 1e-6
    assert trainer.train_step(at_t1)["logprob_abs_diff"] > 0.05
    assert "logprob_abs_diff" not in trainer.train_step(batch)  # no sampler log-probs, no metric


def test_trainer_refuses_greedy_sampling(model_dir: str) -> None:
    with pytest.raises(ValueError, match="temperature > 0"):
        Trainer(model_dir, TrainConfig(), temperature=0.0)


def test_probe_logprobs_are_the_raw_next_token_logprobs(model_dir: str) -> None:
    # Rule: the weight-sync probe is the untempered log-prob of each token after the ones before
    # it, whatever the run's sampling settings (engines report their prompt log-probs raw).
    from rhymerl.policy.trainer import probe_ids

    ids = probe_ids(32, 12)
    trainer = Trainer(model_dir, TrainConfig(), temperature=0.7, top_p=0.9)
    want = _hand_logprobs(model_dir, TrainExample(tuple(ids[:1]), tuple(ids[1:]), 0.0))
    assert trainer.probe_logprobs(ids) == pytest.approx(want, abs=1e-5)
