"""Weight sync: the trainer's weights into every engine in place, and the proof that they arrived.

After each optimizer step the trainer's weights go to every rollout worker in buckets
(`rhymerl.policy.weight_sync`) and each engine loads them without restarting, by one of two transports
(`train.sync_transport`): through Ray's object store (`object_store`, the default: each bucket a
Ray object that every engine stages, loaded at the commit), or by broadcast over a process group
of the trainer's rank 0 and every engine worker (`process_group`, for GPUs: `workers.sync_group`).
Then every engine is checked against the trainer two ways: the parameter sum both compute
(`weights_fingerprint`) and the log-probs of a fixed probe sequence, which depend on every weight
and on how the engine computes with them.
"""

from __future__ import annotations

import math
import time

import ray

from rhymerl.policy.weight_sync import DEFAULT_BUCKET_BYTES
from workers.sync_group import broadcast_weights

FINGERPRINT_RTOL = 1e-6  # engine and trainer sum the same weights in a different order
# Largest |engine - trainer| probe log-prob accepted, by engine dtype: float32 kernels agree to
# ~1e-5; bf16/fp16 engines round the weights and activations they were given.
PROBE_ATOL = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.1}


class WeightsMismatch(RuntimeError):
    """An engine does not hold the trainer's weights after a sync; sampling would be off-policy."""


def _on_each_worker(workers: list, call, guard) -> list:
    """`call(worker)` (an ObjectRef) on every worker, gathered; a worker whose process died goes
    through the same recovery as in a rollout (`guard.recover`: Ray's restart, then the trainer's
    current weights and the history), then is asked again. Without a guard the error propagates."""
    refs = [call(w) for w in workers]
    out = []
    for i, ref in enumerate(refs):
        try:
            out.append(ray.get(ref))
        except ray.exceptions.RayActorError as exc:
            if guard is None:
                raise
            guard.recover(i, exc)
            out.append(ray.get(call(workers[i])))
    return out


def sync_settings(cfg) -> dict:
    """`sync_task`'s checks for a run config: the engines' dtype and a probe that fits the engine."""
    return {"engine_dtype": cfg.model.dtype, "probe_len": min(32, cfg.model.max_model_len - 1),
            "bucket_bytes": cfg.train.sync_bucket_mb * 2**20, "transport": cfg.train.sync_transport,
            "ranks_per_engine": cfg.rollout.tensor_parallel_size}


def _by_object_store(trainer, workers: list, guard, bucket_bytes: int) -> tuple[int, list[float]]:
    # Buckets stream out of the trainer as it gathers them; each engine stages every bucket, then
    # loads them all at once. No process holds the weights in one Python object on the way.
    moved = 0
    for bucket in trainer.state_buckets.remote(bucket_bytes):
        moved += _on_each_worker(workers, lambda w: w.stage_weights.remote(bucket), guard)[0]
    return moved, _on_each_worker(workers, lambda w: w.commit_weights.remote(), guard)


def _by_process_group(trainer, workers: list, guard, bucket_bytes: int,
                      ranks_per_engine: int) -> tuple[int, list[float]]:
    try:
        return broadcast_weights(trainer, workers, bucket_bytes, ranks_per_engine)
    except ray.exceptions.RayError:
        if guard is None:
            raise
        # A member died mid-broadcast and the group with it; the other engines may hold part of
        # the new weights. Restarted engines are resynced, then every engine gets all the weights
        # through the object store (a dead trainer raises there, for the trainer's recovery).
        guard.ensure_current()
        return _by_object_store(trainer, workers, guard, bucket_bytes)


def sync_weights(trainer, workers: list, guard=None, engine_dtype: str = "float32", probe_len: int = 32,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, transport: str = "object_store",
                 ranks_per_engine: int = 1) -> dict:
    """Send the trainer's new weights to every engine in place (no engine restart) by `transport`
    (see the module), then check every engine against the trainer: the parameter sums both store
    alike (`weights_fingerprint`) and the log-probs of a fixed probe sequence, which depend on
    every weight. A mismatch raises `WeightsMismatch` naming the worker. With `guard`
    (`workers.guard.WorkerGuard`), a worker that dies during the sync is restarted and resynced
    as in a rollout. `ranks_per_engine`: worker processes per engine (tensor parallelism)."""
    t0 = time.perf_counter()
    if transport == "process_group":
        moved, prints = _by_process_group(trainer, workers, guard, bucket_bytes, ranks_per_engine)
    else:
        moved, prints = _by_object_store(trainer, workers, guard, bucket_bytes)
    moved_s = time.perf_counter() - t0
    trainer_print = ray.get(trainer.weights_fingerprint.remote())
    ids, trainer_probe = ray.get(trainer.probe.remote(probe_len))
    probes = _on_each_worker(workers, lambda w: w.probe.remote(ids), guard)
    worst = 0.0
    for w, (fingerprint, probe) in enumerate(zip(prints, probes)):
        diff = max(abs(a - b) for a, b in zip(probe, trainer_probe))
        worst = max(worst, diff)
        if not math.isclose(fingerprint, trainer_print, rel_tol=FINGERPRINT_RTOL) or \
                diff > PROBE_ATOL.get(engine_dtype, 0.25):
            raise WeightsMismatch(f"rollout worker {w} does not hold the trainer's weights after the sync "
                                  f"(fingerprint {fingerprint!r} vs {trainer_print!r}, probe log-prob difference "
                                  f"{diff:.3g}); refusing to sample off-policy")
    return {"sync_s": time.perf_counter() - t0, "sync_gb": moved / 1e9,
            "sync_s_per_gb": moved_s / max(moved / 1e9, 1e-12), "engine_fingerprint": float(prints[0]),
            "trainer_fingerprint": trainer_print, "probe_max_diff": worst}


__all__ = ["FINGERPRINT_RTOL", "PROBE_ATOL", "WeightsMismatch", "sync_settings", "sync_weights"]
