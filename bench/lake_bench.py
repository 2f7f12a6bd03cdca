"""Rollout-lake benchmark: write throughput, and the history and length-forecast queries.

    python -m bench.lake_bench [--rows 1000000] [--s3-rows 100000] [--json] [--json-out FILE]
                               [--no-s3] [--keep DIR]

Builds a synthetic lake of `--rows` responses (prompts x 10 epochs x 5 samples, ~200 tokens
each, with token ids and log-probs; text columns left NULL) through the real LakeWriter, 10 steps
per epoch and 2 worker files per step, then times on a fresh Lake:

    history    all responses' token ids of the last-but-one epoch (what HistoSpec indexes while
               the last epoch runs): `Lake.previous_responses(run, last_epoch)`
    forecast   per prompt mean and max length of that epoch: `Lake.length_forecast(run, last_epoch)`

Write time counts encoding, upload and commit (the commit reads every file back to record its
SHA-256), not the synthetic data generation. The same runs on a moto S3 server this script
starts on 127.0.0.1 in its own process; moto keeps objects in Python memory, so S3 uses
`--s3-rows` (smaller by default) and its numbers measure moto, not AWS. Goal: history < 10 s
locally for 20,000 prompts.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from storage.lake import Lake, LakeWriter

EPOCHS, SAMPLES, STEPS_PER_EPOCH, WORKERS = 10, 5, 10, 2
VOCAB, MEAN_TOKENS = 32_000, 200
HISTORY_GOAL_S = 10.0
REPEATS = 3
RUN_ID = "bench"


@dataclasses.dataclass(frozen=True)
class Result:
    """One backend's numbers."""

    backend: str
    responses: int
    prompts: int
    files: int
    tokens: int
    write_s: float
    parquet_mb: float
    arrow_mb: float
    open_s: float
    history_s: list[float]  # each repeat; the first is on a freshly opened Lake
    history_rows: int
    forecast_s: list[float]
    forecast_rows: int

    @property
    def rows_per_s(self) -> float:
        return self.responses / self.write_s

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "rows_per_s": self.rows_per_s,
                "parquet_mb_per_s": self.parquet_mb / self.write_s, "arrow_mb_per_s": self.arrow_mb / self.write_s,
                "history_median_s": statistics.median(self.history_s),
                "forecast_median_s": statistics.median(self.forecast_s)}


class Synthetic:
    """Deterministic synthetic rollouts: each prompt has a typical length that persists across epochs."""

    def __init__(self, prompts: int, seed: int = 0) -> None:
        self.prompts = prompts
        self.rng = np.random.default_rng(seed)
        self.prompt_ids = np.array([hashlib.blake2b(i.to_bytes(8, "little"), digest_size=8).hexdigest()
                                    for i in range(prompts)])
        typical = self.rng.lognormal(np.log(MEAN_TOKENS) - 0.08, 0.4, prompts)
        self.typical = np.clip(typical, 16, 1024)

    def step(self, epoch: int, step: int, first: int, count: int) -> pa.Table:
        """The rollouts of prompts [first, first + count), SAMPLES each."""
        idx = np.repeat(np.arange(first, first + count), SAMPLES)
        n = len(idx)
        lengths = np.clip(self.typical[idx] * self.rng.normal(1.0, 0.15, n), 1, 2048).astype(np.int32)
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        tokens = pa.ListArray.from_arrays(offsets, self.rng.integers(0, VOCAB, total, dtype=np.int32))
        logprobs = pa.ListArray.from_arrays(offsets, -self.rng.exponential(0.5, total).astype(np.float32))
        reward = (self.rng.random(n) < 0.4).astype(np.float32)
        now = time.time()
        return pa.table({
            "prompt_id": pa.array(self.prompt_ids[idx]),
            "prompt_index": pa.array(idx.astype(np.int32)),
            "sample_idx": pa.array(np.tile(np.arange(SAMPLES, dtype=np.int32), count)),
            "response_token_ids": tokens, "logprobs": logprobs,
            "reward": pa.array(reward), "correct": pa.array(reward > 0),
            "length": pa.array(lengths),
            "finish_reason": pa.array(np.where(lengths >= 2048, "length", "stop")),
            "policy_version": pa.array(np.full(n, epoch * STEPS_PER_EPOCH + step, np.int32)),
            "worker_id": pa.array((np.arange(n) * WORKERS // n).astype(np.int32)),
            "gen_start": pa.array(np.full(n, now)), "gen_end": pa.array(now + lengths / 1000.0),
        })


def write_lake(url: str, responses: int, log: bool) -> tuple[Synthetic, dict]:
    """Write the synthetic lake; returns the generator and write statistics."""
    prompts = responses // (EPOCHS * SAMPLES)
    if prompts < STEPS_PER_EPOCH:
        raise SystemExit(f"--rows {responses} is too small: need at least "
                         f"{EPOCHS * SAMPLES * STEPS_PER_EPOCH} responses")
    data = Synthetic(prompts)
    writer = LakeWriter(url)
    per_step = -(-prompts // STEPS_PER_EPOCH)
    stats = {"write_s": 0.0, "files": 0, "tokens": 0, "arrow_bytes": 0}
    for epoch in range(EPOCHS):
        for s in range(STEPS_PER_EPOCH):
            first = s * per_step
            table = data.step(epoch, s, first, min(per_step, prompts - first))
            step = epoch * STEPS_PER_EPOCH + s
            stats["tokens"] += int(np.sum(table.column("length").to_numpy()))
            stats["arrow_bytes"] += table.nbytes
            parts = np.array_split(np.arange(table.num_rows), WORKERS)
            t0 = time.perf_counter()
            keys = [writer.write_rollouts(RUN_ID, epoch, step, w, 0, table.slice(int(p[0]), len(p)))
                    for w, p in enumerate(parts)]
            writer.commit_step(RUN_ID, epoch, step, keys)
            stats["write_s"] += time.perf_counter() - t0
            stats["files"] += len(keys)
        if log:
            print(f"  epoch {epoch}: {stats['write_s']:.1f} s writing so far", file=sys.stderr)
    return data, stats


def _lake_bytes(lake: Lake) -> int:
    return int(lake.sql("SELECT sum(bytes) AS b FROM lake_files").column("b")[0].as_py())


def measure(backend: str, url: str, responses: int, log: bool) -> Result:
    """Write the lake at `url`, then time opening it and the two queries."""
    if log:
        print(f"{backend}: writing {responses:,} responses to {url}", file=sys.stderr)
    data, stats = write_lake(url, responses, log)
    t0 = time.perf_counter()
    lake = Lake(url)
    open_s = time.perf_counter() - t0
    epoch = EPOCHS - 1  # reads epoch EPOCHS - 2, what the last epoch's drafter indexes
    history_s, forecast_s = [], []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        history = lake.previous_responses(RUN_ID, epoch)
        history_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        forecast = lake.length_forecast(RUN_ID, epoch)
        forecast_s.append(time.perf_counter() - t0)
    expected = data.prompts * SAMPLES
    if history.num_rows != expected or forecast.num_rows != data.prompts:
        raise SystemExit(f"{backend}: history gave {history.num_rows} rows (expected {expected}), "
                         f"forecast {forecast.num_rows} (expected {data.prompts})")
    result = Result(backend, responses, data.prompts, stats["files"], stats["tokens"], stats["write_s"],
                    _lake_bytes(lake) / 1e6, stats["arrow_bytes"] / 1e6, open_s, history_s,
                    history.num_rows, forecast_s, forecast.num_rows)
    lake.close()
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def moto_s3(bucket: str) -> Iterator[str]:
    """A moto S3 server in its own process; yields s3://bucket/prefix with the AWS env set."""
    import boto3  # test dependency, only needed for the S3 part

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.create_bucket(Bucket=bucket)
                break
            except Exception:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"moto server did not start on {endpoint}")
                time.sleep(0.5)
        yield f"s3://{bucket}/lake"
    finally:
        server.terminate()
        server.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def format_table(results: list[Result]) -> str:
    """Metrics as rows, backends as columns."""
    lines = [
        ("responses", lambda r: f"{r.responses:,}"), ("prompts", lambda r: f"{r.prompts:,}"),
        ("data files", lambda r: f"{r.files}"), ("tokens", lambda r: f"{r.tokens:,}"),
        ("write time (s)", lambda r: f"{r.write_s:.1f}"), ("write rows/s", lambda r: f"{r.rows_per_s:,.0f}"),
        ("write MB/s (Parquet)", lambda r: f"{r.parquet_mb / r.write_s:.1f}"),
        ("write MB/s (Arrow in memory)", lambda r: f"{r.arrow_mb / r.write_s:.1f}"),
        ("lake size (MB)", lambda r: f"{r.parquet_mb:.0f}"), ("open Lake (s)", lambda r: f"{r.open_s:.2f}"),
        ("history query, first (s)", lambda r: f"{r.history_s[0]:.2f}"),
        ("history query, median (s)", lambda r: f"{statistics.median(r.history_s):.2f}"),
        ("history rows", lambda r: f"{r.history_rows:,}"),
        ("forecast query, first (s)", lambda r: f"{r.forecast_s[0]:.2f}"),
        ("forecast query, median (s)", lambda r: f"{statistics.median(r.forecast_s):.2f}"),
    ]
    header = ["metric"] + [r.backend for r in results]
    rows = [[name] + [fn(r) for r in results] for name, fn in lines]
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths)))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(row) for row in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lake_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="responses in the local lake (default 1,000,000)")
    parser.add_argument("--s3-rows", type=int, default=100_000,
                        help="responses in the moto S3 lake (default 100,000: moto holds objects in memory)")
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 (moto) part")
    parser.add_argument("--keep", metavar="DIR", help="write the local lake under DIR and keep it")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.add_argument("--json-out", metavar="FILE", help="also write the JSON results to FILE")
    args = parser.parse_args(argv)
    log = not args.json
    work = args.keep or tempfile.mkdtemp(prefix="rhymerl-bench-")
    results = []
    try:
        results.append(measure("local", os.path.join(work, "lake"), args.rows, log))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if not args.no_s3:
        with moto_s3("rhymerl-bench") as url:
            results.append(measure("s3 (moto)", url, args.s3_rows, log))
    local = results[0]
    history = statistics.median(local.history_s)
    notes = [f"local history query for {local.prompts:,} prompts: {history:.2f} s (goal < {HISTORY_GOAL_S:.0f} s: "
             f"{'met' if history < HISTORY_GOAL_S else 'NOT met'})",
             "text columns (prompt_text, response_text) are NULL in the synthetic lake",
             f"machine: {os.cpu_count()} CPU(s)"]
    if not args.no_s3 and args.s3_rows != args.rows:
        notes.append(f"S3 uses {args.s3_rows:,} responses (not {args.rows:,}): moto keeps objects in Python "
                     "memory and serves them slowly; its numbers measure moto, not a real object store")
    doc = json.dumps({"results": [r.as_dict() for r in results], "notes": notes,
                      "config": {"epochs": EPOCHS, "samples": SAMPLES, "steps_per_epoch": STEPS_PER_EPOCH,
                                 "workers": WORKERS, "mean_tokens": MEAN_TOKENS}}, indent=1)
    if args.json_out:
        Path(args.json_out).write_text(doc + "\n")
    if args.json:
        print(doc)
    else:
        print(format_table(results))
        print("\n".join(f"note: {n}" for n in notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
