"""HistoSpec's batch path inside vLLM (`rhymerl.vllm.histospec_proposer`); `step_drafter` runs each step."""
