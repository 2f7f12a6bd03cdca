"""What the sharded-training tests share: a tiny tied Qwen2 and a batch of uneven examples."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from rhymerl.policy.trainer import TrainExample

# Uneven lengths: a 2-rank split gives one rank more micro-batches (padding passes on the other);
# one example has no response tokens (it still counts as a sequence in "sequence" aggregation).
BATCH = [
    TrainExample((1, 2, 3), (4, 5), 1.0),
    TrainExample((7,), (8, 9, 10, 11, 12, 13, 14, 15, 16), -0.5),
    TrainExample((3, 4, 5, 6), (), 0.0),
    TrainExample((13, 14), (15, 16, 17), 0.7),
    TrainExample((2,), (3, 4, 5, 6, 7), -1.2),
    TrainExample((9, 10, 11), (12,), 0.3),
    TrainExample((20, 21), (22, 23, 24, 25), 0.9),
]


def tiny_qwen2(path: Path) -> str:
    """A 2-block Qwen2 with tied embeddings, seeded, saved at `path`."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64, tie_word_embeddings=True)
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    return str(path)
