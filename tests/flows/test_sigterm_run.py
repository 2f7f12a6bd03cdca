"""SIGTERM to a real `rhymerl run` in the middle of a step, as Kubernetes, Slurm or `timeout` send it:
the run stops (exit 143, the resume command on stderr, no process of the run left behind, only
whole steps in the lake), and the printed resume command finishes it with exactly the lake rows of
an uninterrupted run: every (epoch, step, prompt, sample) once, none missing, none twice."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers.proc import processes_in_session, processes_with_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EPOCHS, PROMPTS, PER_STEP, N = 2, 4, 2, 2  # 2 epochs x 2 steps of 2 prompts x 2 samples
MARK = "RHYMERL_TEST_RUN_MARK"  # every process the run starts inherits it, wherever it ends up
WAIT_S = 900  # generous: two cores shared with other work; never a claim about speed


def _settings(tiny_model: str, tmp_path: Path) -> list[str]:
    return [f'model.path="{tiny_model}"', f"epochs={EPOCHS}", f"data.num_prompts={PROMPTS}",
            f"rollout.prompts_per_step={PER_STEP}", f"rollout.n={N}", "rollout.num_workers=1",
            "rollout.max_tokens=16", f'lake.url="{tmp_path / "lake"}"',
            f'tracking.uri="sqlite:///{tmp_path / "mlflow.db"}"', "pipe.gantt=false"]


def _rhymerl(args: list[str], tmp_path: Path, mark: str, name: str) -> subprocess.Popen:
    """`rhymerl ARGS` in its own session, from `tmp_path` (its logs, Prefect home and temporary API
    there), console to NAME.out / NAME.err."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS", "PREFECT_HOME")}
    env.update({"PYTHONPATH": str(ROOT), MARK: mark, "PREFECT_HOME": str(tmp_path / ".prefect")})
    env.setdefault("VLLM_CACHE_ROOT", str(ROOT / ".cache" / "vllm"))  # compiled kernels are shared
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".cache" / "inductor"))
    with open(tmp_path / f"{name}.out", "w") as out, open(tmp_path / f"{name}.err", "w") as err:
        return subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=tmp_path, env=env, stdout=out,
                                stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)


def _wait_for(path: Path, pattern: str, proc: subprocess.Popen) -> re.Match:
    """The first match of `pattern` in the file at `path` once it appears; fails if the process ends first."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text())
        if found:
            return found
        assert proc.poll() is None, f"rhymerl exited {proc.returncode} first:\n{path.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} did not appear in {path} within {WAIT_S}s")


def _left_behind(sid: int, mark: str, grace_s: float = 60.0) -> dict[int, str]:
    """Processes of the run still alive after up to `grace_s`: in its session, or carrying its mark."""
    deadline = time.monotonic() + grace_s
    while True:
        left = {**processes_in_session(sid), **processes_with_env(MARK, mark)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _expected_keys(tiny_model: str, tmp_path: Path, run_id: str) -> list[tuple]:
    """(run_id, epoch, step, prompt_id, sample_idx) of every row an uninterrupted run writes."""
    from rhymerl.config.run import load_config
    from rhymerl.run.rollout import epoch_order, step_batches
    from tasks.setup import load_prompts

    cfg = load_config(None, _settings(tiny_model, tmp_path))
    prompts, _ = load_prompts(cfg, tiny_model)
    return sorted((run_id, epoch, step, p.prompt_id, k)
                  for epoch in range(cfg.epochs)
                  for step, batch in enumerate(step_batches(epoch_order(prompts, epoch, cfg.seed), PER_STEP))
                  for p in batch for k in range(N))


def _lake_keys(tmp_path: Path) -> list[tuple]:
    from storage.lake import Lake

    rows = Lake(str(tmp_path / "lake")).sql("SELECT run_id, epoch, step, prompt_id, sample_idx FROM rollouts")
    return sorted(tuple(r.values()) for r in rows.to_pylist())


def _check_stopped(run: subprocess.Popen, tmp_path: Path, mark: str, run_id: str) -> str:
    """The stopped run's exit, console and leftovers; returns the resume command it printed."""
    from storage.lake import Lake

    err = (tmp_path / "first.err").read_text()
    assert run.returncode == 143, err[-3000:]
    assert "SIGTERM: stopping the run" in err
    found = re.search(r"interrupted \(SIGTERM\); continue with: (rhymerl run --resume (\S+) --lake (\S+))", err)
    assert found and found.group(2) == run_id and found.group(3) == str(tmp_path / "lake"), err[-3000:]
    assert _left_behind(run.pid, mark) == {}  # engines, trainer, Ray, the temporary Prefect API: all gone
    # Only whole steps are in the lake (each step's rows commit at once), the run is marked killed.
    lake = Lake(str(tmp_path / "lake"))
    counts = lake.sql("SELECT epoch, step, count(*) AS n, count(DISTINCT prompt_id || ':' || sample_idx) AS keys "
                      "FROM rollouts GROUP BY ALL ORDER BY ALL").to_pylist()
    assert counts and all(c["n"] == c["keys"] == PER_STEP * N for c in counts), counts
    assert lake.sql("SELECT status FROM runs").to_pylist() == [{"status": "killed"}]
    return found.group(1)


def test_sigterm_mid_step_then_resume_gives_an_uninterrupted_runs_rows(tiny_model, tmp_path):
    mark = uuid.uuid4().hex
    run = _rhymerl(["run", "--set", *_settings(tiny_model, tmp_path)], tmp_path, mark, "first")
    try:
        run_id = _wait_for(tmp_path / "first.out", r"rhymerl run (\S+)\n", run).group(1)
        # The console's line for the first step: the second step (epoch 0, step 1) has just begun.
        _wait_for(tmp_path / "first.out", r"step 1/2 \|", run)
        sent = time.monotonic()
        os.kill(run.pid, signal.SIGTERM)
        time.sleep(0.5)
        again = run.poll() is None  # a second SIGTERM while it stops: noted, the stopping goes on
        if again:
            os.kill(run.pid, signal.SIGTERM)
        run.wait(WAIT_S)
        print(f"stopped {time.monotonic() - sent:.1f}s after SIGTERM")  # measured; docs/console-and-errors.md
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    command = _check_stopped(run, tmp_path, mark, run_id)
    assert not again or "SIGTERM again: already stopping" in (tmp_path / "first.err").read_text()

    resumed = _rhymerl(shlex.split(command)[1:], tmp_path, mark, "resumed")
    try:
        assert resumed.wait(WAIT_S) == 0, (tmp_path / "resumed.err").read_text()[-3000:]
    finally:
        if resumed.poll() is None:
            os.killpg(resumed.pid, signal.SIGKILL)
    assert f"run {run_id} done" in (tmp_path / "resumed.out").read_text()
    assert _lake_keys(tmp_path) == _expected_keys(tiny_model, tmp_path, run_id)
    assert _left_behind(resumed.pid, mark) == {}
