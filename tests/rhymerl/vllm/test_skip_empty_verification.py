"""Steps without drafts skip vLLM's rejection sampler (`rhymerl.vllm.spec_verify.skip_empty_verification`)
and are sampled as a plain engine samples them; steps with drafts still go through it.

Uses vLLM's own `Sampler` and `RejectionSampler` on CPU with synthetic logits (no engine)."""

from __future__ import annotations

import pytest
import torch

from helpers.marks import needs_vllm
from rhymerl.vllm.spec_guard import VOCAB, synthetic_logits
from rhymerl.vllm.spec_verify import processed_probs, skip_empty_verification

pytestmark = needs_vllm

BATCH = 64


def _sampling(batch: int, temperature: float, top_p: float | None):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    zeros = torch.zeros(batch)
    return SamplingMetadata(
        temperature=torch.full((batch,), temperature), all_greedy=False, all_random=True,
        top_p=None if top_p is None else torch.full((batch,), top_p), top_k=None,
        generators={}, max_num_logprobs=0, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=zeros, presence_penalties=zeros, repetition_penalties=zeros + 1,
        output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=LogitsProcessors(), spec_token_ids=[[] for _ in range(batch)],
    )


def _rows(n: int) -> torch.Tensor:
    """n logits rows over the check's small vocabulary (its bonus slot's logits)."""
    return synthetic_logits()[2:].float().repeat(n, 1)


def _metadata(drafts: list[list[int]]):
    """vLLM's `SpecDecodeMetadata` for these per-request drafts (logits rows: drafts, then bonus)."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    return SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))


def _samplers():
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    from rhymerl.vllm.worker_ext import install_exact_verifier

    install_exact_verifier()  # the kernels a speculative RhymeRL engine runs with
    return RejectionSampler(Sampler(logprobs_mode="processed_logprobs"))


def _counting(sampler) -> list[int]:
    calls: list[int] = []
    inner = sampler.forward

    def forward(*args):
        calls.append(1)
        return inner(*args)

    sampler.forward = forward
    return calls


@pytest.mark.parametrize("temperature,top_p", [(1.0, None), (0.7, 0.9)])
def test_a_step_without_drafts_is_sampled_as_a_plain_engine_samples_it(temperature, top_p):
    # Rule: with no draft in the step, the output is the plain sampler's own draw for the same random
    # state (a non-speculative engine's call: same logits, settings, log-prob mode), one token per
    # request, and each token's log-prob is its log-probability under the processed distribution
    # (temperature and top-p applied): what the lake stores and the trainer compares against.
    shortcut = _samplers()
    skip_empty_verification(shortcut)
    logits = _rows(BATCH) + torch.randn(BATCH, VOCAB)
    sampling = _sampling(BATCH, temperature, top_p)
    torch.manual_seed(7)
    got = shortcut(_metadata([[] for _ in range(BATCH)]), None, logits.clone(), sampling)
    torch.manual_seed(7)
    plain = shortcut.sampler(logits=logits.clone(), sampling_metadata=sampling)
    tokens = got.sampled_token_ids
    assert tokens.shape == (BATCH, 1) and torch.equal(tokens, plain.sampled_token_ids)
    assert len(set(tokens.reshape(-1).tolist())) > 1  # a real draw, not a constant
    probs = processed_probs(logits, sampling.temperature, None, sampling.top_p)
    want = probs.gather(1, tokens.long()).log().reshape(-1)
    assert torch.equal(got.logprobs_tensors.logprob_token_ids[:, 0], tokens.reshape(-1).long())
    assert torch.allclose(got.logprobs_tensors.logprobs[:, 0].double(), want, atol=1e-4)


def test_the_shortcut_skips_the_rejection_sampler_only_when_no_request_drafts():
    # Rule: a step where any request carries a draft is verified by the rejection sampler.
    sampler = _samplers()
    calls = _counting(sampler)
    skip_empty_verification(sampler)
    skip_empty_verification(sampler)  # a second install changes nothing
    sampling = _sampling(4, 1.0, None)
    empty = _metadata([[], [], [], []])
    sampler(empty, None, _rows(4), sampling)
    assert calls == []
    drafted = _metadata([[], [3, 4], [], []])  # one request drafts two tokens: 4 + 2 logits rows
    out = sampler(drafted, None, _rows(6), sampling)
    assert calls == [1]
    assert out.sampled_token_ids.shape == (4, 3)
