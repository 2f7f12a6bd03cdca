"""The goodput controller on drafters that are not RhymeRL's own (vLLM's `suffix` and `ngram`).

HistoSpec's drafter runs the controller inside its step (`rhymerl.histospec.engine.step_drafter`);
vLLM's stock drafters give only tokens, so `install_gate` wraps the worker's model runner's
`propose_draft_token_ids`: whatever the drafter proposed passes through a `GoodputGate`, which
sees the batch's request ids, what each sampled in the step that ran and where each is in its
response, and keeps the draft tokens that raise expected tokens per second. The arms of a
comparison are so judged under the same rule. Trimming only shortens drafts: the sampled
distribution is untouched.
"""

from __future__ import annotations

from typing import Any

from rhymerl.histospec.goodput import GoodputGate
from rhymerl.histospec.stats import SpecStats

GATE_ATTR = "_rhymerl_goodput_gate"
STAT_FIELDS = ("proposed", "timed_steps", "predicted_s", "measured_s")


def install_gate(runner: Any, cost_memory: int) -> bool:
    """Put a `GoodputGate` behind `runner.propose_draft_token_ids` (once); False without speculation."""
    if getattr(runner, GATE_ATTR, None) is not None:
        return True
    spec = getattr(runner, "speculative_config", None)
    if spec is None:
        return False
    gate = GoodputGate(int(spec.num_speculative_tokens), cost_memory)
    propose = runner.propose_draft_token_ids

    def gated(scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
        drafts = propose(scheduler_output, sampled_token_ids, *args, **kwargs)
        if not isinstance(drafts, list) or not isinstance(sampled_token_ids, list):
            return drafts  # a drafter that keeps its drafts on the device: left as it is
        batch, rows = runner.input_batch, len(drafts)
        written = (batch.num_tokens_no_spec[:rows] - batch.num_prompt_tokens[:rows]).tolist()
        return gate.gate(batch.req_ids[:rows], [len(t) for t in sampled_token_ids[:rows]], written, drafts)

    runner.propose_draft_token_ids = gated
    setattr(runner, GATE_ATTR, gate)
    return True


def take_gate_stats(runner: Any) -> dict | None:
    """The gate's counters since the last call (`STAT_FIELDS` of `SpecStats`); None without a gate."""
    gate = getattr(runner, GATE_ATTR, None)
    if gate is None:
        return None
    stats, gate.stats = gate.stats, SpecStats()
    return {name: getattr(stats, name) for name in STAT_FIELDS}
