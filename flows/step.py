"""One training step of a run, and the state a run carries from step to step (`RunState`).

Reads like a recipe: plan -> HistoSpec bundles -> rollout -> reward -> lake write -> train ->
weight sync -> measures -> background logging and checkpoint, each a task of `tasks/`.
`flows.run` runs the epochs and the run around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefect import get_run_logger
from prefect.utilities.annotations import quote

from rhymerl.vllm.engine import SamplingSettings
from rhymerl.run.rollout import epoch_order, step_batches, step_stats
from rhymerl.run.timing import Stopwatch
from tasks.report import lake_step_task, log_step_task
from tasks.setup import RunContext, Tracking
from tasks.background import Background
from tasks.plan import gantt_task, step_measures
from tasks.resume import begin_checkpoint, checkpoint_task, lake_rows_task
from tasks.spec import StepInputs, prepare_epoch_task, prepare_step_task, publish_history_task, spec_stats
from tasks.steps import lake_write_task, reward_task, rollout_task, sync_task, train_task
from workers.guard import WorkerGuard
from workers.sync import sync_settings
from workers.stream import Scoring
from workers.train_feed import GroupFeed

# Engine vs trainer mean |log-prob| difference above which a step warns. float32 CPU engines agree
# to ~1e-6; bf16 GPU engines round to ~1e-2; a stale engine after a real update is off by more.
LOGPROB_DIFF_WARN = 0.05


@dataclass
class RunState:
    """Everything about a run that changes while it goes. Only flows/ assigns its fields (this module
    for a step, `flows.run` for the run and its epochs), so every change of run state shows there;
    tasks take plain values and return what they make."""

    workers: list = field(default_factory=list)
    trainer: object = None
    guard: WorkerGuard | None = None  # once the actors are up: restarted workers resync first
    tracking: Tracking | None = None  # the open MLflow run (and the lake's run record)
    started_ray: bool = False
    policy_version: int = 0  # optimizer steps applied to the weights the engines hold
    history: list[dict] = field(default_factory=list)  # every step's record, in order
    reuse: frozenset = frozenset()  # (epoch, step)s trained on their committed lake rows (resume)
    spec_history: object = None  # the epoch's HistoSpec history on the driver (HistorySlicer), if any
    spec_query_s: float = 0.0  # seconds the epoch waited for its history (lake query into columns)
    spec_prepared_s: float | None = None  # seconds the query took when prepared ahead (off the critical path)
    ahead: tuple | None = None  # ((epoch, step), future of its StepInputs): the next step, prepared early
    next_epoch: tuple | None = None  # (epoch, future of its EpochInputs): prepared in the last step before it
    epoch_body: dict = field(default_factory=dict)  # epoch -> perf_counter at its subflow body's start, end
    initial_fingerprint: float = 0.0
    warm_start: dict | None = None  # model.init_from_run: the checkpoint the trainer started from
    background: Background = field(default_factory=Background)  # off the critical path (tasks.background)
    mlflow_tail: Any = None  # the last background run that writes to MLflow: the next waits for it


def _prepare_next_epoch(ctx: RunContext, st: RunState, epoch: int, sampling: SamplingSettings) -> None:
    """Start preparing epoch `epoch + 1` (its history, its first step's plan and bundles): once this
    epoch's last step is in the lake, everything they read is."""
    cfg = ctx.cfg
    order = epoch_order(list(ctx.prompts), epoch + 1, cfg.seed)
    first = step_batches(order, cfg.rollout.prompts_per_step)[0]
    st.next_epoch = (epoch + 1, prepare_epoch_task.submit(
        cfg.spec, cfg.pipe, cfg.lake.url, ctx.run_id, epoch + 1, quote(order), quote(first), len(st.workers),
        sampling.n, sampling.max_tokens))


def run_step(ctx: RunContext, st: RunState, epoch: int, step: int, batch, sampling: SamplingSettings,
             next_batch=None, next_epoch: bool = False) -> dict:
    """One on-policy step: every sample comes from the weights after the previous step.

    A step the lake committed before a crash (after the last checkpoint) trains on its
    committed rows instead of sampling again, so it is neither lost nor duplicated. The plan and
    each worker's HistoSpec bundle of the step after it (`next_batch`, same epoch) are prepared
    while this one runs: both depend only on earlier epochs' rows. The last step of an epoch
    (`next_epoch`) prepares the next epoch's history and first step once its rows are committed.
    """
    cfg, watch = ctx.cfg, Stopwatch()
    with watch("plan_s"):  # ~0 when prepared during the previous step
        inputs = _step_inputs(ctx, st, epoch, step, batch, sampling)
    plan = inputs.plan
    st.ahead = None
    if next_batch is not None:
        st.ahead = ((epoch, step + 1), prepare_step_task.submit(
            cfg.pipe, cfg.lake.url, ctx.run_id, epoch, step + 1, quote(next_batch), len(st.workers), sampling.n,
            sampling.max_tokens, quote(st.spec_history)))
    samples, scores, speculation, migrations, shipped, feed = _sample(ctx, st, epoch, step, batch, sampling,
                                                                      inputs, watch)
    # Prefect walks every element of a task's arguments looking for futures (a large part of a
    # second per call for a step's samples, tens of ms for a plan or a batch of prompts with their
    # token ids); quote() hands them over as they are. Every large argument of a step's tasks is quoted.
    with watch("lake_s"):
        committed = lake_write_task(cfg.lake.url, ctx.run_id, epoch, step, quote(batch), quote(samples), quote(scores),
                                    st.policy_version, sampling.n)
    if not committed.rows_written and (epoch, step) not in st.reuse:
        get_run_logger().warning("step %d of epoch %d was committed to the lake before this rollout's rows; "
                                 "training on the committed rows", step, epoch)
    samples, scores = committed.samples, committed.scores
    if next_epoch:
        _prepare_next_epoch(ctx, st, epoch, sampling)
    with watch("train_s"):
        train = train_task(st.trainer, quote(batch), quote(samples), quote(scores), cfg.train.scale_rewards,
                           cfg.train.adv_eps, feed=quote(feed))
    _warn_logprob_diff(train, epoch, step)
    sync = sync_task(st.trainer, st.workers, guard=st.guard, **sync_settings(cfg))
    st.policy_version += 1
    watch.seconds.update(sync_s=sync["sync_s"], step_s=watch.total())
    with watch("measure_s"):
        pipe = step_measures(plan, samples, len(st.workers))
    record = _record(st, epoch, step, step_stats(samples, scores), dict(watch.seconds), pipe, sync, train)
    record["migrations"] = float(migrations)
    record.update(shipped)  # spec/history_*: what each worker's bundle held and was sent
    if speculation is not None:
        record.update(speculation.as_metrics("spec/"))
    st.history.append(record)
    with watch("log_s"):
        _log_in_background(ctx, st, record, plan, samples, speculation is not None)
    with watch("checkpoint_s"):
        pending = begin_checkpoint(ctx, st.trainer, int(record["global_step"]))  # queued before the next train
        if pending is not None:
            history = [dict(h) for h in st.history]  # this step's view: later steps append and update
            st.background.submit(checkpoint_task, quote(ctx), pending, quote(history), st.policy_version,
                                 st.tracking.mlflow_run_id)
    # Known only once the step's record is logged: kept in the run's history (the returned
    # records; `rhymerl bench e2e` splits wall_s from them), not in MLflow or the lake.
    record.update(log_s=watch.seconds["log_s"], checkpoint_s=watch.seconds["checkpoint_s"], wall_s=watch.total())
    return record


def _log_in_background(ctx: RunContext, st: RunState, record: dict, plan, samples, speculated: bool) -> None:
    """The step's MLflow metrics, Gantt chart and steps-table row, off the critical path. MLflow
    writes run one after another (`st.mlflow_tail`); each gets its own copy of the record, which
    the step goes on updating."""
    cfg, bg = ctx.cfg, st.background
    st.mlflow_tail = bg.submit(log_step_task, st.tracking, dict(record), after=st.mlflow_tail)
    if cfg.pipe.gantt:
        st.mlflow_tail = bg.submit(gantt_task, quote(plan), quote(samples), len(st.workers), st.tracking.tracker,
                                   int(record["global_step"]), after=st.mlflow_tail)
    bg.submit(lake_step_task, cfg.lake.url, ctx.run_id, dict(record), cfg.spec.method if speculated else None)


def _step_inputs(ctx: RunContext, st: RunState, epoch: int, step: int, batch, sampling: SamplingSettings):
    """The step's plan and bundles: prepared during the previous step when it could be, else now."""
    cfg, ahead = ctx.cfg, st.ahead
    if ahead is not None and ahead[0] == (epoch, step):
        try:
            return ahead[1].result()
        except Exception as exc:  # prepared off the critical path; a failure costs only time
            get_run_logger().warning("preparing step %d of epoch %d ahead failed (%s); preparing it now",
                                     step, epoch, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return prepare_step_task(cfg.pipe, cfg.lake.url, ctx.run_id, epoch, step, quote(batch), len(st.workers),
                             sampling.n, sampling.max_tokens, quote(st.spec_history))


def _sample(ctx: RunContext, st: RunState, epoch: int, step: int, batch, sampling: SamplingSettings,
            inputs: StepInputs, watch: Stopwatch):
    """The step's samples, scores, speculation counters, migrations, HistoSpec bundle measures and
    streamed-training feed (None when train.stream is off or nothing was generated): generated
    (scoring starts on finished responses while the rollout's tail still generates), or read back
    from the lake for a step committed before a crash (`rollout_s` is then the lake read).
    Before generating, each worker gets the history of the prompts it serves (`history_s`)."""
    cfg, plan = ctx.cfg, inputs.plan
    if (epoch, step) in st.reuse:
        with watch("rollout_s"):
            samples, scores = lake_rows_task(cfg.lake.url, ctx.run_id, epoch, step, quote(batch), sampling.n,
                                             st.policy_version)
        watch.seconds.update(reward_s=0.0, reward_total_s=0.0)
        return samples, scores, None, 0, {}, None  # the original rollout's counters died with it
    history = None
    if inputs.bundles is not None:
        with watch("history_s"):
            history = publish_history_task(st.workers, quote(st.spec_history), quote(inputs.bundles), st.guard)
    feed = _group_feed(ctx, st, batch, sampling)
    with watch("rollout_s"):
        rollout = rollout_task(st.workers, quote(plan), sampling, quote(batch), cfg.pipe, quote(ctx.rewards),
                               guard=st.guard, history=quote(history), feed=quote(feed))
    speculation = spec_stats(st.workers)
    with watch("reward_s"):  # what scoring still added after the rollout
        scores, watch.seconds["reward_total_s"] = reward_task(quote(ctx.rewards), quote(batch), quote(rollout))
    shipped = {**inputs.bundles.metrics(), **history.sent_metrics()} if history is not None else {}
    return rollout.samples, scores, speculation, rollout.migrations, shipped, feed


def _group_feed(ctx: RunContext, st: RunState, batch, sampling: SamplingSettings) -> GroupFeed | None:
    """With train.stream, what hands each complete group to the trainer during the rollout."""
    train = ctx.cfg.train
    if not train.stream:
        return None
    return GroupFeed(st.trainer, batch, sampling.n, train.scale_rewards, train.adv_eps, Scoring.of(ctx.rewards, batch))


def _record(st: RunState, epoch: int, step: int, stats, timings: dict, pipe: dict, sync: dict, train: dict) -> dict:
    """The step's record: what MLflow, the lake's steps table and the end-of-run table read."""
    record = {"epoch": epoch, "step": step, "global_step": len(st.history),
              "policy_version": st.policy_version, **stats.as_metrics(), **timings, **pipe,
              "rollout_tokens_per_s": stats.tokens / max(timings["rollout_s"], 1e-9),
              "engine_fingerprint": sync["engine_fingerprint"],
              "trainer_fingerprint": sync["trainer_fingerprint"],
              "sync_probe_max_diff": sync["probe_max_diff"], "sync_s_per_gb": sync["sync_s_per_gb"],
              **{f"train_{k}": v for k, v in train.items()}}
    record["worker_restarts"] = float(st.guard.new_restarts()) if st.guard is not None else 0.0
    if (epoch, step) in st.reuse:  # rollout_s is the lake read, not a rollout
        record["reused_lake_rows"] = 1.0
    if step == 0 and st.spec_history is not None:  # the epoch's history query, before its steps
        record["spec/history_query_s"] = st.spec_query_s
        if st.spec_prepared_s is not None:  # run during the previous epoch's last step instead
            record["spec/history_prepared_s"] = st.spec_prepared_s
    return record


def _warn_logprob_diff(train: dict, epoch: int, step: int) -> None:
    if train.get("logprob_abs_diff", 0.0) > LOGPROB_DIFF_WARN:
        get_run_logger().warning(
            "engine and trainer log-probs differ by %.3g on average in step %d of epoch %d (~1e-6 when they hold "
            "the same weights and sampling settings): a stale engine or a sampling setting the trainer does "
            "not apply", train["logprob_abs_diff"], step, epoch)
