"""Prefect tasks of the held-out evaluation (`eval.*`; the pure parts are `rhymerl.run.evaluation`).

`prepare_eval_task` loads the eval set once per run (the training data's keys, template and chat
settings, from `eval.dataset`) with the run's reward functions. `evaluate_task` runs one evaluation
on the run's own engines between steps: generated with `RolloutWorker.evaluate` (no trace in
HistoSpec's history or any drafter state; never in the lake's rollouts), scored in Ray tasks,
written to the lake's `evals` table exactly once per (run, epoch boundary): an evaluation already
in the lake (a resumed run passing the same boundary) is not run again. `log_eval_task` logs its
`eval/*` figures to MLflow at the run's global step of that moment.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rhymerl.config.run import RunConfig
from rhymerl.data.records import Prompt
from rhymerl.data.rewards import RewardSet
from rhymerl.run.evaluation import eval_line, eval_metrics, eval_rows, eval_sampling
from rhymerl.vllm.engine import SamplingSettings
from storage.lake import LakeWriter
from tasks.setup import RunContext, Tracking, load_prompts
from workers.evaluation import run_eval


@dataclass(frozen=True)
class Evaluation:
    """A run's held-out set, fixed for its life."""

    prompts: tuple[Prompt, ...]
    rewards: RewardSet
    sampling: SamplingSettings
    skipped: int  # eval prompts left out as too long for the engine


@task(name="prepare-eval", cache_policy=NO_CACHE)
def prepare_eval_task(cfg: RunConfig, model_dir: str, rewards: RewardSet) -> Evaluation | None:
    """The eval prompts (rendered and tokenized as the training prompts are) with the run's reward
    functions; None when evaluation is off (`eval.dataset` is "")."""
    if not cfg.eval.enabled:
        return None
    prompts, skipped = load_prompts(cfg, model_dir, source=cfg.eval.dataset, num_prompts=cfg.eval.num_prompts,
                                    key="eval.dataset", max_tokens=eval_sampling(cfg).max_tokens)
    if skipped:
        get_run_logger().warning("skipped %d eval prompts longer than the engine allows", skipped)
    return Evaluation(tuple(prompts), rewards, eval_sampling(cfg), skipped)


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(ctx: RunContext, evaluation: Evaluation, workers: list, epoch: int, global_step: int,
                  policy_version: int, guard=None) -> dict | None:
    """Evaluate after epoch `epoch` (-1: before the first) with the engines' current weights; its
    `eval/*` figures, or None when the lake already holds this evaluation (then nothing runs)."""
    log, lake = get_run_logger(), LakeWriter(ctx.cfg.lake.url)
    if lake.has_eval(ctx.run_id, epoch):
        log.info("the evaluation after epoch %d is already in the lake; not run again", epoch)
        return None
    prompts = list(evaluation.prompts)
    result = run_eval(workers, prompts, evaluation.sampling, evaluation.rewards, guard)
    rows = eval_rows(ctx.run_id, epoch, global_step, policy_version, prompts, result.samples, result.scores)
    if not lake.write_evals(ctx.run_id, epoch, rows):  # another attempt wrote it meanwhile: its rows stand
        log.warning("the evaluation after epoch %d was written by another attempt; keeping that one", epoch)
        return None
    metrics = eval_metrics(rows)
    line = eval_line(epoch, metrics, len(prompts), len(rows))
    log.info(line, extra={"rhymerl_eval": {"epoch": epoch, "line": line}})  # rhymerl.run.console prints it
    return metrics


@task(name="log-eval", cache_policy=NO_CACHE)
def log_eval_task(tracking: Tracking, metrics: dict, global_step: int) -> None:
    """The evaluation's `eval/*` figures in MLflow at `global_step`."""
    tracking.tracker.log_metrics(metrics, step=global_step)
