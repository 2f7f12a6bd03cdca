"""Learning-rate schedules: `train.lr_schedule` (constant, linear, cosine) after `train.warmup_steps`.

`lr_at(step, ...)` is the learning rate of optimizer step `step` (0-based): a pure function, so a
resumed run needs only its step count to be back on schedule.

* Warmup: steps ``0 .. warmup_steps - 1`` rise linearly as ``base_lr * (step + 1) / warmup_steps``
  (the first step already moves the weights; the last warmup step reaches `base_lr`).
* After warmup, with ``progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)``
  clamped to [0, 1]: ``constant`` keeps `base_lr`; ``linear`` is ``base_lr * (1 - progress)``;
  ``cosine`` is ``base_lr * (1 + cos(pi * progress)) / 2``. Both decays reach 0 at `total_steps`
  and stay there past it. A warmup as long as the run simply never decays.

`lr_lambda` gives the same schedule as a multiplier of the base rate, and `make_scheduler` a
``torch.optim.lr_scheduler.LambdaLR`` on it: call ``scheduler.step()`` after each
``optimizer.step()`` and step k runs at ``lr_at(k, ...)``; `resume_scheduler` puts one at step k of a
resumed run. `run_optimizer_steps` is a run's step count (the schedule's length). Unknown names, a negative warmup and
a decaying schedule without a positive step count are `ConfigError`s naming the setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from rhymerl.errors import ConfigError

if TYPE_CHECKING:
    from rhymerl.config.run import RunConfig

# name -> multiplier of the base rate at `progress` in [0, 1] through the post-warmup steps
SCHEDULES: dict[str, Callable[[float], float]] = {
    "constant": lambda progress: 1.0,
    "linear": lambda progress: 1.0 - progress,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
}


def check_schedule(schedule: str, warmup_steps: int, total_steps: int | None = None) -> None:
    """ConfigError naming `train.lr_schedule`, `train.warmup_steps` or the step count when unusable."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"train.lr_schedule = {schedule!r} is not a schedule; choose one of: "
                          f"{', '.join(SCHEDULES)}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ConfigError(f"train.warmup_steps = {warmup_steps!r} must be an integer >= 0 (0: no warmup)")
    if total_steps is not None and schedule != "constant" and total_steps < 1:
        raise ConfigError(f"train.lr_schedule = {schedule!r} decays over the run's optimizer steps, but the run "
                          f"has {total_steps}; give it at least one step (epochs, data.num_prompts) or "
                          "use 'constant'")


def _multiplier(step: int, total_steps: int, schedule: str, warmup_steps: int) -> float:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return SCHEDULES[schedule](progress)


def lr_at(step: int, total_steps: int, base_lr: float, schedule: str = "constant", warmup_steps: int = 0) -> float:
    """The learning rate of optimizer step `step` (0-based) of `total_steps` (module docstring)."""
    check_schedule(schedule, warmup_steps, total_steps)
    if isinstance(base_lr, bool) or not isinstance(base_lr, (int, float)) or not math.isfinite(base_lr) or base_lr < 0:
        raise ConfigError(f"train.lr = {base_lr!r} must be a finite number >= 0")
    return float(base_lr) * _multiplier(step, total_steps, schedule, warmup_steps)


@dataclass(frozen=True)
class LrLambda:
    """The schedule as a multiplier of the base rate (a callable object, so LambdaLR can save it)."""

    total_steps: int
    schedule: str = "constant"
    warmup_steps: int = 0

    def __call__(self, step: int) -> float:
        return _multiplier(step, self.total_steps, self.schedule, self.warmup_steps)


def lr_lambda(total_steps: int, schedule: str = "constant", warmup_steps: int = 0) -> LrLambda:
    """The checked multiplier: ``lr_at(k, total, base, ...) == base * lr_lambda(total, ...)(k)``."""
    check_schedule(schedule, warmup_steps, total_steps)
    return LrLambda(total_steps, schedule, warmup_steps)


def make_scheduler(optimizer: Any, total_steps: int, schedule: str = "constant", warmup_steps: int = 0,
                   last_step: int = -1) -> Any:
    """A LambdaLR over `optimizer`'s base rates; `last_step` = the last optimizer step already taken
    (-1 for a fresh run) resumes it. Needs each param group's ``initial_lr`` when resuming (torch's rule)."""
    from torch.optim.lr_scheduler import LambdaLR  # lazy: checking a config needs no torch

    return LambdaLR(optimizer, lr_lambda(total_steps, schedule, warmup_steps), last_epoch=last_step)


def resume_scheduler(optimizer: Any, base_lr: float, total_steps: int, schedule: str, warmup_steps: int,
                     steps_taken: int) -> Any:
    """`make_scheduler` for an optimizer that already took `steps_taken` steps (a loaded optimizer
    state, or a warm start at 0): its next step runs at ``lr_at(steps_taken, ...)``. The base rate
    is `base_lr` (the run's `train.lr`), whatever rate a loaded optimizer state carries."""
    if steps_taken < 0:
        raise ValueError(f"steps_taken must be >= 0, got {steps_taken}")
    for group in optimizer.param_groups:
        group["initial_lr"] = base_lr
    return make_scheduler(optimizer, total_steps, schedule, warmup_steps, last_step=steps_taken - 1)


def run_optimizer_steps(cfg: "RunConfig", prompts: int) -> int:
    """The optimizer steps of a whole run over `prompts` prompts (after loading and skipping):
    epochs x steps per epoch x `train.updates_per_step`."""
    return cfg.epochs * cfg.steps_per_epoch(prompts) * cfg.train.updates_per_step
