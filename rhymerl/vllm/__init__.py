"""The vLLM adapter: the only package that imports vLLM (tests/test_layering.py enforces it).

`engine` (`VllmEngine`: generate, stream, load weights), `speculation` (the run's `SpecConfig` as the
engine's `EngineSpeculation`), `histospec_proposer` (HistoSpec as vLLM's `custom_class` drafter),
`worker_ext` (the worker extension: weights in place, verifier install, self-check), `draft_gate`
(the goodput controller behind vLLM's own drafters), `draft_delivery` and `idle` (vLLM plugins: a
step's drafts return with its sampled tokens; an idle worker sleeps), `spec_verify`
(RhymeRL's exact rejection-sampling kernels), `spec_guard` (start an engine only with a lossless
verifier), `fixed_drafter` (fixed drafts, for the losslessness test), `step_trace` (per-step timing of
the engine, for benchmarks; off unless asked for). vLLM itself is imported lazily, inside functions, so
importing this package does not load it.
"""
