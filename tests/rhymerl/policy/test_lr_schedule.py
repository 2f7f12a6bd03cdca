"""Learning-rate schedules: hand-computed values, the LambdaLR factory, errors."""

import math

import pytest
import torch

from rhymerl.errors import ConfigError
from rhymerl.policy.lr_schedule import lr_at, lr_lambda, make_scheduler


@pytest.mark.parametrize("schedule, step, want", [
    # warmup 2 of 10 steps at base 1.0: steps 0, 1 are 0.5, 1.0; then 8 decay steps
    ("constant", 0, 0.5), ("constant", 1, 1.0), ("constant", 9, 1.0), ("constant", 50, 1.0),
    ("linear", 0, 0.5), ("linear", 2, 1.0), ("linear", 6, 0.5), ("linear", 9, 1 / 8), ("linear", 10, 0.0),
    ("cosine", 1, 1.0), ("cosine", 2, 1.0), ("cosine", 6, 0.5), ("cosine", 4, (1 + math.cos(math.pi / 4)) / 2),
    ("cosine", 10, 0.0), ("cosine", 99, 0.0),
])
def test_lr_at_hand_computed(schedule, step, want):
    assert lr_at(step, 10, 1.0, schedule, warmup_steps=2) == pytest.approx(want, abs=1e-12)


def test_no_warmup_starts_at_the_base_rate():
    assert lr_at(0, 4, 3e-4, "linear") == pytest.approx(3e-4)
    assert lr_at(3, 4, 3e-4, "linear") == pytest.approx(3e-4 / 4)


def test_lambda_lr_runs_each_step_at_lr_at():
    params = [torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD(params, lr=0.1)
    sched = make_scheduler(opt, total_steps=6, schedule="cosine", warmup_steps=2)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([lr_at(k, 6, 0.1, "cosine", 2) for k in range(6)], abs=1e-12)
    # resuming after step 3 picks up where it left off
    opt2 = torch.optim.SGD(params, lr=0.1)
    opt2.param_groups[0]["initial_lr"] = 0.1
    make_scheduler(opt2, 6, "cosine", 2, last_step=3)
    assert opt2.param_groups[0]["lr"] == pytest.approx(lr_at(4, 6, 0.1, "cosine", 2))
    assert lr_lambda(6, "linear")(3) == pytest.approx(0.5)


@pytest.mark.parametrize("args, message", [
    (dict(schedule="step"), r"train.lr_schedule = 'step' is not a schedule; choose one of: constant, linear, cosine"),
    (dict(warmup_steps=-1), r"train.warmup_steps = -1 must be an integer >= 0"),
    (dict(warmup_steps=1.5), r"train.warmup_steps = 1.5 must be an integer"),
    (dict(schedule="cosine", total_steps=0), r"decays over the run's optimizer steps, but the run has 0"),
    (dict(base_lr=float("nan")), r"train.lr = nan must be a finite number >= 0"),
])
def test_errors_name_the_setting(args, message):
    kwargs = dict(step=0, total_steps=10, base_lr=1.0, schedule="constant", warmup_steps=0) | args
    with pytest.raises(ConfigError, match=message):
        lr_at(**kwargs)


def test_negative_step_is_a_programming_error():
    with pytest.raises(ValueError, match="step must be >= 0"):
        lr_at(-1, 10, 1.0)
