"""Held-out evaluation (`eval.*`), the pure parts: when it is due, how its prompts split over the
engines, its lake rows, its figures, and its console line.

An evaluation samples the eval set on the run's own engines between steps, with the weights of that
moment, before the first epoch (`epoch` -1) and after the last (and after every `eval.every_epochs`-th).
Nothing trains on it and nothing of it enters HistoSpec's history (`workers.actors.RolloutWorker.evaluate`).
Its figures are defined once here (`eval_metrics`), from its rows, so MLflow, the console and a
query over the lake's `evals` table agree.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from rhymerl.config.run import RunConfig
from rhymerl.config.task import EvalConfig
from rhymerl.data.records import Prompt, Sample
from rhymerl.data.rewards import RewardScore
from rhymerl.vllm.engine import SamplingSettings

BEFORE_TRAINING = -1  # the `epoch` of the evaluation before the first epoch


def eval_sampling(cfg: RunConfig) -> SamplingSettings:
    """The evaluation's sampling: eval.n, eval.temperature (0: greedy), eval.max_tokens (0: the
    rollout's). top_p is 1: an evaluation measures the policy's own distribution."""
    return SamplingSettings(n=cfg.eval.n, temperature=cfg.eval.temperature, top_p=1.0,
                            max_tokens=cfg.eval.max_tokens or cfg.rollout.max_tokens)


def eval_due(cfg: EvalConfig, after_epoch: int, epochs: int) -> bool:
    """Whether to evaluate after epoch `after_epoch` (-1: before the first) of `epochs`."""
    if after_epoch == BEFORE_TRAINING:
        return cfg.enabled
    return cfg.due_after(after_epoch, epochs)


def opening_eval(start_epoch: int, start_step: int) -> int | None:
    """The boundary a run (new or resumed) reaches before its first step, if it starts on one: the
    evaluation after epoch `start_epoch - 1` (-1: before training) holds the weights it starts from.
    None mid-epoch: that evaluation's weights are gone (it ran before the crash, or never will)."""
    return start_epoch - 1 if start_step == 0 else None


def split_prompts(prompts: Sequence[Prompt], workers: int) -> list[list[Prompt]]:
    """`workers` contiguous shares of the prompts, sizes differing by at most one (empty ones last)."""
    if workers < 1:
        raise ValueError(f"split_prompts needs at least one worker, got {workers}")
    size, extra = divmod(len(prompts), workers)
    shares, start = [], 0
    for w in range(workers):
        end = start + size + (w < extra)
        shares.append(list(prompts[start:end]))
        start = end
    return shares


def eval_rows(run_id: str, epoch: int, global_step: int, policy_version: int, prompts: Sequence[Prompt],
              samples: Sequence[Sample], scores: Sequence[RewardScore]) -> list[dict]:
    """One `evals` row (storage.schema.EVALS_SCHEMA) per sample, in the given order."""
    if len(samples) != len(scores):
        raise ValueError(f"eval_rows: {len(samples)} samples but {len(scores)} scores; score every sample")
    by_id = {p.prompt_id: p for p in prompts}
    return [{"run_id": run_id, "epoch": epoch, "global_step": global_step, "policy_version": policy_version,
             "prompt_id": s.prompt_id, "prompt_index": by_id[s.prompt_id].index,
             "prompt_text": by_id[s.prompt_id].text, "sample_idx": s.sample_idx, "response_text": s.text,
             "tokens": len(s.token_ids), "finish_reason": s.finish_reason, "reward": sc.total,
             "reward_values": dict(sc.values), "correct": sc.correct, "worker_id": s.worker_id}
            for s, sc in zip(samples, scores)]


def eval_metrics(rows: Sequence[Mapping]) -> dict[str, float]:
    """`eval/reward` (mean weighted reward), `eval/reward/<fn>` (each function's mean value),
    `eval/accuracy` (share correct among the samples some function judged; absent when none was
    judged: no function judges correctness) and `eval/mean_tokens`, over the evaluation's rows."""
    if not rows:
        return {}
    n = len(rows)
    out = {"eval/reward": sum(float(r["reward"]) for r in rows) / n,
           "eval/mean_tokens": sum(int(r["tokens"]) for r in rows) / n}
    for name in dict.fromkeys(k for r in rows for k in (r["reward_values"] or {})):
        values = [float(r["reward_values"][name]) for r in rows if name in (r["reward_values"] or {})]
        out[f"eval/reward/{name}"] = sum(values) / len(values)
    judged = [bool(r["correct"]) for r in rows if r["correct"] is not None]
    if judged:
        out["eval/accuracy"] = sum(judged) / len(judged)
    return out


def eval_line(epoch: int, metrics: Mapping[str, float], prompts: int, samples: int) -> str:
    """The console's line of one evaluation: reward (per function when more than one), accuracy
    when defined, mean tokens."""
    where = "before training" if epoch == BEFORE_TRAINING else f"after epoch {epoch}"
    per_fn = {k.split("/", 2)[2]: v for k, v in metrics.items() if k.startswith("eval/reward/")}
    parts = [f"reward {metrics['eval/reward']:.3f}"
             + (" (" + ", ".join(f"{k} {v:.3f}" for k, v in per_fn.items()) + ")" if len(per_fn) > 1 else "")]
    if "eval/accuracy" in metrics:
        parts.append(f"accuracy {metrics['eval/accuracy']:.3f}")
    parts.append(f"{metrics['eval/mean_tokens']:.1f} tokens")
    return f"eval {where} ({prompts} prompts x {samples // max(prompts, 1)}): " + ", ".join(parts)
