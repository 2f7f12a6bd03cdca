"""The policy model: built, checked, evaluated, trained, saved and sent to the engines.

- `build`: the built-in tiny policy (byte-level Qwen2 warm-started by SFT); `long_build`: its long-tail recipe.
- `evaluate`: accuracy, format rate and length of a built model; `check`: fast checks of a model folder.
- `sampling`: the sampling distribution vLLM draws from, as differentiable torch.
- `grpo`: GRPO math as pure tensor functions; `trainer`: the single-process GRPO trainer.
- `blocks`: a model's transformer blocks and activation checkpointing over them.
- `sharded`: sharded data-parallel training (FSDP2); `checkpoint`: sharded checkpoints (DCP).
- `stream`: a step's gradients accumulated group by group while the rollout's tail generates.
- `weight_sync`: weights to the engines in buckets; `weight_group`: the same by process-group broadcast.
- `lr_schedule`: the learning rate by optimizer step (constant, linear, cosine; warm-up); `export`:
  a checkpoint or the trainer's weights out as a Hugging Face folder.

Imports nothing (torch loads only with the module that needs it).
"""
