"""Pure helpers of a run's loop.

- `preflight`: pure checks of a run's inputs before any server, Ray or engine starts.
- `rollout`: splitting a step's rollouts, grouping, advantages, metrics.
- `resume`: which step comes next, and which steps train on rows the lake already holds.
- `console`: what a person watches during `rhymerl run`, and the log capture.
- `report`: per-step lines and the end-of-run per-epoch summary table.
- `timing`: named wall-clock laps of a step.
- `heap`: keeping Python's full garbage collections off a run's critical path.

Imports nothing.
"""
