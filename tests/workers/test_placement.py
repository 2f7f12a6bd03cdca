"""Actor placement on a cluster: GPUs per engine, custom resources, and the fail-fast checks."""

import pytest

from rhymerl.config.run import load_config
from rhymerl.errors import ConfigError
from workers.actors import missing_resources, placement_for


def test_cpu_laptop_default_takes_no_gpus_and_no_custom_resources():
    p = placement_for(load_config(None), gpus_available=0)
    assert (p.worker_cpus, p.worker_gpus, p.trainer_cpus, p.trainer_gpus) == (1, 0, 0, 0)
    assert p.worker_resources == {} and p.trainer_resources == {}


def test_gpu_cluster_engines_take_tensor_parallel_gpus_trainer_one():
    cfg = load_config(None, ["rollout.tensor_parallel_size=2", "rollout.num_workers=3"])
    p = placement_for(cfg, gpus_available=8)
    assert (p.worker_gpus, p.trainer_gpus) == (2, 1)
    assert missing_resources(p, 3, {"GPU": 7.0}) == []  # 3 x 2 + 1 = 7 fits exactly
    (msg,) = missing_resources(p, 3, {"GPU": 6.0})
    assert "has 6 GPUs, the run needs 7" in msg and "placement.share_gpu" in msg


def test_custom_resources_pin_actors_and_shortage_is_named():
    cfg = load_config(None, ["placement.rollout_resource=rollout_node", "placement.trainer_resource=trainer_node"])
    p = placement_for(cfg, gpus_available=0)
    assert p.worker_resources == {"rollout_node": 1.0} and p.trainer_resources == {"trainer_node": 1.0}
    assert missing_resources(p, 2, {"rollout_node": 2.0, "trainer_node": 1.0}) == []
    (msg,) = missing_resources(p, 2, {"rollout_node": 1.0, "trainer_node": 1.0})
    assert "1 units of custom resource 'rollout_node', the run needs 2" in msg
    assert """ray start --resources '{"rollout_node": 2}'""" in msg


def test_share_gpu_halves_one_gpu_and_is_validated():
    cfg = load_config(None, ["rollout.num_workers=1", "placement.share_gpu=true",
                             "rollout.gpu_memory_utilization=0.4"])
    p = placement_for(cfg, gpus_available=1)
    assert (p.worker_gpus, p.trainer_gpus) == (0.5, 0.5) and missing_resources(p, 1, {"GPU": 1.0}) == []
    with pytest.raises(ConfigError, match="placement.share_gpu.*num_workers = 1"):
        load_config(None, ["rollout.num_workers=2", "placement.share_gpu=true", "rollout.gpu_memory_utilization=0.4"])
    with pytest.raises(ConfigError, match="placement.share_gpu.*<= 0.5"):
        load_config(None, ["rollout.num_workers=1", "placement.share_gpu=true"])


@pytest.mark.parametrize("bad", ["GPU", "CPU", "rollout node"])
def test_resource_names_that_cannot_work_are_refused(bad):
    with pytest.raises(ConfigError, match="placement.rollout_resource"):
        load_config(None, [f'placement.rollout_resource="{bad}"'])


def test_tensor_parallel_and_memory_utilisation_ranges():
    with pytest.raises(ConfigError, match="rollout.tensor_parallel_size"):
        load_config(None, ["rollout.tensor_parallel_size=0"])
    with pytest.raises(ConfigError, match="rollout.gpu_memory_utilization"):
        load_config(None, ["rollout.gpu_memory_utilization=1.5"])
