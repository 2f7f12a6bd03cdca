"""Training problems and their reward.

- `datasets`: load problems (built-in task or a GSM8K-format file) and render them to prompts.
- `builtin`: the built-in verifiable problems (sums of named small numbers, worked line by line).
- `long`: the built-in long-tail problems (a counted addition chain).
- `reward`: the verifiable reward, pure functions from response text to a score.

Imports nothing.
"""
