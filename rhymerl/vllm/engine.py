"""The rollout engine interface and its vLLM implementation.

The rest of RhymeRL talks to an `Engine`: give it tokenized prompts and sampling settings, get
back `Sample` records (token ids, per-token log-probs, finish reason, per-request timings).
`VllmEngine` drives vLLM's own engine loop (no home-made decode loop) and receives new policy
weights in place through a worker extension (`rhymerl.vllm.worker_ext`), so the engine starts once per run.

vLLM is imported lazily: importing this module costs nothing and the interface can be tested
with a fake engine.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol, Sequence

import torch

from rhymerl.histopipe.migration import join_prefix
from rhymerl.histospec.stats import SpecStats
from rhymerl.data.records import Partial, Prompt, Request, Sample
from rhymerl.vllm.spec_guard import EngineSpeculation, SpeculationStatus, start_guarded

WEIGHT_SYNC_EXTENSION = "rhymerl.vllm.worker_ext.WeightSyncExtension"


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample a group of responses per prompt."""

    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 160


@dataclass(frozen=True)
class EngineSettings:
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
    speculation: EngineSpeculation | None = None  # None: no speculative decoding (see rhymerl.vllm.spec_guard)
    max_num_seqs: int | None = None  # requests per engine step (None: vLLM's default)
    log_stats: bool = False  # vLLM's own metrics (its spec-decode counters feed `spec_stats` for n-gram)


class Engine(Protocol):
    """A text-generation engine holding one copy of the policy."""

    def generate(self, prompts: Sequence[Prompt], spec: SamplingSettings, worker_id: int = 0) -> list[Sample]:
        """Sample `spec.n` responses per prompt; returns len(prompts) * n samples, grouped by prompt."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the policy weights in place (HF parameter names); afterwards every token,
        prompt tokens included, is computed by the new weights (no cached KV survives)."""
        ...

    def weights_fingerprint(self) -> float:
        """A number that changes whenever the engine's weights change (sum of all parameters)."""
        ...


def configure_cpu_env(spec: EngineSettings) -> None:
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

    def __init__(self, spec: EngineSettings) -> None:
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
            # Log-probs of the distribution sampled from (after temperature and top-p), not of the
            # raw logits (vLLM's default): they are what the lake stores and the trainer compares.
            logprobs_mode="processed_logprobs",
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

    def generate(self, prompts: Sequence[Prompt], spec: SamplingSettings, worker_id: int = 0) -> list[Sample]:
        """All n samples of every prompt, grouped by prompt in the given order (see `stream`)."""
        requests = [Request(p, k) for p in prompts for k in range(spec.n)]
        done = {(s.prompt_id, s.sample_idx): s for event in self.stream(requests, spec, worker_id)
                for s in event.finished}
        return [done[r.key] for r in requests]

    def generate_unrecorded(self, prompts: Sequence[Prompt], spec: SamplingSettings, worker_id: int = 0) -> list[Sample]:
        """`generate`, leaving none of these responses in the drafter's memory across requests:
        vLLM's suffix method caches every response to draft later requests from, so this call's
        are evicted afterwards (a held-out evaluation must not shape training's drafts). HistoSpec's
        drafter is kept out by its caller instead (`workers.actors.RolloutWorker.evaluate`)."""
        held = self.llm.collective_rpc("rhymerl_suffix_requests")[0] if self.speculation.active else None
        samples = self.generate(prompts, spec, worker_id)
        if held is not None:
            self.llm.collective_rpc("rhymerl_suffix_forget", args=(held,))
        return samples

    def stream(self, requests: Sequence[Request], spec: SamplingSettings, worker_id: int = 0,
               every_s: float = 0.25, take_stops: Callable[[], set[tuple[str, int]]] | None = None
               ) -> Iterator[StreamEvent]:
        """Run the requests through vLLM's engine loop, yielding finished samples as they come.

        Each request is one sample (vLLM n=1) so every response gets its own finish time; vLLM's
        prefix cache shares a prompt's KV blocks among its samples. Events come at most every
        `every_s` seconds (and once at the end). With `take_stops` (called between engine steps,
        returns keys (prompt_id, sample_idx) to stop), outputs stream token by token, events
        carry every running request's token count, and stopped requests come back as `Partial`s.
        A request with a `prefix` continues it: prompt + prefix is its prompt, `max_tokens` is
        reduced by the prefix, and the finished sample is the two parts joined.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        kind = RequestOutputKind.DELTA if take_stops is not None else RequestOutputKind.FINAL_ONLY
        t_start = time.time()
        live: dict[str, _Live] = {}  # by our request id and vLLM's internal id
        by_key: dict[tuple[str, int], str] = {}
        for req in requests:
            prefix = req.prefix.token_ids if req.prefix is not None else ()
            params = SamplingParams(n=1, temperature=spec.temperature, top_p=spec.top_p,
                                    max_tokens=spec.max_tokens - len(prefix), logprobs=0, output_kind=kind)
            self._next_id += 1
            rid = f"r{self._next_id}"
            ids = TokensPrompt(prompt_token_ids=list(req.prompt.token_ids) + list(prefix))
            internal = engine.add_request(rid, ids, params)
            live[rid] = live[internal] = _Live(req)
            by_key[req.key] = rid
        finished: list[Sample] = []
        partials: list[Partial] = []
        last = time.monotonic()
        while engine.has_unfinished_requests():
            for out in engine.step():
                state = live.get(out.request_id)
                if state is None or state.done:
                    continue
                state.extend(out.outputs[0])
                if out.finished:
                    state.done = True
                    finished.append(state.sample(out.outputs[0], worker_id, t_start))
            for key in take_stops() if take_stops is not None else ():
                state = live.get(by_key.get(key, ""))
                if state is not None and not state.done:
                    engine.abort_request([by_key[key]])
                    state.done = True
                    partials.append(state.partial(worker_id, t_start))
            news = finished or partials or take_stops is not None
            if news and time.monotonic() - last >= every_s:
                running = {key: len(live[rid].token_ids) for key, rid in by_key.items()
                           if not live[rid].done} if take_stops is not None else {}
                yield StreamEvent(tuple(finished), tuple(partials), running)
                finished, partials, last = [], [], time.monotonic()
        yield StreamEvent(tuple(finished), tuple(partials), {})

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.stage_weights(named_tensors)
        self.commit_weights()

    def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Hand one bucket of new weights to the engine's workers; nothing changes until
        `commit_weights` (a bucketed sync stages every bucket, then commits once)."""
        from safetensors.torch import save as save_safetensors

        # Tied weights share storage; safetensors refuses shared tensors, so each gets a copy.
        payload = {name: t.detach().to("cpu").clone().contiguous() for name, t in named_tensors}
        self.llm.collective_rpc("rhymerl_stage_weights", args=(save_safetensors(payload),))

    def commit_weights(self) -> None:
        """Load the staged weights in place; afterwards the engine computes with them only."""
        self.llm.collective_rpc("rhymerl_commit_weights")
        self._forget_old_weights()

    def receive_weights(self, host: str, port: int, world_size: int, backend: str, first_rank: int) -> int:
        """Every worker of this engine joins the weight group at host:port (ranks `first_rank`,
        `first_rank` + 1, ... by tensor-parallel rank) and loads what rank 0 broadcasts, in place
        as it arrives (`rhymerl.policy.weight_group`); returns how many tensors a worker received.
        Blocks until the sender's end marker: the sender must run concurrently."""
        counts = self.llm.collective_rpc("rhymerl_receive_weights",
                                         args=(host, port, world_size, backend, first_rank))
        self._forget_old_weights()
        return int(counts[0])

    def _forget_old_weights(self) -> None:
        # The prefix cache holds prompt KV computed by the old weights, and prompts return every
        # epoch: reusing it would sample the next step partly from the previous policy (off-policy).
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update (requests "
                               "still running?); load weights only between generate calls")

    def weights_fingerprint(self) -> float:
        return float(self.llm.collective_rpc("rhymerl_weights_fingerprint")[0])

    def probe_logprobs(self, ids: Sequence[int]) -> list[float]:
        """Raw log-prob of ids[i + 1] given ids[:i + 1] (vLLM's prompt log-probs): a function of
        every weight, compared with `Trainer.probe_logprobs` after each weight sync."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids))], params, use_tqdm=False)[0]
        return [float(step[t].logprob) for step, t in zip(out.prompt_logprobs[1:], ids[1:])]

    def spec_stats(self) -> SpecStats | None:
        """Speculation counters since the last call; None when speculation is off.

        HistoSpec counts for itself in the engine worker (exact per-position histograms). Other
        drafters (vLLM's n-gram) are read from vLLM's spec-decode counters, which needs
        `EngineSettings.log_stats`; their per-position figures assume full-length drafts.
        """
        if not self.speculation.active:
            return None
        got = self.llm.collective_rpc("rhymerl_spec_stats")[0]  # HistoSpec's drafter
        if got is None:
            got = self.llm.collective_rpc("rhymerl_goodput_stats")[0]  # a stock drafter's controller
        if got is not None:
            return SpecStats(**got)
        if not self.spec.log_stats:
            return None
        now = _vllm_spec_counters(self.llm.get_metrics())
        before, self._counters = self._counters, now
        return stats_from_counters({k: _minus(v, before.get(k)) for k, v in now.items()})


@dataclass(frozen=True)
class StreamEvent:
    """What one worker reports during `VllmEngine.stream`."""

    finished: tuple[Sample, ...]  # responses finished since the last event
    partials: tuple[Partial, ...]  # requests stopped (for migration) since the last event
    running: dict[tuple[str, int], int]  # (prompt_id, sample_idx) -> tokens so far; empty unless tracked


class _Live:
    """A request in flight: the tokens, log-probs and text vLLM has reported so far."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.text: list[str] = []
        self.done = False

    def extend(self, comp) -> None:
        """Append one output (all tokens with FINAL_ONLY, the new ones with DELTA)."""
        ids = [int(t) for t in comp.token_ids]
        self.token_ids.extend(ids)
        self.logprobs.extend(float(step[tok].logprob) for step, tok in zip(comp.logprobs or [], ids))
        self.text.append(comp.text)

    def sample(self, comp, worker_id: int, t_start: float) -> Sample:
        req = self.request
        s = Sample(prompt_id=req.prompt.prompt_id, sample_idx=req.sample_idx, token_ids=tuple(self.token_ids),
                   logprobs=tuple(self.logprobs), text="".join(self.text),
                   finish_reason=str(comp.finish_reason or "length"), worker_id=worker_id,
                   t_start=t_start, t_end=time.time())
        return s if req.prefix is None else join_prefix(req.prefix, s)

    def partial(self, worker_id: int, t_start: float) -> Partial:
        """The generated prefix of a stopped request (joined with an earlier prefix if any)."""
        req, now = self.request, time.time()
        first = req.prefix
        return Partial(prompt_id=req.prompt.prompt_id, sample_idx=req.sample_idx,
                       token_ids=(first.token_ids if first else ()) + tuple(self.token_ids),
                       logprobs=(first.logprobs if first else ()) + tuple(self.logprobs),
                       text=(first.text if first else "") + "".join(self.text), worker_id=worker_id,
                       t_start=first.t_start if first else t_start, t_stop=now)


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
