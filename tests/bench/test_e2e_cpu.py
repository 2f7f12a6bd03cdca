"""CPU per process and part of the step: labels from titles and ancestry, charging, the report table."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from bench.e2e.cpu import OUTSIDE, PhaseCpu, cpu_section, cpu_table, label
from rhymerl.run.timing import Stopwatch

# a "rollout worker" (by its command line) whose child, its "engine core", burns CPU for 20 s
BURN = "import time\\nt = time.time()\\nwhile time.time() - t < 20: pass"
WORKER = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', '{BURN}'])\ntime.sleep(20)\n"


def burn(seconds: float) -> None:
    t = time.process_time()
    while time.process_time() - t < seconds:
        pass


def test_labels_follow_titles_and_parents() -> None:
    assert label("ray::RolloutWorker.generate", "flow") == "rollout worker"
    assert label("VLLM::EngineCore", "rollout worker 1") == "engine core 1"
    assert label("python -m torch._inductor.compile_worker", "engine core 1") == "engine core 1"  # its child
    assert label("ray::TrainerWorker.train", "ray daemons") == "trainer"
    assert label("ray::IDLE", "ray daemons") == "ray tasks"  # pool workers run the reward scoring
    assert label("/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --x", "flow") == "ray daemons"


@pytest.fixture
def worker():
    proc = subprocess.Popen([sys.executable, "-c", WORKER, "RolloutWorker"])
    deadline = time.monotonic() + 10
    while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield proc
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def test_cpu_is_charged_to_the_process_and_part_that_spent_it(worker) -> None:
    rec = PhaseCpu().install()
    watch = Stopwatch()
    with watch("plan_s"):
        pass
    with watch("train_s"):
        burn(0.3)  # the flow process computes: its CPU goes to train
    time.sleep(0.4)  # the gap after train is the weight sync; the engine core burns meanwhile
    with watch("checkpoint_s"):
        pass
    time.sleep(0.05)
    res = rec.result()
    (step,) = res["steps"]
    assert step["cpu"]["train_s"]["flow"] >= 0.25
    assert step["cpu"]["sync"]["engine core 0"] > 0.05 and "rollout worker 0" in step["cpu"]["sync"]
    assert step["wall"]["sync"] >= 0.4 and OUTSIDE in step["cpu"]["sync"]
    assert "between steps" not in step["cpu"] and res["teardown"]  # after the last step: teardown
    with watch("c"):  # removed: no more laps seen
        pass
    assert rec.steps == res["steps"] and res["recorder_s"] > 0


def test_table_averages_steps_of_the_chosen_epochs_and_groups_parts() -> None:
    def step(flow_train: float) -> dict:
        return {"cpu": {"train_s": {"flow": flow_train}, "log_s": {"flow": 0.1}, "checkpoint_s": {"trainer": 0.3}},
                "wall": {"train_s": 1.0, "log_s": 0.1, "checkpoint_s": 0.2}}
    run = {"arm": "rhymerl", "history": [{"epoch": 0}, {"epoch": 1}, {"epoch": 1}],
           "cpu": {"steps": [step(9.0), step(1.0), step(3.0)], "recorder_s": 0.03}}
    t = cpu_table([run, {"arm": "baseline", "history": []}], epochs=[1])["rhymerl"]
    # epoch-1 steps only: train (1 + 3) / 2; log and checkpoint land in one column
    assert t["steps"] == 2 and t["cpu"]["flow"]["train"] == pytest.approx(2.0)
    assert t["cpu"]["flow"]["log/ckpt"] == pytest.approx(0.1) and t["cpu"]["trainer"]["log/ckpt"] == pytest.approx(0.3)
    assert t["wall"]["log/ckpt"] == pytest.approx(0.3) and t["recorder_s_per_step"] == pytest.approx(0.01)
    md = "\n".join(cpu_section({"rhymerl": t}, [1]))
    assert "| flow | 0.00 | 0.00 | 2.00 | 0.00 | 0.10 | 0.00 | 0.00 | 2.10 |" in md
    assert "No run recorded" in cpu_section({}, [1])[0]


def test_a_process_started_during_setup_is_charged_to_setup_not_outside() -> None:
    rec = PhaseCpu().install()  # the tree is read now, before the child exists
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(5)\n"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while sum(psutil.Process(child.pid).cpu_times()[:2]) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        with Stopwatch()("plan_s"):  # a step starts: the child joins with all its CPU so far
            pass
        res = rec.result()
    finally:
        child.kill()
        child.wait()
    assert res["setup"]["other in the run"] >= 0.25
