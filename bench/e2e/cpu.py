"""CPU seconds per process and per part of a step, so that a background consumer cannot hide.

Recording (in the process of one benchmark run, `bench.e2e.bench`'s child): `PhaseCpu` listens
to the step's Stopwatch parts (`rhymerl.run.timing.on_lap`) and at every start and end of a part
reads the CPU seconds (user + system) of every process under the run's process and of the whole
machine. What each process spent between two such moments is charged to the part between them.
A part's start opens it; its end opens the gap to the next part: after `train_s` that gap is the
weight sync, after `checkpoint_s` it runs to the next step's plan ("between steps": the epoch
flow, the next epoch's history bundle, whatever runs while no step does), any other gap is
dispatch. Time before the first step is setup, after the last one teardown; neither is a step's.

Processes are grouped by what they are (`label`), from their command line (Ray and vLLM set
process titles) and their ancestry: the flow (the run's own process: Prefect flow, tasks, lake
writes, MLflow), each rollout worker, each worker's engine core (with its children), the trainer,
Ray task workers (reward scoring), Ray's own daemons, the Prefect server, anything else under the
run, and "outside the run": the machine's CPU seconds minus all of the above (other jobs, or a
process that escaped the tree). The process tree is re-read at each step's start; a process that
ends between two readings loses its last interval (engines and actors live for the whole run); one
found at a step's start is charged all its CPU since it started, to the part that just ended (so the
actors' and engines' start-up counts as setup, not as "outside the run").
Reading ~40 /proc entries per boundary costs the flow process a few ms, between a step's timed parts:
`recorder_s` reports it in all and per step, and the end-to-end analysis takes it out of the step's
wall time and dispatch (it is the benchmark's instrument, not the system's cost).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Sequence

import psutil

from rhymerl.run.timing import on_lap

GAPS = {"train_s": "sync", "checkpoint_s": "between steps"}  # the gap after a part ends; else "dispatch"
# parts as the report shows them (the record keeps the finer names)
GROUPS = {"rollout_s": "rollout", "reward_s": "reward", "train_s": "train", "sync": "sync",
          "measure_s": "log/ckpt", "log_s": "log/ckpt", "checkpoint_s": "log/ckpt",
          "between steps": "between steps", "plan_s": "other", "lake_s": "other", "dispatch": "other"}
COLUMNS = ("rollout", "reward", "train", "sync", "log/ckpt", "between steps", "other")
OUTSIDE = "outside the run"


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (every core, idle and iowait excluded)."""
    t = psutil.cpu_times()
    return sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))


def label(cmd: str, parent: str) -> str:
    """What a process is, from its command line and its parent's label (an engine core's own
    children count as that engine core, the trainer's as the trainer)."""
    if parent.startswith("rollout worker"):
        return "engine core" + parent[len("rollout worker"):]
    if parent.startswith("engine core") or parent == "trainer":
        return parent
    if "RolloutWorker" in cmd:
        return "rollout worker"
    if "TrainerWorker" in cmd:
        return "trainer"
    if cmd.startswith("ray::"):
        return "ray tasks"
    if "prefect" in cmd or "uvicorn" in cmd:
        return "prefect server"
    if "ray" in cmd.lower() or "gcs_server" in cmd:
        return "ray daemons"
    return "other in the run"


def process_tree(root: int) -> dict[int, tuple[psutil.Process, str]]:
    """Every live process under `root` (itself included) with its label; rollout workers are
    numbered by pid, and each engine core takes its worker's number."""
    top = psutil.Process(root)
    procs = {p.pid: p for p in [top] + top.children(recursive=True)}
    parent, cmd = {}, {}
    for pid, p in procs.items():
        try:
            parent[pid], cmd[pid] = p.ppid(), " ".join(p.cmdline())
        except psutil.Error:  # ended while we looked
            pass
    workers = sorted(pid for pid, c in cmd.items() if "RolloutWorker" in c)
    labels = {root: "flow"}

    def name_of(pid: int) -> str:
        if pid not in labels:
            up = parent[pid]
            name = label(cmd[pid], name_of(up) if up in parent else "")
            labels[pid] = f"{name} {workers.index(pid)}" if name == "rollout worker" else name
        return labels[pid]

    return {pid: (procs[pid], name_of(pid)) for pid in parent}


class PhaseCpu:
    """Per step: CPU seconds by part and process label, and wall seconds by part (module docstring).

    `install()` starts listening in this process; `result()` stops and returns
    {"steps": [{"cpu": {part: {label: s}}, "wall": {part: s}}], "setup": {label: s},
    "teardown": {label: s}, "recorder_s": s}, steps in the order the run took them.
    """

    def __init__(self, root: int | None = None) -> None:
        self.root = root or os.getpid()
        self.tree = process_tree(self.root)
        self.last = self._read()
        self.part = "setup"
        self.steps: list[dict] = []
        self.setup: dict[str, float] = {}
        self.recorder_s = 0.0
        self._remove = None

    def install(self) -> "PhaseCpu":
        self._remove = on_lap(self.lap)
        return self

    def _read(self) -> tuple[float, dict[int, float], float]:
        cpu = {}
        for pid, (p, _) in self.tree.items():
            try:
                t = p.cpu_times()
                cpu[pid] = t.user + t.system
            except psutil.Error:  # ended: its last interval is lost (see the module docstring)
                pass
        return time.perf_counter(), cpu, machine_cpu_s()

    def _charge(self, part: str) -> None:
        """Charge what every process spent since the last reading to `part` of the current step."""
        now = self._read()
        t0, cpu0, m0 = self.last
        t1, cpu1, m1 = now
        spent: dict[str, float] = {}
        for pid, s in cpu1.items():
            name = self.tree[pid][1]
            spent[name] = spent.get(name, 0.0) + max(0.0, s - cpu0.get(pid, 0.0))  # new: all since birth
        spent[OUTSIDE] = max(0.0, (m1 - m0) - sum(spent.values()))
        if part == "setup":
            target = self.setup
        else:
            step = self.steps[-1]
            step["wall"][part] = step["wall"].get(part, 0.0) + t1 - t0
            target = step["cpu"].setdefault(part, {})
        for name, s in spent.items():
            target[name] = target.get(name, 0.0) + s
        self.last = now

    def lap(self, name: str, started: bool) -> None:
        """The Stopwatch listener: close the running part, open the next one."""
        t = time.perf_counter()
        if started and name == "plan_s":  # a new step: processes started since (the actors and engines
            self.tree = process_tree(self.root)  # in setup, restarted ones later) join, with all their CPU
        self._charge(self.part)
        if started and name == "plan_s":
            self.steps.append({"cpu": {}, "wall": {}})
        self.part = name if started else GAPS.get(name, "dispatch")
        spent = time.perf_counter() - t
        self.recorder_s += spent
        if self.steps:  # on the step's critical path (between its timed parts): the analysis takes it out
            self.steps[-1]["recorder_s"] = self.steps[-1].get("recorder_s", 0.0) + spent

    def result(self) -> dict:
        """Stop listening; the part after the last step is teardown."""
        if self._remove is not None:
            self._remove()
            self._remove = None
            self._charge(self.part)
        teardown: dict[str, float] = {}
        if self.steps and self.part == "between steps":
            teardown = self.steps[-1]["cpu"].pop("between steps", {})
            self.steps[-1]["wall"].pop("between steps", None)
        return {"steps": self.steps, "setup": self.setup, "teardown": teardown, "recorder_s": self.recorder_s}


def cpu_table(runs: Sequence[dict], epochs: Sequence[int]) -> dict[str, dict]:
    """Per arm: mean CPU seconds per step by process label and report column (GROUPS), and the
    mean wall seconds per column, over the steps of `epochs` of every run that recorded CPU."""
    out: dict[str, dict] = {}
    for arm in sorted({r["arm"] for r in runs}):
        steps = [s for r in runs if r["arm"] == arm and r.get("cpu")
                 for s, h in zip(r["cpu"]["steps"], r["history"]) if h["epoch"] in epochs]
        if not steps:
            continue
        cpu: dict[str, dict[str, float]] = {}
        wall: dict[str, float] = {}
        for s in steps:
            for part, spent in s["cpu"].items():
                col = GROUPS.get(part, "other")
                wall[col] = wall.get(col, 0.0) + s["wall"].get(part, 0.0) / len(steps)
                for name, sec in spent.items():
                    row = cpu.setdefault(name, {})
                    row[col] = row.get(col, 0.0) + sec / len(steps)
        recorder = [r["cpu"]["recorder_s"] / max(1, len(r["cpu"]["steps"])) for r in runs
                    if r["arm"] == arm and r.get("cpu")]
        out[arm] = {"steps": len(steps), "cpu": cpu, "wall": wall, "recorder_s_per_step": statistics.fmean(recorder)}
    return out


def cpu_section(table: dict[str, dict], epochs: Sequence[int]) -> list[str]:
    """REPORT.md lines: one table per arm, processes x parts of the step, CPU seconds per step."""
    if not table:
        return ["No run recorded CPU per process (runs from before this table existed)."]
    out = [f"Mean CPU seconds per step (user + system; 2 cores give at most 2 s per wall second) of each "
           f"process, by part of the step, epochs {', '.join(map(str, epochs))}. '{OUTSIDE}' is the machine's "
           "busy CPU minus every process of the run: other jobs on the machine.", ""]
    for arm, t in table.items():
        rows = sorted(t["cpu"], key=lambda n: -sum(t["cpu"][n].values()))
        out += [f"**{arm}** ({t['steps']} steps; recording cost {1e3 * t['recorder_s_per_step']:.1f} ms of flow "
                "CPU per step)", "", "| process | " + " | ".join(COLUMNS) + " | total |",
                "|---" * (len(COLUMNS) + 2) + "|"]
        for name in rows:
            vals = [t["cpu"][name].get(c, 0.0) for c in COLUMNS]
            out.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in vals) + f" | {sum(vals):.2f} |")
        walls = [t["wall"].get(c, 0.0) for c in COLUMNS]
        out += ["| *wall seconds* | " + " | ".join(f"{v:.2f}" for v in walls) + f" | {sum(walls):.2f} |", ""]
    return out
