"""HistoSpec's batch path inside a vLLM engine (`rhymerl.vllm.histospec_proposer` drives it):
`step_drafter` (`BatchDrafter`: one engine step), `requests` (which request a row is, its state),
`step_pass` (the step's compiled bookkeeping and draft trim), `batch` (every row's own draft in one
call, the slots it reads, the history builds), `kernel` (the compiled drafting kernel), `cpu_tricks`
(the memory-latency tricks the kernel keeps)."""
