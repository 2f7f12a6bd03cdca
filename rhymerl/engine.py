"""The rollout engine interface and its vLLM implementation.

The rest of RhymeRL talks to an `Engine`: give it tokenized prompts and sampling settings, get
back `Sample` records (token ids, per-token log-probs, finish reason, per-request timings).
`VllmEngine` drives vLLM's own engine loop (no home-made decode loop) and receives new policy
weights in place through a worker extension (`rhymerl.vllm_ext`), so the engine starts once per run.

vLLM is imported lazily: importing this module costs nothing and the interface can be tested
with a fake engine.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import torch

from rhymerl.histospec.drafter import SpecStats
from rhymerl.records import Prompt, Sample
from rhymerl.spec_guard import SpeculationSpec, SpeculationStatus, start_guarded

WEIGHT_SYNC_EXTENSION = "rhymerl.vllm_ext.WeightSyncExtension"


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample a group of responses per prompt."""

    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 160


@dataclass(frozen=True)
class EngineSpec:
    """What an engine loads and how (resource settings; the same fields work on CPU and GPU)."""

    model_dir: str
    dtype: str = "float32"
    max_model_len: int = 512
    seed: int = 0
    enforce_eager: bool = True
    kv_cache_gib: float = 0.5  # CPU only: VLLM_CPU_KVCACHE_SPACE
    gpu_memory_utilization: float = 0.85  # GPU only
    tensor_parallel_size: int = 1  # GPU only: GPUs the engine shards the model over
    cpu_core: int | None = None  # CPU only: pin the engine's threads to this core
    cache_dir: str = ".cache"
    speculation: SpeculationSpec | None = None  # None: no speculative decoding (see rhymerl.spec_guard)
    max_num_seqs: int | None = None  # requests per engine step (None: vLLM's default)
    log_stats: bool = False  # vLLM's own metrics (its spec-decode counters feed `spec_stats` for n-gram)


class Engine(Protocol):
    """A text-generation engine holding one copy of the policy."""

    def generate(self, prompts: Sequence[Prompt], spec: SamplingSpec, worker_id: int = 0) -> list[Sample]:
        """Sample `spec.n` responses per prompt; returns len(prompts) * n samples, grouped by prompt."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the policy weights in place (HF parameter names); afterwards every token,
        prompt tokens included, is computed by the new weights (no cached KV survives)."""
        ...

    def weights_fingerprint(self) -> float:
        """A number that changes whenever the engine's weights change (sum of all parameters)."""
        ...


def configure_cpu_env(spec: EngineSpec) -> None:
    """Set vLLM's CPU environment before the engine starts (it reads these at start-up).

    Caches go inside the project, not $HOME; the KV cache is sized explicitly because vLLM's
    default can exceed what a small machine has; pinning lets two engines share two cores.
    """
    cache = Path(spec.cache_dir).absolute()
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(spec.kv_cache_gib)))
    if spec.cpu_core is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(spec.cpu_core)


class VllmEngine:
    """`Engine` backed by `vllm.LLM`; one instance per rollout worker process."""

    def __init__(self, spec: EngineSpec) -> None:
        if not torch.cuda.is_available():
            configure_cpu_env(spec)
        from vllm import LLM  # lazy: heavy import, and absent in pure-core test environments

        kwargs = dict(
            model=spec.model_dir,
            dtype=spec.dtype,
            max_model_len=spec.max_model_len,
            enforce_eager=spec.enforce_eager,
            seed=spec.seed,
            worker_extension_cls=WEIGHT_SYNC_EXTENSION,
            disable_log_stats=not spec.log_stats,
        )
        if spec.max_num_seqs:
            kwargs["max_num_seqs"] = spec.max_num_seqs
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = spec.gpu_memory_utilization
            kwargs["tensor_parallel_size"] = spec.tensor_parallel_size
            if spec.tensor_parallel_size > 1:
                # Inside a Ray actor vLLM would pick its Ray executor and ask Ray for GPUs the
                # actor already holds; its shards run as local processes on the actor's GPUs.
                kwargs["distributed_executor_backend"] = "mp"
        self.spec = spec
        if spec.speculation is None:
            self.llm = LLM(**kwargs)
            self.speculation = SpeculationStatus(False, "none", False, "speculation off")
        else:  # started only if its verifier passes the lossless self-check, else without speculation
            build = lambda **extra: LLM(**kwargs, **extra)  # noqa: E731 - called again on refusal
            self.llm, self.speculation = start_guarded(build, spec.speculation)
        self._next_id = 0
        self._counters: dict = {}

    def generate(self, prompts: Sequence[Prompt], spec: SamplingSpec, worker_id: int = 0) -> list[Sample]:
        """Run all prompts through vLLM's engine loop, stamping each response's finish time.

        Each of a prompt's n samples is its own request (n=1) so every response gets its own
        finish time; vLLM's prefix cache shares the prompt's KV blocks among them.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        params = SamplingParams(
            n=1, temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_tokens,
            logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY,
        )
        pending: dict[str, tuple[Prompt, int]] = {}  # by our request id and vLLM's internal id
        order: list[str] = []
        t_start = time.time()
        for p in prompts:
            for k in range(spec.n):
                self._next_id += 1
                rid = f"r{self._next_id}"
                internal = engine.add_request(rid, TokensPrompt(prompt_token_ids=list(p.token_ids)), params)
                pending[rid] = pending[internal] = (p, k)
                order.append(rid)
        done: dict[str, Sample] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished and out.request_id in pending:
                    prompt, k = pending[out.request_id]
                    done[(prompt.prompt_id, k)] = _sample_of(out, prompt, k, worker_id, t_start)
        return [done[(pending[rid][0].prompt_id, pending[rid][1])] for rid in order]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save as save_safetensors

        # Tied weights share storage; safetensors refuses shared tensors, so each gets a copy.
        payload = {name: t.detach().to("cpu").clone().contiguous() for name, t in named_tensors}
        self.llm.collective_rpc("rhymerl_load_weights", args=(save_safetensors(payload),))
        # The prefix cache holds prompt KV computed by the old weights, and prompts return every
        # epoch: reusing it would sample the next step partly from the previous policy (off-policy).
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update (requests "
                               "still running?); load weights only between generate calls")

    def weights_fingerprint(self) -> float:
        return float(self.llm.collective_rpc("rhymerl_weights_fingerprint")[0])

    def spec_stats(self) -> SpecStats | None:
        """Speculation counters since the last call; None when speculation is off.

        HistoSpec counts for itself in the engine worker (exact per-position histograms). Other
        drafters (vLLM's n-gram) are read from vLLM's spec-decode counters, which needs
        `EngineSpec.log_stats`; their per-position figures assume full-length drafts.
        """
        if not self.speculation.active:
            return None
        got = self.llm.collective_rpc("rhymerl_spec_stats")[0]
        if got is not None:
            return SpecStats(**got)
        if not self.spec.log_stats:
            return None
        now = _vllm_spec_counters(self.llm.get_metrics())
        before, self._counters = self._counters, now
        return stats_from_counters({k: _minus(v, before.get(k)) for k, v in now.items()})


def _sample_of(out, prompt: Prompt, sample_idx: int, worker_id: int, t_start: float) -> Sample:
    """Convert one finished single-completion vLLM RequestOutput into a Sample record."""
    comp = out.outputs[0]
    ids = tuple(int(t) for t in comp.token_ids)
    lps = tuple(float(step[tok].logprob) for step, tok in zip(comp.logprobs or [], ids))
    return Sample(
        prompt_id=prompt.prompt_id, sample_idx=sample_idx, token_ids=ids, logprobs=lps,
        text=comp.text, finish_reason=str(comp.finish_reason or "length"),
        worker_id=worker_id, t_start=t_start, t_end=time.time(),
    )


_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "drafted",
             "vllm:spec_decode_num_accepted_tokens": "accepted", "vllm:generation_tokens": "tokens",
             "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_at"}


def _vllm_spec_counters(metrics) -> dict:
    """Sum vLLM's counters (over label sets) that `stats_from_counters` needs."""
    out: dict = {}
    for m in metrics:
        name = _COUNTERS.get(m.name)
        if name == "accepted_at":
            prev = out.get(name, [])
            vals = list(m.values)
            out[name] = [a + b for a, b in zip(vals, prev + [0] * (len(vals) - len(prev)))]
        elif name:
            out[name] = out.get(name, 0) + int(m.value)
    return out


def _minus(now, before):
    if before is None:
        return now
    if isinstance(now, list):
        return [a - b for a, b in zip(now, before + [0] * (len(now) - len(before)))]
    return now - before


def stats_from_counters(c: dict) -> SpecStats:
    """`SpecStats` from vLLM's counter deltas, taking every draft to be full length.

    Every verification step emits its accepted tokens plus one, so steps = tokens - accepted.
    """
    drafts, accepted_at = int(c.get("drafts", 0)), list(c.get("accepted_at", []))
    k = len(accepted_at)
    accept_hist = [0] * (k + 1)
    if drafts:
        accept_hist[0] = drafts - (accepted_at[0] if k else 0)
        for a in range(1, k + 1):
            accept_hist[a] = accepted_at[a - 1] - (accepted_at[a] if a < k else 0)
    tokens, accepted = int(c.get("tokens", 0)), int(c.get("accepted", 0))
    return SpecStats(steps=tokens - accepted, tokens=tokens, drafts=drafts,
                     drafted=int(c.get("drafted", 0)), accepted=accepted,
                     draft_len_hist=[0] * k + [drafts] if drafts else [],
                     accept_len_hist=accept_hist if drafts else [])
