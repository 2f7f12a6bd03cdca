"""The built-in model: character tokenizer, SFT loss mask, atomic cached build, folder validation."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rhymerl.data.builtin import make_problem, parse_terms
from rhymerl.policy import build
from rhymerl.policy.build import (BUILD_INFO, BuildSettings, build_model, build_tokenizer,
                                 ensure_builtin_model, sft_batch, sft_problems,
                                 validate_model_dir)
from rhymerl.policy.evaluate import final_answer

# A few seconds on 2 CPU cores: a one-layer model, a handful of steps, a tiny evaluation.
TINY = BuildSettings(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                     steps=3, batch_size=4, warmup_steps=1, eval_problems=4, eval_max_tokens=8)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("build") / "tiny", TINY, progress=False)


def test_tokenizer_round_trips_one_token_per_character(tok):
    # Rule: decode(encode(s)) == s, newlines and "####" included, one id per ASCII character.
    s = "12+7=19\n19+30=49\n#### 49"
    ids = tok.encode(s, add_special_tokens=False)
    assert len(ids) == len(s)
    assert tok.decode(ids) == s
    assert ids[s.index("\n")] == 3 + ord("\n")  # byte b is id 3 + b


def test_tokenizer_keeps_any_text_and_fixes_special_ids(tok):
    # Rule: any text survives (non-ASCII as several byte tokens); nothing becomes <unk>.
    q = "Natalia sold clips to 48 of her friends\tin April (50%), café costs 5€?"
    ids = tok.encode(q, add_special_tokens=False)
    assert tok.decode(ids) == q
    assert len(ids) == len(q.encode("utf-8")) and tok.unk_token_id not in ids
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id, len(tok)) == (0, 1, 2, 259)


def test_transformers_qwen2_loader_splits_text_the_same_way(tok, tmp_path):
    # Rule: AutoTokenizer on a qwen2 folder (it swaps in Qwen2Tokenizer) gives the same ids and text.
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for s in ["3+4=7\n#### 7", "  two  spaces\n\nand é"]:
        ids = tok.encode(s, add_special_tokens=False)
        assert loaded.encode(s, add_special_tokens=False) == ids
        assert loaded.decode(ids) == s
    assert (loaded.eos_token_id, loaded.pad_token_id) == (1, 0)


def test_sft_mask_covers_solution_and_eos_only(tok):
    # Rule: the loss sees the solution tokens and EOS, never the prompt or the padding.
    short, long = make_problem(0, [1, 2]), make_problem(1, [3, 4, 5])
    inputs, targets, mask = sft_batch([short, long], tok)
    assert inputs.shape == targets.shape == mask.shape
    for row, p in enumerate([short, long]):
        picked = targets[row][mask[row].bool()].tolist()
        assert picked == tok.encode(p.solution, add_special_tokens=False) + [tok.eos_token_id]
    # The prompt "a=1 b=2\n" is 8 tokens, so the first 7 positions predict nothing to learn.
    assert mask[0, :7].sum() == 0 and mask[0, 7] == 1 and mask[0].sum() == len(short.solution) + 1


def test_sft_batches_mix_term_counts_and_repeat_per_seed():
    # Rule: each batch mixes term counts over the task's range; the stream is fixed by the seed.
    spec = replace(BuildSettings(), batch_size=64)
    batches = [b for _, b in zip(range(3), sft_problems(spec))]
    counts = {len(parse_terms(p.question)) for p in batches[0]}
    assert len(batches[0]) == 64 and counts == set(range(spec.min_terms, spec.max_terms + 1))
    assert [b for _, b in zip(range(3), sft_problems(spec))] == batches
    assert batches[0] != batches[1]


def test_final_answer_reads_the_last_marker():
    # Rule: the answer is the text after the last "#### ", None when there is none.
    assert final_answer("1+2=3\n#### 3") == "3"
    assert final_answer("#### 1\n#### 12 ") == "12"
    assert final_answer("1+2=3") is None


def test_fingerprint_is_stable_and_follows_the_recipe():
    # Rule: same recipe, same hash; any change to the recipe, a different hash.
    assert BuildSettings().fingerprint() == BuildSettings().fingerprint()
    assert len(BuildSettings().fingerprint()) == 64
    assert replace(BuildSettings(), steps=451).fingerprint() != BuildSettings().fingerprint()
    assert replace(BuildSettings(), max_operand=8).fingerprint() != BuildSettings().fingerprint()


def test_bad_shapes_are_rejected():
    # Rule: head counts must divide the hidden size; the error names the fields.
    with pytest.raises(ValueError, match="num_heads"):
        BuildSettings(hidden_size=30, num_heads=4)


def test_tiny_build_loads_with_transformers(built, tok):
    # Rule: the folder is a standard HF causal LM + fast tokenizer with EOS/PAD wired through.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", BUILD_INFO]:
        assert (built / name).is_file(), name
    loaded_tok = AutoTokenizer.from_pretrained(built)
    assert loaded_tok.is_fast
    assert (loaded_tok.eos_token, loaded_tok.pad_token) == ("<eos>", "<pad>")
    assert loaded_tok.decode(loaded_tok.encode("3+4=7\n#### 7", add_special_tokens=False)) == "3+4=7\n#### 7"
    model = AutoModelForCausalLM.from_pretrained(built)
    assert model.config.eos_token_id == tok.eos_token_id and model.config.pad_token_id == tok.pad_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.config.vocab_size == len(tok)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    info = json.loads((built / BUILD_INFO).read_text())
    assert info["fingerprint"] == TINY.fingerprint() and info["spec"]["steps"] == 3
    assert 0.0 <= info["eval"]["accuracy"] <= 1.0


def test_training_stops_once_the_smoothed_loss_reaches_stop_loss(tmp_path):
    # Rule: after warmup, the first step whose smoothed loss is <= stop_loss is the last one.
    spec = replace(TINY, steps=10, warmup_steps=2, stop_loss=100.0, eval_problems=0)
    info = json.loads((build_model(tmp_path / "m", spec, progress=False) / BUILD_INFO).read_text())
    assert info["steps_run"] == 3
    assert info["eval"] == {}  # eval_problems=0 skips the evaluation


def test_build_refuses_an_existing_folder_and_leaves_no_temp(built):
    # Rule: builds never overwrite; a finished build leaves no temporary sibling behind.
    with pytest.raises(FileExistsError, match="already exists"):
        build_model(built, TINY, progress=False)
    assert [p.name for p in built.parent.iterdir()] == [built.name]


def test_ensure_builds_once_into_the_fingerprint_folder(tmp_path, monkeypatch):
    # Rule: the cache folder is builtin-<fingerprint[:8]>, built on the first call and reused after.
    spec = replace(TINY, eval_problems=0, threads=1)
    rng_before, threads_before = torch.get_rng_state(), torch.get_num_threads()
    path = ensure_builtin_model(tmp_path, spec, progress=False)
    assert path == tmp_path / f"builtin-{spec.fingerprint()[:8]}"
    validate_model_dir(path)
    # Building leaves the caller's random state and thread count alone.
    assert torch.equal(torch.get_rng_state(), rng_before) and torch.get_num_threads() == threads_before

    def must_not_build(*args, **kwargs):
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(build, "build_model", must_not_build)
    assert ensure_builtin_model(tmp_path, spec, progress=False) == path


def test_ensure_accepts_a_build_finished_by_another_process(tmp_path, monkeypatch):
    # Rule: losing the rename race is fine: the winner's complete folder is returned.
    spec = replace(TINY, eval_problems=0)
    out = tmp_path / f"builtin-{spec.fingerprint()[:8]}"

    def rival_wins(out_dir, spec, progress):
        out_dir.mkdir()
        (out_dir / BUILD_INFO).write_text("{}")
        raise FileExistsError("another process renamed first")

    monkeypatch.setattr(build, "build_model", rival_wins)
    assert ensure_builtin_model(tmp_path, spec, progress=False) == out


def _write_config(folder: Path, cfg) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return folder


def test_validate_model_dir_errors_name_the_problem(tmp_path, built):
    # Rule: each broken checkpoint folder gets its own clear error; a good one passes.
    validate_model_dir(built)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        validate_model_dir(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        validate_model_dir(tmp_path / "empty")
    with pytest.raises(ValueError, match="not valid JSON"):
        validate_model_dir(_write_config(tmp_path / "garbled", "{not json"))
    with pytest.raises(ValueError, match="not a causal LM"):
        validate_model_dir(_write_config(tmp_path / "bert", {"architectures": ["BertForMaskedLM"]}))
    with pytest.raises(ValueError, match="not a causal LM"):
        validate_model_dir(_write_config(tmp_path / "t5", {"model_type": "t5"}))
    with pytest.raises(FileNotFoundError, match="no weights"):
        validate_model_dir(_write_config(tmp_path / "noweights", {"model_type": "qwen2"}))
    (tmp_path / "noweights" / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        validate_model_dir(tmp_path / "noweights")
