"""The trainer actor's streamed step (`TrainerWorker.stream_*`): the update only when the stream
is whole; an incomplete, failed or aborted stream leaves the weights alone for the batch path."""

from __future__ import annotations

import pytest
import ray

from rhymerl.config.run import RunConfig, TrainConfig
from rhymerl.policy.trainer import TrainExample
from workers.actors import TrainerWorker
from helpers.sharded import BATCH, tiny_qwen2


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, local_ray):
    """Two trainers on the same weights: one streams, its twin trains the batch."""
    cfg = RunConfig(train=TrainConfig(lr=1e-2, micro_batch_size=2, stream=True))
    model_dir = tiny_qwen2(tmp_path_factory.mktemp("qwen2"))
    actors = [TrainerWorker.options(num_cpus=0).remote(model_dir, cfg) for _ in range(2)]
    yield actors
    for actor in actors:
        ray.kill(actor)


def version(trainer) -> int:
    return ray.get(trainer.policy_version.remote())


def test_only_a_whole_stream_steps_and_as_the_batch_path(pair):
    trainer, twin = pair
    start, first, rest = version(trainer), BATCH[:3], BATCH[3:]
    trainer.stream_begin.remote()
    trainer.stream_add.remote(first)
    assert ray.get(trainer.stream_finish.remote(len(BATCH))) is None  # one group short: no update
    trainer.stream_begin.remote()
    failed = trainer.stream_add.remote([TrainExample((1,), (999,), 1.0)])  # a token outside the vocabulary
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(failed)
    assert ray.get(trainer.stream_finish.remote(1)) is None  # a failed add spoils the stream
    trainer.stream_begin.remote()
    trainer.stream_add.remote(first)
    trainer.stream_abort.remote()
    assert version(trainer) == start
    trainer.stream_begin.remote()  # a fresh stream: nothing of the aborted one remains
    trainer.stream_add.remote(first)
    trainer.stream_add.remote(rest)
    out = ray.get(trainer.stream_finish.remote(len(BATCH)))
    assert out["tokens"] == sum(len(ex.response_ids) for ex in BATCH) and out["seconds"] > 0
    assert version(trainer) == start + 1
    ray.get(twin.train_step.remote(BATCH))
    assert ray.get(trainer.weights_fingerprint.remote()) == pytest.approx(ray.get(twin.weights_fingerprint.remote()),
                                                                          rel=1e-6)
