"""The built-in tiny policy: a byte-level Qwen2 causal LM warm-started by SFT on the built-in task.

No weights can be downloaded, so RhymeRL makes its own starting policy: a byte-level tokenizer
(one token per ASCII character, loaded alike by `transformers.AutoTokenizer` and vLLM), a tiny
Qwen2 model, and a short supervised run on worked solutions of `rhymerl.data.builtin`. Training stops early on
purpose: the model nearly always answers in the right format but slips on the arithmetic, more
often the more lines it writes, which leaves RL room to improve it (build time and accuracy:
docs/benchmarks.md).

`ensure_builtin_model()` builds once into a cache folder named by the recipe's fingerprint, so a
changed recipe makes a new folder and an unchanged one is reused. `validate_model_dir()` checks any
Hugging Face causal-LM folder, built-in or user-supplied.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from rhymerl.data.builtin import ProblemSettings, builtin_problems, make_problem, parse_terms
from rhymerl.policy.check import model_folder_errors
from rhymerl.policy.evaluate import evaluate
from rhymerl.data.records import Problem
# The tokenizer lives in a module of its own (no torch) so the run's input checks can load it fast.
from rhymerl.policy.tokenizer import BUILD_INFO, EOS, PAD, UNK, build_tokenizer

_FORMAT_VERSION = 2  # bump when the build code changes in a way the recipe fields do not show


# ---------------------------------------------------------------- recipe


@dataclass(frozen=True)
class BuildSettings:
    """Everything that decides the built model; its fingerprint names the cache folder."""

    # model (Qwen2)
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 512
    # SFT
    steps: int = 1000  # at most; training usually stops earlier at stop_loss
    stop_loss: float = 0.09  # stop once the smoothed SFT loss is this low (0 = run every step)
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    seed: int = 1234
    # torch CPU threads while building. Two are faster than one on an idle machine, but far slower
    # when other busy processes share the cores.
    threads: int = 2
    # task
    min_terms: int = 2
    max_terms: int = 9
    max_operand: int = 9
    # evaluation after training (recorded, not used for anything else)
    eval_problems: int = 200  # 0 skips the evaluation (tiny test builds)
    eval_max_tokens: int = 128  # the longest solution is ~110 tokens with EOS

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"BuildSettings: hidden_size={self.hidden_size} must divide by num_heads="
                             f"{self.num_heads}, which must divide by num_kv_heads={self.num_kv_heads}")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"BuildSettings: steps={self.steps} and batch_size={self.batch_size} must be >= 1")

    @property
    def problems(self) -> ProblemSettings:
        return ProblemSettings(self.min_terms, self.max_terms, self.max_operand)

    # The task-specific parts of the recipe, overridden by `rhymerl.policy.long_build.LongBuildSettings`.
    # Methods, not fields, so the fingerprint (and the cached default model) stays as it was.
    cache_prefix = "builtin"  # the cache folder is <cache_prefix>-<fingerprint[:8]>
    sft_chunks = 1  # each SFT batch is split into this many micro-batches of similar length

    def draw_problem(self, rng: random.Random, index: int) -> Problem:
        """One fresh SFT problem drawn from `rng`."""
        return make_problem(index, [rng.randint(0, self.max_operand)
                                    for _ in range(rng.randint(self.min_terms, self.max_terms))])

    def eval_groups(self) -> list[list[Problem]]:
        """The evaluation's fresh problems, in groups sampled together (one group: all of them)."""
        return [builtin_problems(self.eval_problems, seed=self.seed + 1_000_003, spec=self.problems)]

    def bucket(self, problem: Problem) -> tuple[str, int | str]:
        """(name, key) of the evaluation bucket `problem` is reported in."""
        return "terms", len(parse_terms(problem.question))

    def second_stage(self, model, tokenizer, progress: bool) -> list[float]:
        """SFT after `train_sft` (the long recipe's stage on long chains); the loss per step. None here."""
        return []

    def fingerprint(self) -> str:
        """Stable sha256 hex of the recipe (same on every process and machine)."""
        blob = json.dumps({"format": _FORMAT_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def _model_config(spec: BuildSettings, tokenizer):
    from transformers import Qwen2Config

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=pad, dtype="float32",
        architectures=["Qwen2ForCausalLM"])


# ---------------------------------------------------------------- SFT


def sft_batch(problems, tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) input ids, target ids and a mask that is 1 on solution + EOS targets."""
    seqs, starts = [], []
    for p in problems:
        prompt = tokenizer.encode(p.question + "\n", add_special_tokens=False)
        answer = tokenizer.encode(p.solution, add_special_tokens=False) + [tokenizer.eos_token_id]
        seqs.append(prompt + answer)
        starts.append(len(prompt))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width - 1))
    for i, (s, start) in enumerate(zip(seqs, starts)):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, start - 1:len(s) - 1] = 1.0  # position t predicts token t+1
    return ids[:, :-1], ids[:, 1:], mask


def _lr_at(step: int, spec: BuildSettings) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    frac = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def sft_problems(spec: BuildSettings) -> Iterator[list[Problem]]:
    """Endless SFT batches of fresh problems, term counts mixed within each batch.

    Batches of one term count each (less padding) learn markedly slower per step, so the mixed
    batches' padding is worth paying for.
    """
    rng = random.Random(spec.seed)
    while True:
        yield [spec.draw_problem(rng, i) for i in range(spec.batch_size)]


def sft_backward(model, tokenizer, problems: list[Problem], chunks: int, per_sequence: bool = False) -> float:
    """Accumulate the gradient of the batch's mean token loss; returns that loss. With `per_sequence`,
    the mean over problems of each one's mean token loss instead (a long solution weighs what a
    short one does).

    With chunks > 1 the batch is sorted by length and cut into `chunks` micro-batches, so a few
    long solutions do not pad every short one to their length; the loss is still the whole batch's.
    """
    if chunks > 1:
        problems = sorted(problems, key=lambda p: len(p.question) + len(p.solution))
    size = -(-len(problems) // chunks)
    parts = [sft_batch(problems[i:i + size], tokenizer) for i in range(0, len(problems), size)]
    total = sum(mask.sum() for _, _, mask in parts)
    loss_sum = 0.0
    for inputs, targets, mask in parts:
        logits = model(input_ids=inputs).logits  # (B, T, V)
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        if per_sequence:
            loss = ((nll * mask).sum(1) / mask.sum(1)).sum() / len(problems)
        else:
            loss = (nll * mask).sum() / total
        loss.backward()
        loss_sum += loss.item()
    return loss_sum


def train_sft(model, tokenizer, spec: BuildSettings, progress: bool = True) -> list[float]:
    """Supervised warm start on fresh built-in problems each step; returns the loss per step.

    Stops before `spec.steps` once the smoothed loss falls to `spec.stop_loss`. The step at which
    the model gets good varies widely with the seed, while sampled accuracy at a given smoothed loss
    is the same across seeds, so stopping on the loss lands it partly trained either way.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98),
                            weight_decay=spec.weight_decay)
    losses: list[float] = []
    smooth = float("inf")
    model.train()
    t0 = time.perf_counter()
    for step, problems in zip(range(spec.steps), sft_problems(spec)):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, spec)
        opt.zero_grad(set_to_none=True)
        losses.append(sft_backward(model, tokenizer, problems, spec.sft_chunks))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smooth = losses[-1] if step == 0 else 0.9 * smooth + 0.1 * losses[-1]
        done = step == spec.steps - 1 or (step >= spec.warmup_steps and smooth <= spec.stop_loss)
        if progress and (step % 25 == 0 or done):
            print(f"[rhymerl build] step {step + 1}/{spec.steps} loss {smooth:.4f} "
                  f"({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
        if done:
            break
    model.eval()
    return losses


# ---------------------------------------------------------------- build, cache, validate


def _train_and_evaluate(spec: BuildSettings, progress: bool):
    """Initialise, train and evaluate the model; returns (model, tokenizer, build-info dict).

    Runs with `spec.threads` torch threads and a forked RNG, so the caller's thread count and
    random state are left as they were.
    """
    from transformers import Qwen2ForCausalLM

    old_threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        with torch.random.fork_rng(devices=[]):
            t0 = time.perf_counter()
            torch.manual_seed(spec.seed)
            tokenizer = build_tokenizer()
            model = Qwen2ForCausalLM(_model_config(spec, tokenizer)).float()
            losses = train_sft(model, tokenizer, spec, progress)
            stage2 = spec.second_stage(model, tokenizer, progress)
            t_train = time.perf_counter() - t0
            metrics = evaluate(model, tokenizer, spec) if spec.eval_problems > 0 else {}
            t_eval = time.perf_counter() - t0 - t_train
    finally:
        torch.set_num_threads(old_threads)
    if progress and metrics:
        print(f"[rhymerl build] sampled accuracy {metrics['accuracy']:.3f}, format "
              f"{metrics['format_rate']:.3f} (train {t_train:.0f}s, eval {t_eval:.0f}s)",
              file=sys.stderr, flush=True)
    info = {"fingerprint": spec.fingerprint(), "spec": dataclasses.asdict(spec),
            "format_version": _FORMAT_VERSION, "steps_run": len(losses),
            "final_loss": sum(losses[-10:]) / len(losses[-10:]), "eval": metrics,
            "second_stage_steps": len(stage2),
            "second_stage_final_loss": sum(stage2[-10:]) / len(stage2[-10:]) if stage2 else None,
            "train_seconds": round(t_train, 1), "eval_seconds": round(t_eval, 1),
            "torch_version": torch.__version__}
    return model, tokenizer, info


def build_model(out_dir: Path, spec: BuildSettings = BuildSettings(), progress: bool = True) -> Path:
    """Train the built-in model and write it to `out_dir` in Hugging Face format; returns out_dir.

    Writes into a temporary sibling folder and renames it into place at the end, so `out_dir`
    either does not exist or is complete. Raises FileExistsError if `out_dir` already exists
    (including when another process finished first).
    """
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; remove it or use ensure_builtin_model()")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    model, tokenizer, info = _train_and_evaluate(spec, progress)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        # Token ids only: sampling settings come from each caller (RolloutConfig for vLLM).
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        # transformers 5 does not write this file; older loaders and some tools still read it.
        (tmp / "special_tokens_map.json").write_text(json.dumps(
            {"eos_token": EOS, "pad_token": PAD, "unk_token": UNK}, indent=2) + "\n")
        (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
        os.rename(tmp, out_dir)  # atomic; fails if another process already renamed into place
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if out_dir.exists():
            raise FileExistsError(f"{out_dir} was created by another process during the build") from exc
        raise
    return out_dir


def ensure_builtin_model(cache_dir: Path = Path(".cache/rhymerl"), spec: BuildSettings = BuildSettings(),
                         progress: bool = True) -> Path:
    """Path of the built-in model for `spec`, building it first if the cache lacks it.

    The folder is `cache_dir/builtin-<fingerprint[:8]>`. A file lock makes processes on one machine
    build it once (the rest wait); the atomic rename in `build_model` covers anything the lock
    cannot, such as a shared network folder: the first rename wins and the others discard theirs.
    """
    cache_dir = Path(cache_dir)
    out_dir = cache_dir / f"{spec.cache_prefix}-{spec.fingerprint()[:8]}"
    if (out_dir / BUILD_INFO).is_file():
        return out_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out_dir.exists():
            if progress:
                print(f"[rhymerl build] building the built-in model into {out_dir} "
                      "(a few minutes on CPU, once)", file=sys.stderr, flush=True)
            try:
                build_model(out_dir, spec, progress)
            except FileExistsError:
                pass  # another process won the rename; its folder is complete
    if not (out_dir / BUILD_INFO).is_file():
        raise FileNotFoundError(f"{out_dir} exists but has no {BUILD_INFO}; it is not a finished "
                                "build. Delete the folder and run again.")
    return out_dir


def validate_model_dir(path: str | Path) -> None:
    """Check that `path` is a local Hugging Face causal-LM folder the trainer and vLLM can load.

    Raises FileNotFoundError when the folder, its config.json, weights or tokenizer are missing,
    and ValueError when config.json is unreadable or does not describe a causal LM (the first
    problem `rhymerl.policy.check.model_folder_errors` finds).
    """
    errors = model_folder_errors(path)
    if errors:
        raise errors[0]
