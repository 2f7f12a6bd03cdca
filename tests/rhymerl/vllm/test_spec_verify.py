"""The exact verifier's kernels, the reference distribution, the self-check's statistics and the
start-up policy, all without vLLM (tiny hand-computed cases plus seeded Monte Carlo)."""

from __future__ import annotations

import math

import pytest
import torch

from rhymerl.vllm import spec_guard
from rhymerl.vllm.fixed_drafter import fixed_draft_rows
from rhymerl.vllm.spec_guard import (BATCHES, DEFAULT_ALPHA, DRAFTS, GuardReport, EngineSpeculation, assess,
                                     batch_settings, chi_square, start_guarded, synthetic_logits)
from rhymerl.vllm.spec_verify import (PLACEHOLDER, expand_kernel, processed_probs, rejection_greedy_sample_kernel,
                                 rejection_random_sample_kernel, sample_recovered_tokens_kernel)

CU = torch.tensor([2, 5, 6], dtype=torch.int32)  # 3 requests with 2, 3 and 1 drafts


# ---------------------------------------------------------------- kernels, by hand


def test_expand_copies_float_and_int32_values_per_token():
    # Rule: each request's value is copied to each of its draft tokens, in the buffer's own dtype
    # (vLLM's CPU stand-in truncated floats and wrote into a temporary int64 copy instead).
    out = torch.full((6,), -9.0)
    expand_kernel(out, torch.tensor([0.7, 0.0, 1.5]), CU, 0, 1)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.5])  # 0 (greedy) -> 1
    top_k = torch.zeros(6, dtype=torch.int32)
    expand_kernel(top_k, torch.tensor([4, 12, 7], dtype=torch.int32), CU, 0, 0)
    assert top_k.tolist() == [4, 4, 12, 12, 12, 7] and top_k.dtype == torch.int32


def test_expand_leaves_slots_past_the_last_request_alone():
    # Rule: like the Triton kernel, only tokens covered by cu_num_tokens are written.
    out = torch.full((4,), -1.0)
    expand_kernel(out, torch.tensor([2.5]), torch.tensor([3], dtype=torch.int32), 0, 1)
    assert out.tolist() == [2.5, 2.5, 2.5, -1.0]


def test_greedy_accepts_matching_drafts_then_emits_argmax_or_bonus():
    # Rule: greedy accepts a draft iff it is the argmax; the first mismatch emits the argmax and
    # stops; all accepted appends the bonus. Non-greedy rows are left untouched.
    out = torch.full((3, 4), 77, dtype=torch.int32)
    drafts = torch.tensor([3, 5, 1, 2, 9, 4], dtype=torch.int32)
    argmax = torch.tensor([3, 7, 1, 2, 9, 0])
    bonus = torch.tensor([[11], [22], [33]])
    greedy = torch.tensor([True, True, False])
    rejection_greedy_sample_kernel(out, CU, drafts, argmax, bonus, greedy, 3)
    assert out.tolist() == [[3, 7, PLACEHOLDER, PLACEHOLDER], [1, 2, 9, 22], [77, 77, 77, 77]]


def test_random_accepts_with_probability_p_and_emits_recovered_at_first_rejection():
    # Rule: accept draft x iff u < p(x); the first rejection emits the recovered token; a
    # request whose drafts all pass gets the bonus; greedy rows are left untouched.
    probs = torch.tensor([[0.3, 0.7], [0.6, 0.4], [0.5, 0.5], [0.9, 0.1], [0.2, 0.8], [1.0, 0.0]])
    drafts = torch.tensor([0, 0, 1, 0, 1, 1], dtype=torch.int32)  # p(x) = .3 .6 .5 .9 .8 0
    uniform = torch.tensor([0.29, 0.61, 0.1, 0.5, 0.7, 0.0], dtype=torch.float64)
    recovered = torch.tensor([1, 1, 0, 1, 0, 0], dtype=torch.int32)
    bonus = torch.tensor([[5], [6], [7]])
    out = torch.full((3, 4), 77, dtype=torch.int32)
    rejection_random_sample_kernel(out, CU, drafts, None, probs, bonus, recovered, uniform,
                                   torch.tensor([False, False, False]), 3)
    # request 0: .29<.3 accept, .61>.6 reject -> recovered 1; request 1: all three accepted -> bonus;
    # request 2: p=0 is never accepted, even with u=0 -> recovered 0.
    none = PLACEHOLDER
    assert out.tolist() == [[0, 1, none, none], [1, 0, 1, 6], [0, none, none, none]]


def test_random_with_draft_probs_accepts_with_ratio():
    # Rule: with a draft distribution q, accept iff u < p(x) / q(x).
    probs = torch.tensor([[0.3, 0.7]])
    q = torch.tensor([[0.6, 0.4]])
    out = torch.full((1, 2), 77, dtype=torch.int32)
    args = (torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32), q, probs,
            torch.tensor([[9]]), torch.tensor([1], dtype=torch.int32))
    u = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    rejection_random_sample_kernel(out, *args, u(0.49), torch.tensor([False]), 1)
    assert out.tolist() == [[0, 9]]  # .49 < .3/.6 = .5
    rejection_random_sample_kernel(out, *args, u(0.51), torch.tensor([False]), 1)
    assert out.tolist() == [[1, PLACEHOLDER]]


def test_recovered_token_is_never_the_draft():
    # Rule: the residual zeroes the draft's token; the exponential race picks argmax r * inv_q.
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])
    inv_q = torch.tensor([[100.0, 1.0, 2.0]])  # one request, two drafts sharing its noise
    out = torch.zeros(2, dtype=torch.int32)
    sample_recovered_tokens_kernel(out, torch.tensor([2], dtype=torch.int32),
                                   torch.tensor([0, 2], dtype=torch.int32), None, probs, inv_q)
    assert out.tolist() == [2, 0]  # scores [0, .3, .4] and [50, .3, 0]


# ---------------------------------------------------------------- the reference distribution


def test_processed_probs_temperature_top_k_top_p_greedy_by_hand():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()[None, :]
    one = lambda v, dtype=torch.float64: torch.tensor([v], dtype=dtype)  # noqa: E731
    # Rule: T=0.5 squares the probabilities before renormalising.
    squared = [.25, .09, .0225, .0025]
    assert processed_probs(logits, one(0.5))[0].tolist() == pytest.approx([v / .365 for v in squared])
    # Rule: top-k 3 drops the smallest token.
    top3 = processed_probs(logits, one(1.0), one(3, torch.int32))[0].tolist()
    assert top3 == pytest.approx([.5 / .95, .3 / .95, .15 / .95, 0])
    # Rule: top-p 0.8 drops tokens whose ascending cumulative mass is <= 0.2 (.05 and .15).
    assert processed_probs(logits, one(1.0), None, one(0.8))[0].tolist() == pytest.approx([.625, .375, 0, 0])
    # Rule: temperature 0 is greedy: a one-hot on the argmax.
    assert processed_probs(logits, one(0.0))[0].tolist() == [1.0, 0.0, 0.0, 0.0]


# ---------------------------------------------------------------- exactness, by Monte Carlo


def _speculate(settings, rows: int, seed: int, biased: bool = False) -> torch.Tensor:
    """The self-check's synthetic batch through the pure kernels, composed as vLLM composes them.

    `biased=True` reproduces the CPU fault's symptom: a rejected draft comes back as itself.
    """
    gen = torch.Generator().manual_seed(seed)
    temperature, top_k, top_p = batch_settings(settings, rows)
    batch, k = temperature.shape[0], len(DRAFTS)
    slots = synthetic_logits()
    probs = torch.stack([processed_probs(slots, temperature[i].double().expand(3), top_k[i].expand(3),
                                         top_p[i].double().expand(3)) for i in range(0, batch, rows)])
    per_row = probs.repeat_interleave(rows, dim=0).float()  # (B, 3, V)
    target = per_row[:, :k].reshape(batch * k, -1).contiguous()
    drafts = torch.tensor(DRAFTS, dtype=torch.int32).repeat(batch)
    cu = torch.arange(1, batch + 1, dtype=torch.int32) * k
    bonus = torch.multinomial(per_row[:, k], 1, generator=gen)
    greedy = temperature == 0
    uniform = torch.rand(batch * k, dtype=torch.float64, generator=gen)
    inv_q = torch.empty(batch, target.shape[1]).exponential_(generator=gen).reciprocal()
    recovered = torch.empty(batch * k, dtype=torch.int32)
    sample_recovered_tokens_kernel(recovered, cu, drafts, None, target, inv_q)
    if biased:
        recovered = drafts.clone()
    out = torch.full((batch, k + 1), PLACEHOLDER, dtype=torch.int32)
    rejection_greedy_sample_kernel(out, cu, drafts, target.argmax(dim=1), bonus, greedy, k)
    rejection_random_sample_kernel(out, cu, drafts, None, target, bonus, recovered, uniform, greedy, k)
    return out


@pytest.mark.parametrize("settings", BATCHES, ids=["T1+T0.7topp0.9+greedy", "T1.3topk4+T1"])
def test_verifier_output_follows_the_processed_distribution(settings):
    # Rule (lossless): every slot, given the drafts before it were accepted, is distributed as the
    # processed target distribution at temperature < 1, top-p, top-k; greedy rows match exactly.
    checks = assess(_speculate(settings, rows=20000, seed=1), settings, rows=20000)
    assert all(c.p_value > 1e-4 for c in checks), [c for c in checks if c.p_value <= 1e-4]
    assert min(c.samples for c in checks if c.name.endswith("slot 2")) > 1000  # the bonus slot is reached


def test_self_check_statistics_refuse_the_cpu_fault_symptom():
    # Rule: a verifier that returns a rejected draft as itself fails the guard's check by a mile.
    settings = BATCHES[0]
    checks = assess(_speculate(settings, rows=spec_guard.DEFAULT_ROWS, seed=2, biased=True),
                    settings, spec_guard.DEFAULT_ROWS)
    assert min(c.p_value for c in checks) < DEFAULT_ALPHA


def test_chi_square_by_hand():
    # Rule: chi2 = sum (o - e)^2 / e; P(chi2_1 > 10) = erfc(sqrt(5)).
    chi2, dof, p = chi_square(torch.tensor([30, 10]), torch.tensor([0.5, 0.5]))
    assert (chi2, dof) == (10.0, 1) and p == pytest.approx(math.erfc(math.sqrt(5)))
    # Rule: a count where the probability is 0 is impossible.
    assert chi_square(torch.tensor([5, 1]), torch.tensor([1.0, 0.0]))[2] == 0.0


# ---------------------------------------------------------------- start-up policy, with a fake engine


class _FakeLLM:
    """Stands in for vllm.LLM: answers the two RPCs with canned results and records calls."""

    def __init__(self, kwargs: dict, check: GuardReport | None, install_error: str = "") -> None:
        self.kwargs, self.check, self.install_error = kwargs, check, install_error
        self.calls: list[str] = []
        self.shut = False
        core = type("Core", (), {"shutdown": lambda _: self._shutdown()})()
        self.llm_engine = type("Engine", (), {"engine_core": core})()

    def _shutdown(self) -> None:
        self.shut = True

    def collective_rpc(self, method: str, args=()):
        self.calls.append(method)
        if method == "rhymerl_install_exact_verifier":
            if self.install_error:
                raise RuntimeError(self.install_error)
            return [4]
        return [self.check.to_dict()]


def _start(spec: EngineSpeculation, check: GuardReport | None, install_error: str = ""):
    built: list[_FakeLLM] = []

    def build(**kwargs):
        built.append(_FakeLLM(kwargs, check, install_error))
        return built[-1]

    llm, status = start_guarded(build, spec)
    return llm, status, built


SPEC = EngineSpeculation("custom_class", 3, model="rhymerl.vllm.fixed_drafter.FixedDrafter",
                         additional_config=(("rhymerl_fixed_draft", (10, 20, 30)),))
PASS = GuardReport(passed=True, vllm_version="9.9.9")
FAIL = GuardReport(passed=False, vllm_version="9.9.9", error="boom")


def test_guard_keeps_speculation_when_the_check_passes():
    # Rule: a passing self-check keeps the speculative engine, verified by RhymeRL's kernels.
    llm, status, built = _start(SPEC, PASS)
    assert len(built) == 1 and llm is built[0] and status.active and status.verifier == "rhymerl-exact"
    assert built[0].calls == ["rhymerl_install_exact_verifier", "rhymerl_spec_self_check"]
    assert built[0].kwargs["speculative_config"]["model"] == SPEC.model
    assert built[0].kwargs["additional_config"] == {"rhymerl_fixed_draft": (10, 20, 30)}


def test_guard_refuses_a_biased_verifier_and_rebuilds_without_speculation():
    # Rule: a failing check shuts the speculative engine down and starts a plain one; the
    # message names the vLLM version.
    llm, status, built = _start(SPEC, FAIL)
    assert len(built) == 2 and built[0].shut and llm is built[1] and built[1].kwargs == {}
    assert not status.active and status.verifier == "none"
    assert "refused" in status.message and "vLLM 9.9.9" in status.message


def test_guard_refuses_when_the_exact_verifier_cannot_be_installed():
    # Rule: an install failure (e.g. vLLM changed a kernel's arguments) is a refusal too.
    llm, status, built = _start(SPEC, PASS, install_error="kernel args changed")
    assert len(built) == 2 and not status.active and "kernel args changed" in status.message


def test_guard_can_be_skipped_explicitly():
    # Rule: self_check=False runs speculation unchecked and says so.
    spec = EngineSpeculation("ngram", 4, verifier="vllm", self_check=False)
    llm, status, built = _start(spec, FAIL)
    assert status.active and not status.checked and status.verifier.startswith("vllm-")
    assert built[0].calls == [] and "skipped" in status.message


def test_speculation_spec_validation_and_conversion():
    with pytest.raises(ValueError, match="verifier"):
        EngineSpeculation("ngram", 4, verifier="fast")
    with pytest.raises(ValueError, match="custom_class"):
        EngineSpeculation("custom_class", 4)
    spec = EngineSpeculation("ngram", 4, options=(("prompt_lookup_max", 3),))
    assert spec.speculative_config() == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


def test_fixed_drafter_rows():
    # Rule: every row that sampled a token gets the fixed draft, unless it would pass max_model_len.
    rows = fixed_draft_rows([7, 8], sampled_token_ids=[[1], [], [2]], num_tokens_no_spec=[5, 5, 62],
                            max_model_len=64)
    assert rows == [[7, 8], [], []]
