"""Training data: the records that carry it, problems, prompts, and their rewards.

- `records`: small typed records that cross task and process boundaries (problems, prompts, samples).
- `datasets`: load problems (built-in task or a GSM8K-format file) and render them to prompts.
- `builtin`: the built-in verifiable problems (sums of named small numbers, worked line by line).
- `long`: the built-in long-tail problems (a counted addition chain).
- `reward`: the GSM8K rule, pure functions from response text to a score.
Not yet wired into a run (their settings are not in `RunConfig` yet):
- `rewards`, `reward_builtins`: reward functions as plug-ins (`FILE.py:NAME`, `MODULE:NAME`, built-ins
  `gsm8k` and `math`) and their weighted sum.
- `sources`: dataset rows from local files, lists, globs, `save_to_disk` folders and S3.
- `chat`: prompts rendered from text or chat messages through a tokenizer's chat template.

Imports nothing.
"""
