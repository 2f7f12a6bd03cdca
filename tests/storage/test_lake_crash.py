"""Real writer processes: SIGKILL between data and manifest, retries, and concurrent writers."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from storage.lake import Lake
from storage.verify import verify_lake

ROOT = Path(__file__).resolve().parents[2]
ROWS_PER_WORKER = 3

# A writer process: for each step not yet committed, two workers write their files, then the
# step is committed. At `pause_step` it says DATA_WRITTEN and waits on stdin before committing,
# so the test can SIGKILL it there. It first waits for a "go" line, so several writers can start
# at the same moment.
WRITER = r"""
import sys
from storage.lake import LakeWriter, rows_to_table

url, run_id, steps, pause_step, attempt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
w = LakeWriter(url)
print("READY", flush=True)
sys.stdin.readline()
w.write_run(run_id, "crash-test", {"steps": steps})
for step in range(steps):
    if w.is_committed(run_id, 0, step):
        continue
    keys = []
    for worker in (0, 1):
        rows = [{"prompt_id": f"p{step}-{worker}", "sample_idx": i, "response_token_ids": [step, worker, i],
                 "length": 3, "reward": float(i)} for i in range(ROWS)]
        keys.append(w.write_rollouts(run_id, 0, step, worker, attempt, rows_to_table(
            [{"run_id": run_id, "epoch": 0, "step": step, **r} for r in rows])))
    if step == pause_step:
        print("DATA_WRITTEN", flush=True)
        sys.stdin.readline()
    won = w.commit_step(run_id, 0, step, keys)
    w.write_steps_row(run_id, 0, step, {"reward_mean": 1.0})
    print(f"COMMIT {step} {won}", flush=True)
w.finish_run(run_id)
print("DONE", flush=True)
""".replace("ROWS", str(ROWS_PER_WORKER))


def _start(url: str, run_id: str, steps: int, pause_step: int = -1, attempt: int = 0) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, url, run_id, str(steps), str(pause_step),
                             str(attempt)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "READY"
    return proc


def _go(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _finish(proc: subprocess.Popen) -> list[str]:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out.split("\n")


def _tally(lake: Lake, run_id: str) -> dict:
    return lake.sql("SELECT count(*) AS n, count(DISTINCT (step, prompt_id, sample_idx)) AS distinct_rows "
                    "FROM rollouts WHERE run_id = $r", {"r": run_id}).to_pylist()[0]


def test_sigkilled_writer_then_retry_loses_and_duplicates_nothing(lake_url: str) -> None:
    # Rule: a writer killed after its data files but before its manifest shows no rows of that
    # step; the retry adds each row exactly once (0 lost, 0 duplicated).
    per_step = 2 * ROWS_PER_WORKER
    proc = _start(lake_url, "r1", steps=3, pause_step=1)
    _go(proc)
    assert proc.stdout.readline().split() == ["COMMIT", "0", "True"]
    assert proc.stdout.readline().strip() == "DATA_WRITTEN"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with Lake(lake_url) as lake:
        assert _tally(lake, "r1") == {"n": per_step, "distinct_rows": per_step}  # only step 0
        assert [m.step for m in lake.manifests()] == [0]
    pending = verify_lake(lake_url).findings  # the killed attempt's files, in an uncommitted step
    assert sorted(f.kind for f in pending) == ["pending", "pending"]

    retry = _start(lake_url, "r1", steps=3, attempt=1)
    _go(retry)
    assert _finish(retry)[:3] == ["COMMIT 1 True", "COMMIT 2 True", "DONE"]
    with Lake(lake_url) as lake:
        assert _tally(lake, "r1") == {"n": 3 * per_step, "distinct_rows": 3 * per_step}
        assert lake.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == 3
        assert lake.sql("SELECT status FROM runs").column("status").to_pylist() == ["finished"]

    # The killed attempt's files are now leftovers of a committed step; quarantine keeps every row.
    report = verify_lake(lake_url, quarantine=True)
    assert sorted((f.kind, "-a0-" in f.key) for f in report.findings) == [("leftover", True)] * 2
    with Lake(lake_url) as lake:
        assert _tally(lake, "r1") == {"n": 3 * per_step, "distinct_rows": 3 * per_step}
    assert verify_lake(lake_url).findings == ()


def test_two_runs_write_one_lake_at_once(lake_url: str) -> None:
    # Rule: writers of different runs never see or disturb each other's steps.
    a, b = _start(lake_url, "run-a", steps=4), _start(lake_url, "run-b", steps=4)
    _go(a, b)
    assert _finish(a)[-2:] == ["DONE", ""] and _finish(b)[-2:] == ["DONE", ""]
    with Lake(lake_url) as lake:
        per_run = lake.sql("SELECT run_id, count(*) AS n, count(DISTINCT step) AS steps FROM rollouts "
                           "GROUP BY run_id ORDER BY run_id").to_pylist()
        runs = lake.sql("SELECT run_id, status FROM runs ORDER BY run_id").to_pylist()
    assert per_run == [{"run_id": "run-a", "n": 4 * 2 * ROWS_PER_WORKER, "steps": 4},
                       {"run_id": "run-b", "n": 4 * 2 * ROWS_PER_WORKER, "steps": 4}]
    assert runs == [{"run_id": "run-a", "status": "finished"}, {"run_id": "run-b", "status": "finished"}]
    assert verify_lake(lake_url).findings == ()


def test_two_processes_racing_on_one_step_commit_it_once(lake_url: str) -> None:
    # Rule: two processes committing the same steps at once: each step has one winner, no duplicates.
    a, b = _start(lake_url, "r1", steps=3, attempt=0), _start(lake_url, "r1", steps=3, attempt=1)
    _go(a, b)
    wins = [line for line in _finish(a) + _finish(b) if line.startswith("COMMIT") and line.endswith("True")]
    with Lake(lake_url) as lake:
        assert _tally(lake, "r1") == {"n": 3 * 2 * ROWS_PER_WORKER, "distinct_rows": 3 * 2 * ROWS_PER_WORKER}
        assert len(lake.manifests()) == 3
    assert sorted(int(w.split()[1]) for w in wins) == [0, 1, 2]
