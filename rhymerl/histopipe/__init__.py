"""HistoPipe: forecast response lengths from history and place rollouts so no worker idles.

- `forecast`: per-prompt length forecasts from lake records, priors for unseen prompts, quality.
- `costmodel`: one worker under continuous batching, calibrated from measured timings.
- `cost_surface`: a decode-step cost surface (GPU; measured or roofline) turned into a `CostModel`.
- `roofline`: the analytic roofline surface per device and model shape, in the cost surface format.
- `schedule`: policies (naive, round_robin, lpt, tier2, oracle) from forecasts to an assignment.
- `simulator`: discrete-event replay of a step on W workers, straggler migration, bubble ratio.
- `spec_pace`: speculative decoding in the simulator, each step's drafts chosen by the goodput rule.
- `migration`: straggler migration in the real run: who moves, and joining prefix and continuation.
- `gantt`: a PNG of a step's per-worker timeline.
- `validate`: the simulator checked against a measured run (fit on some steps, replay the others).
- `train_overlap`: streamed training on a trainer with its own devices, estimated from a simulated step.

Everything here is pure (plain records in, dataclasses out); the lake query lives in `storage/`.
Imports nothing: import the module you need.
"""
