"""rhymerl/vllm/idle.py: the vLLM plugin that stops idle engine workers spinning a core for a second."""

import importlib.metadata

from rhymerl.vllm.idle import IDLE_SPIN_S, quiet_idle_spin


def test_the_plugin_shortens_the_idle_spin_of_new_queue_readers():
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    saved = SpinCondition.__init__.__defaults__
    try:
        SpinCondition.__init__.__defaults__ = (1,)  # vLLM 0.32's own default
        assert quiet_idle_spin()
        assert SpinCondition.__init__.__defaults__ == (IDLE_SPIN_S,)
        assert quiet_idle_spin()  # loading it twice (every vLLM process loads plugins) is harmless
    finally:
        SpinCondition.__init__.__defaults__ = saved


def test_the_plugin_is_registered_where_vllm_looks():
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert names.get("rhymerl_idle_spin") == "rhymerl.vllm.idle:quiet_idle_spin", (
        "the vllm.general_plugins entry point is missing: reinstall the project (make setup)")
