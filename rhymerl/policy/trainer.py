"""GRPO trainer: a Hugging Face causal LM, AdamW, and the clipped loss from `rhymerl.policy.grpo`.

Pure torch + transformers; it knows nothing about rollouts, Ray or tracking. A batch is a list
of `TrainExample`s (token ids plus one advantage each); the trainer returns plain metrics and
hands its weights out as CPU tensors for the inference engines.

Dropout is kept off (the model stays in eval mode) so that the policy's log-probs are a
deterministic function of the weights: the first update of each step then sees ratio == 1.

Every log-prob here (policy gradient, PPO ratio, KL) is the log-prob of the distribution the
engines sample from: logits / temperature, then the nucleus (top-p) renormalised as vLLM's sampler
does it (`rhymerl.policy.sampling`). The raw softmax would train a different policy than the one sampled
whenever temperature != 1 or top_p < 1.
"""

from __future__ import annotations

import copy
import io
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

from rhymerl.config.run import TrainConfig
from rhymerl.policy import grpo
from rhymerl.policy.blocks import checkpoint_activations
from rhymerl.policy.lr_schedule import check_schedule, make_scheduler, resume_scheduler
from rhymerl.policy.sampling import token_logprobs

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

# Files a tokenizer may need; `save` copies whichever exist so the output loads on its own.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
)


def probe_ids(vocab_size: int, length: int = 32) -> list[int]:
    """Fixed token ids (a seeded draw) on which engines and trainer compare their log-probs after
    a weight sync: a check that covers every weight, unlike sums of the parameters both store alike."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (length,), generator=generator).tolist()


@dataclass(frozen=True)
class TrainExample:
    """One response to train on: its prompt, its tokens, and its (group-normalised) advantage.

    `sampler_logprobs`, when given, are the engine's log-probs of the response tokens (one per
    token): the trainer compares them with its own (`logprob_abs_diff`), a check that engine and
    trainer hold the same weights and sampling settings.
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    advantage: float
    sampler_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class _Padded:
    """A micro-batch laid out for one forward pass, and where its response tokens sit."""

    input_ids: Tensor  # (B, L) prompt + response, right-padded
    attention_mask: Tensor  # (B, L)
    positions: Tensor  # (B, T) index into the (B, L-1) next-token log-probs of response token t
    mask: Tensor  # (B, T) 1.0 on real response tokens
    advantages: Tensor  # (B,)
    sampler: Tensor | None  # (B, T) the engine's log-probs of the response tokens; None if any is missing


def _pad(batch: list[TrainExample], vocab_size: int, device: torch.device) -> _Padded:
    """Right-pad prompt + response; with right padding the default positions 0..L-1 are right."""
    for i, ex in enumerate(batch):
        if not ex.prompt_ids:
            raise ValueError(f"example {i} has an empty prompt; every response needs at least "
                             f"one prompt token to be conditioned on")
        ids = ex.prompt_ids + ex.response_ids
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise ValueError(f"example {i} has token ids outside [0, {vocab_size}); the ids "
                             f"must come from the tokenizer of the model being trained")
    lengths = [len(ex.prompt_ids) + len(ex.response_ids) for ex in batch]
    L = max(lengths)
    T = max(1, max(len(ex.response_ids) for ex in batch))
    input_ids = torch.zeros(len(batch), L, dtype=torch.long)
    attention_mask = torch.zeros(len(batch), L, dtype=torch.long)
    positions = torch.zeros(len(batch), T, dtype=torch.long)
    mask = torch.zeros(len(batch), T)
    for i, ex in enumerate(batch):
        p, r = len(ex.prompt_ids), len(ex.response_ids)
        input_ids[i, : p + r] = torch.tensor(ex.prompt_ids + ex.response_ids)
        attention_mask[i, : p + r] = 1
        # the log-prob of token p+t is read from the logits at position p+t-1
        positions[i, :r] = torch.arange(p - 1, p - 1 + r)
        mask[i, :r] = 1.0
    advantages = torch.tensor([ex.advantage for ex in batch], dtype=torch.float32)
    sampler = None
    if all(len(ex.sampler_logprobs) == len(ex.response_ids) for ex in batch):
        sampler = torch.zeros(len(batch), T)
        for i, ex in enumerate(batch):
            sampler[i, :len(ex.response_ids)] = torch.tensor(ex.sampler_logprobs, dtype=torch.float32)
        sampler = sampler.to(device)
    return _Padded(input_ids.to(device), attention_mask.to(device), positions.to(device),
                   mask.to(device), advantages.to(device), sampler)


def _response_logprobs(model: torch.nn.Module, padded: _Padded, temperature: float = 1.0,
                       top_p: float = 1.0) -> Tensor:
    """Log-prob (float32) of each response token under the model's sampling distribution at
    (`temperature`, `top_p`), (B, T); 0 on padding."""
    # no KV cache: nothing is decoded, and a cache would grow again when checkpointing recomputes
    logits = model(input_ids=padded.input_ids, attention_mask=padded.attention_mask, use_cache=False).logits
    # Only the response positions: the nucleus sorts the vocabulary, so skip the prompt's rows.
    index = padded.positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    logits = logits.gather(1, index)  # (B, T, V): row t predicts response token t
    # (B, T); padding rows point at position 0, so +1 stays in range unless L == 1 (then clamp)
    targets = padded.input_ids.gather(1, (padded.positions + 1).clamp(max=padded.input_ids.shape[1] - 1))
    return token_logprobs(logits, targets, temperature, top_p) * padded.mask


class Trainer:
    """Holds the policy (and, when cfg.kl_coef > 0, a frozen reference) and runs GRPO steps.

    `temperature` and `top_p` are the engines' sampling settings (`rollout.*`): every log-prob
    the trainer computes is of that distribution. `threads`, when given, sets torch's intra-op
    thread count for the whole process.

    The learning rate follows `cfg.lr_schedule` and `cfg.warmup_steps` over `total_steps`, the
    run's optimizer steps (`lr_schedule.run_optimizer_steps`; 0 = unknown: constant schedule
    only). `lr_step`, the optimizer steps taken in the run, is checkpointed; `set_lr_step` resumes it.
    """

    def __init__(self, model_dir: str, cfg: TrainConfig, seed: int = 0,
                 dtype: str = "float32", threads: int | None = None,
                 temperature: float = 1.0, top_p: float = 1.0, total_steps: int = 0) -> None:
        check_schedule(cfg.lr_schedule, cfg.warmup_steps, total_steps)  # before the model loads
        self.total_steps = total_steps
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
        if temperature <= 0 or not 0 < top_p <= 1:
            raise ValueError(f"sampling settings temperature={temperature}, top_p={top_p}: the trainer "
                             "needs temperature > 0 and top_p in (0, 1] (rollout.temperature, rollout.top_p)")
        self.temperature, self.top_p = float(temperature), float(top_p)
        if threads is not None:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.cfg = cfg
        self.model_dir = str(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=DTYPES[dtype])
        if torch.cuda.is_available():  # a GPU node: Ray gave this process its GPU; else CPU
            self.model.to("cuda")
        self.model.eval()
        self.device = next(self.model.parameters()).device
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self._make_optimizer()
        self.ref_model: torch.nn.Module | None = None
        if cfg.kl_coef > 0:
            self.ref_model = copy.deepcopy(self.model).requires_grad_(False).eval()
        if cfg.activation_checkpointing:  # after the copy: the reference never runs backward
            checkpoint_activations(self.model)
        self.aggregation = grpo.get_aggregation(cfg.loss_agg)
        self.policy_version = 0

    def _make_optimizer(self) -> None:
        """AdamW over the model's (current) parameters and the schedule over it, at step 0."""
        cfg = self.cfg
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=cfg.betas,
                                           weight_decay=cfg.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, self.total_steps, cfg.lr_schedule, cfg.warmup_steps)

    @property
    def lr_step(self) -> int:
        """Optimizer steps taken so far in the run: the next one runs at `lr_at(lr_step, ...)`."""
        return int(self.scheduler.last_epoch)

    def set_lr_step(self, step: int) -> None:
        """Put the schedule at `step` optimizer steps taken (a resume; 0 for a warm start)."""
        cfg = self.cfg
        self.scheduler = resume_scheduler(self.optimizer, cfg.lr, self.total_steps, cfg.lr_schedule,
                                          cfg.warmup_steps, step)

    # ------------------------------------------------------------ log-probs

    def _logprobs(self, model: torch.nn.Module, padded: _Padded) -> Tensor:
        return _response_logprobs(model, padded, self.temperature, self.top_p)

    def _micro_batches(self, batch: list[TrainExample]) -> Iterator[_Padded]:
        size = self.cfg.micro_batch_size
        for start in range(0, len(batch), size):
            yield _pad(batch[start: start + size], self.vocab_size, self.device)

    @torch.no_grad()
    def sequence_logprobs(self, batch: list[TrainExample]) -> list[list[float]]:
        """Log-prob of each response token given the prompt and the tokens before it."""
        out: list[list[float]] = []
        for padded in self._micro_batches(batch):
            logp = self._logprobs(self.model, padded).cpu()
            lengths = padded.mask.sum(dim=1).long().tolist()
            out.extend(row[:n].tolist() for row, n in zip(logp, lengths))
        return out

    @torch.no_grad()
    def probe_logprobs(self, ids: list[int]) -> list[float]:
        """Raw log-prob (no temperature) of ids[i + 1] given ids[:i + 1], for i < len(ids) - 1."""
        logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0, :-1]
        return token_logprobs(logits, torch.tensor(ids[1:], device=self.device)).tolist()

    # ------------------------------------------------------------ training

    def train_step(self, batch: list[TrainExample]) -> dict[str, float]:
        """`cfg.updates_per_step` AdamW updates on `batch`; returns metrics.

        The "old" policy of the ratio is the weights at the start of this call. Each update runs
        over the whole batch in micro-batches with gradient accumulation; the loss normaliser is
        counted over the whole batch (see `rhymerl.policy.grpo`), so micro-batch size does not change
        the update. Examples with advantage 0 add no gradient but still count in that
        normaliser, as they do in DAPO's token-level loss.

        Metrics (loss, grad_norm before clipping, clip_frac, ratio_mean, kl, and lr: the learning
        rate each update ran at) are means over the updates; tokens is the number of response tokens in the batch, tokens_per_s that number
        over the wall time of the whole step. When every example carries `sampler_logprobs`,
        `logprob_abs_diff` is the mean |engine - trainer| log-prob over the batch's tokens before
        the update (~0 when engine and trainer agree on weights and sampling settings).
        """
        if not batch:
            raise ValueError("train_step got an empty batch; pass at least one TrainExample")
        return self._step(batch)

    def _step(self, batch: list[TrainExample]) -> dict[str, float]:
        """`train_step` on this process's part of the batch (all of it here; a share of it in
        `rhymerl.policy.sharded`, where `_all_sum` and `_padding` make the step the whole batch's)."""
        start = time.perf_counter()
        # Micro-batches of similar lengths pad least: in arrival order (speculation finishes long and
        # short responses interleaved) padding nearly doubled the tokens computed. The update is a sum
        # over micro-batches with a batch-wide normaliser, so the order changes only float rounding.
        batch = sorted(batch, key=lambda ex: len(ex.prompt_ids) + len(ex.response_ids))
        micro = list(self._micro_batches(batch))
        (denominator,) = self._all_sum([sum(self.aggregation.count(mb.mask) for mb in micro)])
        micro += self._padding(len(micro))
        with torch.no_grad():
            old = [self._logprobs(self.model, mb) for mb in micro]
            ref = ([self._logprobs(self.ref_model, mb) for mb in micro]
                   if self.ref_model is not None else None)
        totals: dict[str, float] = {"loss": 0.0, "grad_norm": 0.0, "clip_frac": 0.0,
                                    "ratio_mean": 0.0, "kl": 0.0, "lr": 0.0}
        for _ in range(self.cfg.updates_per_step):
            update = self._update(micro, old, ref, denominator)
            for key in totals:
                totals[key] += update[key] / self.cfg.updates_per_step
        self.policy_version += 1
        seconds = time.perf_counter() - start
        missing = float(sum(mb.sampler is None for mb in micro))
        diff = sum(float(((o - mb.sampler).abs() * mb.mask).sum()) for o, mb in zip(old, micro)
                   if mb.sampler is not None)
        tokens, missing, diff = self._all_sum([float(sum(len(ex.response_ids) for ex in batch)), missing, diff])
        out = {**totals, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9)}
        if missing == 0:
            out["logprob_abs_diff"] = diff / max(tokens, 1.0)
        return out

    def _all_sum(self, values: list[float]) -> list[float]:
        """Sums over every process that holds a part of the batch: one process here."""
        return values

    def _padding(self, n_micro: int) -> list[_Padded]:
        """Micro-batches that add nothing, run so every process makes as many passes: none here."""
        return []

    def _clip_and_step(self) -> float:
        """Clip the gradients to `max_grad_norm`, step the optimizer; the norm before clipping."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self._optimizer_step()
        return float(grad_norm)

    def _optimizer_step(self) -> None:
        """One AdamW step at the schedule's rate, then the schedule moves on to the next step's."""
        self.optimizer.step()
        self.scheduler.step()

    def _backward(self, mb: _Padded, old: Tensor, ref: Tensor | None, denominator: float) -> list[float]:
        """Add one micro-batch's gradient (policy loss, plus the k3 KL term when `ref` is given, both
        divided by `denominator`); returns its [loss, kl, clip_frac x tokens, ratio_mean x tokens, tokens]."""
        cfg = self.cfg
        logp = self._logprobs(self.model, mb)
        loss, stats = grpo.policy_loss(logp, old, mb.advantages, mb.mask, cfg.clip_low, cfg.clip_high,
                                       agg=cfg.loss_agg, denominator=denominator)
        kl_value = 0.0
        if ref is not None:
            kl = self.aggregation.reduce(grpo.kl_k3(logp, ref, mb.mask), mb.mask, denominator)
            loss = loss + cfg.kl_coef * kl
            kl_value = kl.item()
        loss.backward()
        return [loss.item(), kl_value, stats["clip_frac"] * stats["tokens"], stats["ratio_mean"] * stats["tokens"],
                stats["tokens"]]

    def _update(self, micro: list[_Padded], old: list[Tensor], ref: list[Tensor] | None,
                denominator: float) -> dict[str, float]:
        """One optimizer update accumulated over all micro-batches."""
        self.optimizer.zero_grad(set_to_none=True)
        sums = [0.0] * 5
        for i, mb in enumerate(micro):
            part = self._backward(mb, old[i], ref[i] if ref is not None else None, denominator)
            sums = [a + b for a, b in zip(sums, part)]
        lr = float(self.optimizer.param_groups[0]["lr"])  # this update's; the step moves the schedule on
        grad_norm = self._clip_and_step()
        loss_sum, kl_sum, clip_sum, ratio_sum, token_sum = self._all_sum(sums)
        n = max(token_sum, 1.0)
        return {"loss": loss_sum, "grad_norm": grad_norm, "clip_frac": clip_sum / n,
                "ratio_mean": ratio_sum / n, "kl": kl_sum, "lr": lr}

    # ------------------------------------------------------------ weights out

    @torch.no_grad()
    def state_dict_for_engine(self) -> dict[str, Tensor]:
        """A snapshot of the weights under their HF names: detached, contiguous CPU tensors.

        Names that share storage in the model (tied embeddings: lm_head.weight and
        model.embed_tokens.weight) share one copied tensor here too, so they cannot disagree.
        """
        copies: dict[tuple[int, torch.Size, torch.Size], Tensor] = {}
        out: dict[str, Tensor] = {}
        for name, tensor in self.model.state_dict().items():
            key = (tensor.data_ptr(), tensor.shape, tensor.stride())
            if key not in copies:
                copies[key] = tensor.detach().to("cpu", copy=True).contiguous()
            out[name] = copies[key]
        return out

    @torch.no_grad()
    def engine_tensors(self, device: str | torch.device = "cpu") -> Iterator[tuple[str, Tensor]]:
        """(HF name, detached contiguous copy on `device`) one at a time: what a bucketed weight
        sync sends (`rhymerl.policy.weight_sync`), without a whole-model copy alive at once. The
        process-group sync over NCCL asks for the GPU (no round trip through host memory)."""
        for name, tensor in self.model.state_dict().items():
            yield name, tensor.detach().to(device, copy=True).contiguous()

    def save(self, out_dir: str | Path, state_dict: dict[str, Tensor] | None = None) -> Path:
        """Write a loadable HF directory: safetensors weights, config, and the source tokenizer
        files that exist (none is fine: a model dir without a tokenizer is saved as such).
        `state_dict` (whole tensors) replaces the model's own: a sharded trainer gathers it."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out, state_dict=state_dict)
        for name in TOKENIZER_FILES:
            src = Path(self.model_dir) / name
            if src.is_file():
                shutil.copyfile(src, out / name)
        return out

    def held_bytes(self) -> int:
        """Bytes of policy parameters and optimizer state in this process (its shards when sharded)."""
        tensors = list(self.model.parameters()) + [v for state in self.optimizer.state.values()
                                                   for v in state.values() if torch.is_tensor(v)]
        local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
        return sum(t.numel() * t.element_size() for t in local)

    # ------------------------------------------------------------ checkpoint state

    def state(self) -> dict[str, Any]:
        """Everything needed to resume: weights, optimizer, policy version, `lr_step`, torch RNG."""
        return {
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "policy_version": self.policy_version,
            "lr_step": self.lr_step,
            "torch_rng": torch.get_rng_state(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what `state()` returned (the reference model is not part of it: it is frozen).
        A state without `lr_step` (older) resumes the schedule at policy version x updates_per_step."""
        missing = {"model", "optimizer", "policy_version", "torch_rng"} - set(state)
        if missing:
            raise ValueError(f"trainer state lacks {sorted(missing)}; pass what Trainer.state() returned")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.policy_version = int(state["policy_version"])
        self.set_lr_step(int(state.get("lr_step", self.policy_version * self.cfg.updates_per_step)))
        torch.set_rng_state(state["torch_rng"])

    def state_bytes(self) -> bytes:
        """`state()` serialised with torch.save (what a checkpoint stores)."""
        buffer = io.BytesIO()
        torch.save(self.state(), buffer)
        return buffer.getvalue()

    def load_state_bytes(self, blob: bytes) -> None:
        """Restore from `state_bytes()`; tensors and plain values only (weights_only)."""
        self.load_state(torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True))
