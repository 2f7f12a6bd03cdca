"""HistoSpec's batch path inside vLLM (`rhymerl.vllm.histospec_proposer`): `step_drafter` (one step's
work), `requests` (request and prompt tables, step counts), `step_pass` (compiled bookkeeping, cost
trim), `batch` (one kernel call for all rows), `kernel` and its `cpu_tricks`.
"""
