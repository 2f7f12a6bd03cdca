"""Ray actors that hold the run's long-lived state: one vLLM engine per rollout worker, one trainer.

Engines and the trainer start once per run (engine start-up costs tens of seconds); Prefect tasks
call their methods each step. Weights move trainer -> engines through Ray's object store, never
through the flow process.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

import ray

from rhymerl.config.run import RunConfig
from rhymerl.data.records import Prompt, Request, Sample
from rhymerl.run.heap import freeze_startup_heap
from rhymerl.vllm.engine import EngineSettings, SamplingSettings
from workers.sync_group import WeightSender


@dataclass(frozen=True)
class Placement:
    """Ray resources for the actors (logical CPUs on a laptop, GPUs on a cluster) and the custom
    resources (`placement.*_resource`) that pin them to the nodes started with them."""

    worker_cpus: float
    worker_gpus: float
    trainer_cpus: float
    trainer_gpus: float
    worker_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    trainer_resources: dict[str, float] = dataclasses.field(default_factory=dict)


def placement_for(cfg: RunConfig, gpus_available: float) -> Placement:
    """GPUs when the cluster has them (`rollout.tensor_parallel_size` per engine and one for the
    trainer), else CPUs; plus one unit of each configured custom resource.

    On CPU the trainer takes no logical CPU: it works while the engines are idle between
    rollouts, and reserving a core for it would leave the engines one core short.
    """
    pin = lambda name: {name: 1.0} if name else {}  # noqa: E731
    custom = dict(worker_resources=pin(cfg.placement.rollout_resource),
                  trainer_resources=pin(cfg.placement.trainer_resource))
    if gpus_available >= 1 and cfg.placement.share_gpu:
        return Placement(worker_cpus=1, worker_gpus=0.5, trainer_cpus=1, trainer_gpus=0.5, **custom)
    if gpus_available >= 1:
        return Placement(worker_cpus=1, worker_gpus=cfg.rollout.tensor_parallel_size,
                         trainer_cpus=1, trainer_gpus=1, **custom)
    return Placement(worker_cpus=1, worker_gpus=0, trainer_cpus=0, trainer_gpus=0, **custom)


def missing_resources(place: Placement, workers: int, cluster: dict[str, float], trainer_ranks: int = 1) -> list[str]:
    """What the cluster lacks for this placement (GPUs and custom resources), as fix-it messages.

    Ray would queue such actors forever; the run should stop at once and say why.
    """
    gpus = place.worker_gpus * workers + place.trainer_gpus * trainer_ranks
    short = [] if gpus <= cluster.get("GPU", 0.0) else [
        f"the Ray cluster has {cluster.get('GPU', 0.0):g} GPUs, the run needs {gpus:g} (rollout.num_workers x "
        "rollout.tensor_parallel_size, plus train.world_size for the trainer); lower rollout.num_workers or "
        "train.world_size, or on one GPU set placement.share_gpu=true"]
    need: dict[str, float] = {}
    for name, units in place.worker_resources.items():
        need[name] = need.get(name, 0.0) + units * workers
    for name, units in place.trainer_resources.items():
        need[name] = need.get(name, 0.0) + units * trainer_ranks
    return short + [f"the Ray cluster has {cluster.get(name, 0.0):g} units of custom resource '{name}', the run "
            f"needs {units:g}; start nodes with ray start --resources '{{\"{name}\": {units:g}}}' or "
            "change placement.rollout_resource / placement.trainer_resource"
            for name, units in need.items() if cluster.get(name, 0.0) < units]


@ray.remote(max_concurrency=3)  # `stop` must reach a running `stream` (HistoPipe migration)
class RolloutWorker:
    """Holds one vLLM engine; generates a step's responses and takes new weights in place.

    Threaded only so `stop` can run while `stream` drives the engine. Every call that touches the
    engine holds `_engine_lock`, so a stream left running by a failed driver (a retried rollout)
    finishes before the next stream starts or new weights load: never two engine loops at once,
    never a weight update under running requests.
    """

    def __init__(self, worker_id: int, spec: EngineSettings) -> None:
        from rhymerl.vllm.engine import VllmEngine
        from rhymerl.vllm.histospec_proposer import INDEX_ENV

        self.worker_id = worker_id
        # HistoSpec's drafter runs in the engine's own process and reads its history from this
        # file (named before the engine starts, so the engine process inherits the name). A
        # file local to the worker's node: remote workers never need the driver's filesystem.
        self.history_dir = tempfile.mkdtemp(prefix=f"rhymerl-histospec-w{worker_id}-")
        self.history_path = os.path.join(self.history_dir, "bundle.npz")
        os.environ[INDEX_ENV] = self.history_path
        self.engine = VllmEngine(spec)
        self.node_id = ray.get_runtime_context().get_node_id()
        freeze_startup_heap()  # its engine core does the same (vLLM's freeze_gc_heap)
        self._stops: set[tuple[str, int]] = set()
        self._stops_lock = threading.Lock()
        self._engine_lock = threading.Lock()

    def set_history(self, blob) -> int:
        """Replace the drafter's history (a serialised HistoryBundle: bytes, or the uint8 array
        `workers.history_bundles` sends, which Ray maps from its object store without a copy) between
        generate calls; the drafter re-reads the file at its next step. Returns its bytes."""
        view = memoryview(blob).cast("B")
        tmp = f"{self.history_path}.tmp"
        with open(tmp, "wb") as f:
            f.write(view)
        os.replace(tmp, self.history_path)  # the drafter sees the old file or the new, never half
        return view.nbytes

    def spec_stats(self) -> dict | None:
        """Speculation counters since the last call (a `SpecStats` as a dict), None when off."""
        with self._engine_lock:
            stats = self.engine.spec_stats()
        return dataclasses.asdict(stats) if stats is not None else None

    def speculation(self) -> dict:
        """What the engine runs: active, verifier and the guard's message."""
        s = self.engine.speculation
        return {"active": s.active, "verifier": s.verifier, "message": s.message}

    def generate(self, prompts: list[Prompt], spec: SamplingSettings) -> list[Sample]:
        if not prompts:
            return []
        with self._engine_lock:
            return self.engine.generate(prompts, spec, worker_id=self.worker_id)

    def evaluate(self, prompts: list[Prompt], spec: SamplingSettings) -> list[Sample]:
        """`generate` for a held-out evaluation, leaving no trace in what the engine drafts from later.

        HistoSpec's in-engine state (each prompt's siblings, the cross-prompt tree of recent
        responses) only takes requests whose prompt is in the worker's current bundle. An empty
        bundle is published first, so every evaluation request matches no prompt: it drafts nothing
        and adds nothing to the siblings or the tree, even when an eval prompt is also a training
        prompt. The next step publishes its own bundle before its rollout, as every step does.
        vLLM's suffix drafter forgets these requests afterwards (`VllmEngine.generate_unrecorded`).
        Their acceptance counters are drained so the next step's `spec_stats` counts training only.
        """
        from rhymerl.histospec.bundle import HistoryBundle

        if not prompts:
            return []
        with self._engine_lock:
            self.set_history(HistoryBundle.of(()).to_bytes())
            samples = self.engine.generate_unrecorded(prompts, spec, worker_id=self.worker_id)
            self.engine.spec_stats()
            return samples

    def stream(self, requests: list[Request], spec: SamplingSettings, every_s: float, track: bool):
        """Ray streaming generator: `StreamEvent`s of these requests as they finish (see
        `VllmEngine.stream`); with `track`, running token counts too, and `stop` takes effect."""
        with self._engine_lock:
            with self._stops_lock:
                self._stops.clear()
            yield from self.engine.stream(requests, spec, worker_id=self.worker_id, every_s=every_s,
                                          take_stops=self._take_stops if track else None)

    def stop(self, keys: list[tuple[str, int]]) -> None:
        """Ask the running `stream` to stop these requests between engine steps (as Partials)."""
        with self._stops_lock:
            self._stops.update(keys)

    def _take_stops(self) -> set[tuple[str, int]]:
        with self._stops_lock:
            keys, self._stops = self._stops, set()
        return keys

    def load_weights(self, state: dict) -> float:
        """Install new weights; returns the engine's weight fingerprint afterwards."""
        with self._engine_lock:
            self.engine.load_weights(state.items())
            return self.engine.weights_fingerprint()

    def stage_weights(self, bucket: dict) -> int:
        """Hand one bucket of a bucketed weight sync to the engine (loaded at `commit_weights`);
        returns the bucket's bytes."""
        from rhymerl.policy.weight_sync import bucket_bytes_of

        with self._engine_lock:
            self.engine.stage_weights(bucket.items())
        return bucket_bytes_of(bucket)

    def commit_weights(self) -> float:
        """Load the staged buckets in place; returns the engine's weight fingerprint afterwards."""
        with self._engine_lock:
            self.engine.commit_weights()
            return self.engine.weights_fingerprint()

    def receive_weights(self, address, first_rank: int) -> float:
        """Load what the trainer broadcasts over the weight group at `address` (a
        `rhymerl.policy.weight_group.GroupAddress`; `workers.sync_group`); the fingerprint afterwards."""
        with self._engine_lock:
            self.engine.receive_weights(address.host, address.port, address.world_size, address.backend, first_rank)
            return self.engine.weights_fingerprint()

    def weights_fingerprint(self) -> float:
        with self._engine_lock:
            return self.engine.weights_fingerprint()

    def probe(self, ids: list[int]) -> list[float]:
        """The engine's log-probs of the probe tokens (see `VllmEngine.probe_logprobs`)."""
        with self._engine_lock:
            return self.engine.probe_logprobs(ids)

    def info(self) -> dict:
        return {"worker_id": self.worker_id, "node_id": self.node_id, "pid": os.getpid()}


class ShardedCheckpoints:
    """Checkpoint methods a trainer actor shares with every rank of a group: `self.trainer` writes
    or reads its part of a sharded checkpoint (`rhymerl.policy.checkpoint`; the whole state when it
    is the only one), and the weights go out as a Hugging Face folder. The actor class provides
    `weights_fingerprint` (and `rank` on a group)."""

    trainer: Any

    def export_files(self) -> dict[str, bytes] | None:
        """The policy's weights now as the files of a Hugging Face folder (`rhymerl.policy.export`),
        name -> bytes, from rank 0 (every rank gathers); None on the other ranks. The driver
        stores them (`storage.exports`): it holds the lake's credentials, as for one-rank checkpoints."""
        from pathlib import Path

        from rhymerl.policy.export import export_hf

        if getattr(self, "rank", 0) != 0:
            for _ in self.trainer.engine_tensors():  # the same gathers as rank 0's, in the same order
                pass
            return None
        weights = dict(self.trainer.engine_tensors())
        with tempfile.TemporaryDirectory() as tmp:
            out = export_hf(weights, self.trainer.model_dir, Path(tmp) / "model")
            return {f.name: f.read_bytes() for f in out.iterdir()}

    def save_checkpoint(self, url: str, storage_options: dict) -> int:
        """Write this process's part of a sharded checkpoint under `url`; the policy version."""
        from rhymerl.policy.checkpoint import save_trainer

        save_trainer(self.trainer, url, **storage_options)
        return self.trainer.policy_version

    def load_checkpoint(self, url: str, storage_options: dict) -> int:
        """Restore a sharded checkpoint written by any trainer world size; the policy version."""
        from rhymerl.policy.checkpoint import load_trainer

        return load_trainer(self.trainer, url, **storage_options)

    def warm_start_checkpoint(self, url: str, storage_options: dict) -> float:
        """Another run's sharded checkpoint, at policy version 0 of this run; the fingerprint."""
        self.load_checkpoint(url, storage_options)
        self.trainer.policy_version = 0
        self.trainer.set_lr_step(0)  # this run's schedule starts at its beginning
        return self.weights_fingerprint()


@ray.remote
class TrainerWorker(ShardedCheckpoints, WeightSender):
    """Holds the torch policy and optimizer; one GRPO update per step. `total_steps`: the run's
    optimizer steps, over which the learning-rate schedule runs (`rhymerl.policy.lr_schedule`)."""

    def __init__(self, model_dir: str, cfg: RunConfig, threads: int | None = None, total_steps: int = 0) -> None:
        from rhymerl.policy.trainer import Trainer

        self.trainer = Trainer(model_dir, cfg.train, seed=cfg.seed, dtype=cfg.train.dtype or cfg.model.dtype,
                               threads=threads, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                               total_steps=total_steps)
        freeze_startup_heap()
        self._stream = None  # the step's StreamedStep while groups arrive (train.stream)
        self._stream_ok = False  # False once an add failed: the stream cannot give the step's update

    def train_step(self, batch: list) -> dict:
        return self.trainer.train_step(batch)

    def stream_begin(self) -> None:
        """Start a streamed step (`rhymerl.policy.stream`), dropping any unfinished one."""
        from rhymerl.policy.stream import StreamedStep

        self._stream, self._stream_ok = StreamedStep(self.trainer), True  # it zeroes the gradients

    def stream_add(self, group: list) -> None:
        """Forward/backward of one complete group's `TrainExample`s. The driver does not wait for
        this call, so a failure is remembered for `stream_finish` as well as raised."""
        if self._stream is None:
            raise RuntimeError("stream_add without stream_begin: the driver starts every streamed step")
        try:
            self._stream.add(group)
        except BaseException:
            self._stream_ok = False
            raise

    def stream_finish(self, examples: int) -> dict | None:
        """The streamed step's optimizer update and `train_step`'s metrics, when every add worked
        and they held `examples` examples in all; else None, the stream dropped (the caller then
        trains the batch path)."""
        step, ok, self._stream = self._stream, self._stream_ok, None
        if step is None or not ok or step.examples != examples:
            self.trainer.optimizer.zero_grad(set_to_none=True)
            return None
        return step.finish()

    def stream_abort(self) -> None:
        """Drop the streamed step and its accumulated gradients."""
        self._stream = None
        self.trainer.optimizer.zero_grad(set_to_none=True)

    def state_for_engine(self) -> dict:
        return self.trainer.state_dict_for_engine()

    def state_buckets(self, bucket_bytes: int):
        """Ray streaming generator: the weights as `rhymerl.policy.weight_sync` buckets, one at a time."""
        from rhymerl.policy.weight_sync import bucketed

        yield from bucketed(self.trainer.engine_tensors(), bucket_bytes)

    def policy_version(self) -> int:
        return self.trainer.policy_version

    def held_bytes(self) -> int:
        """Parameters + optimizer state held by this actor (see `Trainer.held_bytes`)."""
        return self.trainer.held_bytes()

    def weights_fingerprint(self) -> float:
        """Comparable with the engines' fingerprint (see rhymerl.vllm.worker_ext.weights_fingerprint)."""
        from rhymerl.vllm.worker_ext import weights_fingerprint

        return weights_fingerprint(self.trainer.model.named_parameters())

    def probe(self, length: int) -> tuple[list[int], list[float]]:
        """Probe token ids for this model's vocabulary and the trainer's log-probs of them."""
        from rhymerl.policy.trainer import probe_ids

        ids = probe_ids(self.trainer.vocab_size, length)
        return ids, self.trainer.probe_logprobs(ids)

    def export_state(self) -> bytes:
        """Policy, optimizer, policy version and torch RNG as bytes (a checkpoint's trainer.pt)."""
        return self.trainer.state_bytes()

    def import_state(self, blob: bytes) -> int:
        """Restore what `export_state` returned; returns the restored policy version."""
        self.trainer.load_state_bytes(blob)
        return self.trainer.policy_version

    def warm_start(self, blob: bytes) -> float:
        """Start from another run's checkpoint (`export_state` bytes): its weights, optimizer and
        RNG, at policy version 0 of this run; returns the weights' fingerprint."""
        self.trainer.load_state_bytes(blob)
        self.trainer.policy_version = 0
        self.trainer.set_lr_step(0)  # this run's schedule starts at its beginning
        return self.weights_fingerprint()

    def save(self, out_dir: str) -> str:
        self.trainer.save(out_dir)
        return out_dir

    def info(self) -> dict:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
