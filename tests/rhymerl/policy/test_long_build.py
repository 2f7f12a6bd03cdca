"""The long-tail task's built-in model recipe: its own cache folder, length-sorted SFT, bucketed evaluation."""

import json
from dataclasses import replace

import torch

from rhymerl.data.long import parse_long_question
from rhymerl.policy import build
from rhymerl.policy.build import BUILD_INFO, BuildSettings, build_tokenizer, ensure_builtin_model, sft_problems
from rhymerl.policy.long_build import LENGTH_EDGES, LongBuildSettings, build_settings_for, long_chain_batch

# A one-layer model, a few steps, a tiny evaluation: a few seconds on 2 cores.
TINY_LONG = replace(LongBuildSettings(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                    intermediate_size=64, steps=2, batch_size=4, warmup_steps=1, max_steps=20,
                    long_steps=2, long_batch_size=2, eval_problems=1, eval_max_tokens=4)


def test_the_default_recipe_and_its_cache_folder_are_unchanged():
    # Rule: adding the long recipe leaves `make run`'s cached model (builtin-9e5a9cfe) where it was.
    assert BuildSettings().fingerprint()[:8] == "9e5a9cfe"
    assert build_settings_for("builtin") == BuildSettings() and build_settings_for("x.jsonl") == BuildSettings()


def test_the_long_recipe_has_its_own_fingerprint_and_folder(tmp_path):
    # Rule: the long model is cached beside the default one, under its own name and hash.
    spec = build_settings_for("builtin-long")
    assert isinstance(spec, LongBuildSettings) and spec.fingerprint() != BuildSettings().fingerprint()
    assert replace(spec, median_steps=17).fingerprint() != spec.fingerprint()
    path = ensure_builtin_model(tmp_path, TINY_LONG, progress=False)
    assert path.name == f"builtin-long-{TINY_LONG.fingerprint()[:8]}"
    info = json.loads((path / BUILD_INFO).read_text())
    assert info["spec"]["median_steps"] == 20 and info["steps_run"] == 2
    assert info["second_stage_steps"] == 2 and info["second_stage_final_loss"] > 0  # the long-chain stage ran
    # One bucket per length edge, each with its problems, however badly a 2-step model answers.
    assert [int(k) for k in info["eval"]["count_by_length"]] == list(LENGTH_EDGES)


def test_sft_draws_shorter_chains_of_the_same_task():
    # Rule: SFT problems come from the run's task (same s, d ranges and clip) with the SFT median count.
    spec = replace(LongBuildSettings(), batch_size=400)
    counts = sorted(parse_long_question(p.question)[2] for p in next(sft_problems(spec)))
    assert counts[len(counts) // 2] <= spec.sft_median_steps + 2 < spec.median_steps
    assert all(s <= spec.max_start and 1 <= d <= spec.max_step
               for s, d, _ in map(parse_long_question, (p.question for p in next(sft_problems(spec)))))


def test_sft_draws_long_problems_and_sorted_chunks_keep_the_batch_loss():
    # Rule: SFT batches are the long task's; cutting a batch into length-sorted chunks changes the
    # padding, not the loss or its gradient (the sum over all tokens / their count).
    spec = replace(TINY_LONG, batch_size=8)
    batch = next(sft_problems(spec))
    assert all(parse_long_question(p.question) for p in batch)
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = _tiny_model(spec, tok)
    grads = []
    for chunks in (1, 4):
        model.zero_grad()
        loss = build.sft_backward(model, tok, batch, chunks)
        grads.append((loss, [p.grad.clone() for p in model.parameters()]))
    assert abs(grads[0][0] - grads[1][0]) < 1e-5
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads[0][1], grads[1][1]))


def test_the_second_stage_draws_long_chains_log_uniform():
    # Rule: chain lengths span long_min_steps..max_steps, about as many per factor of length
    # (log-uniform): with 3..220, a quarter of them are 3-8 additions long and a sixth 100 or more.
    import random

    spec = replace(LongBuildSettings(), long_batch_size=4000)
    counts = [parse_long_question(p.question)[2] for p in long_chain_batch(random.Random(0), spec)]
    assert min(counts) == spec.long_min_steps and spec.max_steps - 3 <= max(counts) <= spec.max_steps
    share = lambda lo, hi: sum(lo <= c <= hi for c in counts) / len(counts)  # noqa: E731
    assert 0.20 < share(3, 8) < 0.30 and 0.14 < share(100, 220) < 0.22


def test_the_second_stage_weighs_each_problem_alike():
    # Rule: the stage's loss is the mean over problems of each one's token mean, whatever the chunking,
    # so one 1,500-token chain counts as much as a 20-token one.
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = _tiny_model(TINY_LONG, tok)
    from rhymerl.data.long import make_long_problem
    batch = [make_long_problem(0, 1, 2, 3), make_long_problem(1, 4, 1, 19), make_long_problem(2, 0, 3, 7)]
    results = []
    for chunks in (1, 3):
        model.zero_grad()
        loss = build.sft_backward(model, tok, batch, chunks, per_sequence=True)
        results.append((loss, [p.grad.clone() for p in model.parameters()]))
    means = []
    for p in batch:
        inputs, targets, mask = build.sft_batch([p], tok)
        logits = model(input_ids=inputs).logits
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        means.append(float((nll * mask).sum() / mask.sum()))
    assert abs(results[0][0] - sum(means) / 3) < 1e-5 and abs(results[1][0] - sum(means) / 3) < 1e-5
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(results[0][1], results[1][1]))


def _tiny_model(spec, tok):
    from transformers import Qwen2ForCausalLM

    return Qwen2ForCausalLM(build._model_config(spec, tok)).float()
