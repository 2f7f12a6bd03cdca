"""The sampling distribution (`rhymerl.policy.sampling`): temperature and nucleus as vLLM's sampler
applies them, and why the trainer's log-probs must be of that distribution."""

from __future__ import annotations

import pytest
import torch

from rhymerl.policy.sampling import nucleus_mask, sampling_logits, sampling_probs, token_logprobs


def test_temperature_and_nucleus_by_hand():
    # Rule: logits / T, then drop (ascending) every token whose cumulative mass is <= 1 - top_p.
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = sampling_probs(logits, temperature=1.0, top_p=0.8)  # 0.05 + 0.15 = 0.2 <= 0.2: both go
    assert probs.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])
    sharp = torch.tensor([0.5, 0.3, 0.15, 0.05]) ** (1 / 0.5)  # T = 0.5 squares the probabilities
    assert sampling_probs(logits, temperature=0.5).tolist() == pytest.approx((sharp / sharp.sum()).tolist())
    # the most likely token always stays, however small top_p is
    assert sampling_probs(logits, 1.0, top_p=1e-6).tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])


def test_nucleus_takes_per_row_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]))
    drop = nucleus_mask(logits, torch.tensor([1.0, 0.5]))
    assert drop.tolist() == [[False, False, False], [False, True, True]]


def test_token_logprobs_match_the_distribution_and_keep_the_sampled_token():
    torch.manual_seed(0)
    logits = torch.randn(5, 7, 50)
    tokens = torch.randint(0, 50, (5, 7))
    want = sampling_probs(logits, 0.7, 0.9)
    got = token_logprobs(logits, tokens, 0.7, 0.9)
    inside = want.gather(-1, tokens[..., None])[..., 0] > 0
    assert torch.allclose(got[inside].double(), want.gather(-1, tokens[..., None])[..., 0][inside].log(), atol=1e-5)
    # a token outside the nucleus (the engine sampled it at the edge in its own rounding) stays
    # finite: the row's nucleus is widened by that one token instead of giving -inf and NaN grads
    assert torch.isfinite(got).all() and (~inside).any()


def test_temperature_zero_has_no_logprobs():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sampling_logits(torch.zeros(3), 0.0)


@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (0.7, 0.9), (1.3, 0.8)])
def test_score_function_gradient_vanishes_only_under_the_sampling_distribution(temperature, top_p):
    # Two tokens y1, y2 over a 4-token vocabulary; the reward depends on y1 only, so the expected
    # policy gradient on the second position's logits is exactly 0 (E_p[grad log p] = 0), computed
    # here by exact enumeration. With log-probs of the sampled distribution it is 0; with the raw
    # softmax (what the trainer used to take) it is not, at any T != 1 or top_p < 1.
    torch.manual_seed(1)
    first, second = torch.randn(4), torch.randn(4, 4, requires_grad=True)  # second[y1] = logits for y2
    p1 = sampling_probs(first, temperature, top_p)
    reward = torch.tensor([1.0, 0.0, 0.5, 0.0])
    advantage = reward - (p1 * reward).sum()

    def expected_grad(logp_fn) -> torch.Tensor:
        second.grad = None
        total = torch.zeros((), dtype=torch.float64)
        for y1 in range(4):
            p2 = sampling_probs(second[y1].detach(), temperature, top_p)
            for y2 in range(4):
                if p1[y1] > 0 and p2[y2] > 0:
                    total = total + p1[y1] * p2[y2] * advantage[y1] * logp_fn(second[y1], y2)
        total.backward()
        return second.grad.clone()

    right = expected_grad(lambda lg, y: token_logprobs(lg, torch.tensor(y), temperature, top_p).double())
    wrong = expected_grad(lambda lg, y: torch.log_softmax(lg, -1)[y].double())
    assert right.abs().max() < 1e-6
    assert wrong.abs().max() > 1e-3


def test_nucleus_rows_in_chunks_give_the_same_logprobs_and_gradients(monkeypatch):
    # Rule: processing rows a few at a time (memory) changes neither log-probs nor gradients.
    import rhymerl.policy.sampling as sampling

    torch.manual_seed(2)
    logits = torch.randn(3, 5, 40, requires_grad=True)
    tokens = torch.randint(0, 40, (3, 5))
    whole = token_logprobs(logits, tokens, 0.7, 0.9)
    (g_whole,) = torch.autograd.grad(whole.sum(), logits)
    monkeypatch.setattr(sampling, "NUCLEUS_ROWS", 4)
    chunked = sampling.token_logprobs(logits, tokens, 0.7, 0.9)
    (g_chunked,) = torch.autograd.grad(chunked.sum(), logits)
    assert torch.equal(whole, chunked) and torch.allclose(g_whole, g_chunked)
