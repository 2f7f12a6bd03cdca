"""HistoSpec's batch path inside a vLLM engine (used by `rhymerl.vllm.histospec_proposer`):
- `step_drafter`: `BatchDrafter`, one engine step's work on plain arrays.
- `requests`: the request table (which request a row is), the prompt table, the step's counts.
- `step_pass`: the step's compiled bookkeeping passes and the cost-aware trim of its drafts.
- `batch`: every row's own draft in one kernel call, the slots it reads, the history builds.
- `kernel`: the compiled drafting kernel (every row's match and draft in one call).
- `cpu_tricks`: the memory-latency tricks the kernel keeps (prefetch, sampled keys, lockstep search).
"""
