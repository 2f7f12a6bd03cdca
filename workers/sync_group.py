"""The process-group weight sync (`train.sync_transport = "process_group"`): trainer -> engines by broadcast.

The driver (`broadcast_weights`) asks the trainer's rank 0 for a rendezvous address, starts every
engine's receive (each engine worker process joins the group and loads what arrives in place:
`rhymerl.vllm.worker_ext.WeightSyncExtension.rhymerl_receive_weights`), then has the trainer
broadcast its buckets: rank 0 packs each bucket as the ranks gather it from their shards and
sends it over the group (`rhymerl.policy.weight_group`; NCCL on GPUs, gloo on CPU). No weight passes
through Ray's object store or the driver.

The group is opened for one sync and closed after it, so an engine restarted by the guard simply
joins the next sync's group; the cost is one rendezvous per sync (a TCP store and, on GPUs, NCCL
communicators: about a second, against a step of minutes).
"""

from __future__ import annotations

from typing import Any

import ray

from rhymerl.policy.weight_group import GroupAddress


class WeightSender:
    """Trainer-actor methods of the process-group sync; mixed into `TrainerWorker` and every
    `TrainerRank` (`self.trainer`; `self.rank`, 0 for the single trainer)."""

    trainer: Any
    rank: int = 0

    def weight_rendezvous(self) -> tuple[str, int, str]:
        """(node IP, free port on it, backend): where a weight group with this actor as rank 0
        meets, NCCL when the trainer computes on a GPU."""
        from rhymerl.policy.sharded import free_port

        backend = "nccl" if self.trainer.device.type == "cuda" else "gloo"
        return ray.util.get_node_ip_address(), free_port(), backend

    def broadcast_weights(self, address: GroupAddress, bucket_bytes: int) -> int:
        """Rank 0: open the group as its rank 0 and broadcast the weights in buckets; the bytes
        sent. Other ranks take part in gathering each tensor and send nothing (collective)."""
        from rhymerl.policy.weight_group import open_group
        from rhymerl.policy.weight_sync import bucketed

        device = "cuda" if address.backend == "nccl" else "cpu"
        if self.rank != 0:
            for _ in self.trainer.engine_tensors(device):  # the same gathers, in the same order
                pass
            return 0
        group = open_group(address, rank=0)
        try:
            return group.send(bucketed(self.trainer.engine_tensors(device), bucket_bytes))
        finally:
            group.close()


def broadcast_weights(trainer, workers: list, bucket_bytes: int, ranks_per_engine: int = 1) -> tuple[int, list[float]]:
    """One process-group sync: the trainer's weights into every engine; (bytes sent, each
    engine's fingerprint after). Engine i's workers are ranks 1 + i * ranks_per_engine onwards.
    Raises what any member raised (a dead engine: `ray.exceptions.RayActorError`); every
    member's call has ended by then, so a retry finds the engines idle."""
    host, port, backend = ray.get(trainer.weight_rendezvous.remote())
    address = GroupAddress(host, port, 1 + ranks_per_engine * len(workers), backend)
    receives = [w.receive_weights.remote(address, 1 + i * ranks_per_engine) for i, w in enumerate(workers)]
    send = trainer.broadcast_weights.remote(address, bucket_bytes)
    # wait for every member before raising: a receiver still blocked in the group would hold its
    # engine's lock against the retry (each side fails by itself when a peer dies or times out)
    ray.wait([send, *receives], num_returns=1 + len(receives))
    moved = ray.get(send)
    return moved, ray.get(receives)


__all__ = ["WeightSender", "broadcast_weights"]
