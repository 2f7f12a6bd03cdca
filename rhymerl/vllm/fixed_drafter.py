"""A plug-in drafter for vLLM that always proposes the same tokens.

Used to test speculative sampling for losslessness: with drafts the model rarely picks, every
bias in the verifier (accepting too often, or returning the draft when rejecting) shows up at
the drafted positions, while a lossless verifier leaves the output distribution unchanged.

Plug it in with
    LLM(..., speculative_config={"method": "custom_class", "model": FIXED_DRAFTER,
                                 "num_speculative_tokens": k},
        additional_config={FIXED_DRAFT_KEY: [t1, ..., tk]})
vLLM builds the class inside the engine's worker from its `VllmConfig`, which is why the tokens
travel in `additional_config` rather than as constructor arguments.
"""

from __future__ import annotations

from typing import Sequence

FIXED_DRAFTER = "rhymerl.vllm.fixed_drafter.FixedDrafter"
FIXED_DRAFT_KEY = "rhymerl_fixed_draft"


def fixed_draft_rows(tokens: Sequence[int], sampled_token_ids: Sequence[Sequence[int]],
                     num_tokens_no_spec: Sequence[int], max_model_len: int) -> list[list[int]]:
    """One draft per batch row: `tokens`, or nothing for a row that cannot take a draft.

    A row that sampled no token this step (a prefill still in progress) gets no draft, as in
    vLLM's n-gram drafter, and so does a row whose drafts would run past `max_model_len`.
    """
    draft = [int(t) for t in tokens]
    return [draft if sampled and n + len(draft) < max_model_len else []
            for sampled, n in zip(sampled_token_ids, num_tokens_no_spec)]


class FixedDrafter:
    """vLLM `custom_class` drafter proposing `additional_config[FIXED_DRAFT_KEY]` every step."""

    def __init__(self, vllm_config) -> None:
        spec = vllm_config.speculative_config
        extra = vllm_config.additional_config or {}
        tokens = extra.get(FIXED_DRAFT_KEY) if isinstance(extra, dict) else None
        if not tokens:
            raise ValueError(f"FixedDrafter needs the draft tokens: pass additional_config="
                             f"{{'{FIXED_DRAFT_KEY}': [token ids]}} to vllm.LLM")
        if len(tokens) != spec.num_speculative_tokens:
            raise ValueError(f"FixedDrafter: {len(tokens)} draft tokens given but "
                             f"num_speculative_tokens={spec.num_speculative_tokens}; make them equal")
        vocab = vllm_config.model_config.get_vocab_size()
        if any(not 0 <= int(t) < vocab for t in tokens):
            raise ValueError(f"FixedDrafter: draft tokens {list(tokens)} must lie in [0, {vocab})")
        self.tokens = [int(t) for t in tokens]
        self.max_model_len = vllm_config.model_config.max_model_len

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: the drafter has no model."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None) -> list[list[int]]:
        """vLLM's custom-class hook: one list of draft token ids per batch row."""
        return fixed_draft_rows(self.tokens, sampled_token_ids, num_tokens_no_spec, self.max_model_len)
