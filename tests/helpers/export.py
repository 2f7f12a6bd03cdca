"""What the export tests share: a tiny random Qwen2 with the built-in tokenizer, saved as a model folder."""

from __future__ import annotations

import torch


def tiny_source(folder, hidden: int = 16, layers: int = 2, heads: int = 2):
    """A seeded tied Qwen2 (vocab of the built-in tokenizer) with its tokenizer and generation
    config saved in `folder`: what a run's model.path holds. Returns `folder`."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from rhymerl.policy.build import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=1, intermediate_size=2 * hidden,
                         max_position_embeddings=128, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, dtype="float32", architectures=["Qwen2ForCausalLM"])
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
