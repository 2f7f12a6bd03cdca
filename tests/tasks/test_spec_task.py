"""HistoSpec in the run (`tasks/spec.py`): the epoch's history from the lake as flat columns, and each
worker's bundle for a step holding exactly the prompts the plan places on it."""

from __future__ import annotations

import logging

import numpy as np

import tasks.spec
from rhymerl.config.pipe import PipeConfig
from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.bundle import HistoryBundle
from rhymerl.data.records import Prompt, Sample
from rhymerl.data.rewards import RewardScore
from rhymerl.run.rollout import rollout_rows
from storage.lake import LakeWriter, rows_to_table
from tasks.spec import history_task, prepare_epoch_task, prepare_step_task


def P(i: int) -> Prompt:
    return Prompt(prompt_id=f"p{i}", index=i, text=f"q{i}", token_ids=(100 + i, 7), answer="1")


def write_epoch(url: str, prompts: list[Prompt], epoch: int) -> None:
    samples = [Sample(p.prompt_id, k, (p.index,) * (10 + 10 * p.index), (-0.1,) * (10 + 10 * p.index), "t", "stop",
                      0, 0.0, 1.0) for p in prompts for k in range(2)]
    rows = rollout_rows("run", epoch, 0, prompts, samples, [RewardScore(1.0, {"gsm8k": 1.0}, True)] * len(samples), 0)
    w = LakeWriter(url)
    w.commit_step("run", epoch, 0, [w.write_rollouts("run", epoch, 0, worker=0, attempt=1, table=rows_to_table(rows))])


def test_each_worker_bundle_holds_the_prompts_its_plan_places(tmp_path, monkeypatch):
    # Rule: history_task keeps the epoch's history as numpy buffers (no per-token objects);
    # prepare_step_task's bundle w holds plan.placement[w]'s prompts with their history, nothing else.
    monkeypatch.setattr(tasks.spec, "get_run_logger", lambda: logging.getLogger("test"))
    url, prompts = str(tmp_path / "lake"), [P(i) for i in range(4)]
    write_epoch(url, prompts, 0)
    slicer = history_task.fn(SpecConfig(), url, "run", 1, prompts)
    assert slicer.columns.tokens.dtype == np.int32 and len(slicer.columns) == 8  # 4 prompts x 2 responses
    inputs = prepare_step_task.fn(PipeConfig(policy="naive"), url, "run", 1, 0, prompts, 2, 2, 64, slicer)
    for placed, blob, info in zip(inputs.plan.placement, inputs.bundles.blobs, inputs.bundles.infos):
        fb = HistoryBundle.from_bytes(blob.tobytes())
        assert [fb.prompt(k).tolist() for k in range(len(fb))] == [list(p.token_ids) for p in placed]
        for k, p in enumerate(placed):
            tokens, lens, _ = fb.history(k)
            assert set(tokens.tolist()) == {p.index} and lens.tolist() == [10 + 10 * p.index] * 2
        assert info.prompts == len(placed) == 2
    assert history_task.fn(SpecConfig(method="ngram"), url, "run", 1, prompts) is None  # no bundles needed
    plain = prepare_step_task.fn(PipeConfig(policy="naive"), url, "run", 1, 0, prompts, 2, 2, 64, None)
    assert plain.bundles is None and sum(len(c) for c in plain.plan.placement) == 4


def test_an_epoch_prepared_ahead_is_what_its_start_would_compute(tmp_path, monkeypatch):
    # Rule: prepare_epoch_task (run during the previous epoch's last training step) gives the same
    # history and first-step plan and bundles as history_task + prepare_step_task at the epoch's start,
    # and hands the first step over as a done future.
    monkeypatch.setattr(tasks.spec, "get_run_logger", lambda: logging.getLogger("test"))
    url, prompts = str(tmp_path / "lake"), [P(i) for i in range(4)]
    write_epoch(url, prompts, 0)
    pipe = PipeConfig(policy="lpt")  # the forecast from epoch 0's lengths decides the placement
    ahead = prepare_epoch_task.fn(SpecConfig(), pipe, url, "run", 1, prompts, prompts[:3], 2, 2, 64)
    slicer = history_task.fn(SpecConfig(), url, "run", 1, prompts)
    now = prepare_step_task.fn(pipe, url, "run", 1, 0, prompts[:3], 2, 2, 64, slicer)
    assert np.array_equal(ahead.slicer.columns.tokens, slicer.columns.tokens) and ahead.query_s > 0
    first = ahead.first_ready().result()
    assert first.plan.placement == now.plan.placement and first.plan.forecast_mean == now.plan.forecast_mean
    assert [b.tobytes() for b in first.bundles.blobs] == [b.tobytes() for b in now.bundles.blobs]
    assert prepare_epoch_task.fn(SpecConfig(method="ngram"), pipe, url, "run", 1, prompts, prompts[:3], 2, 2,
                                 64).slicer is None
