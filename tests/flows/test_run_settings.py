"""flows/run.py: the settings an epoch subflow runs under."""

from __future__ import annotations

from prefect.settings import get_current_settings

from tasks.setup import quiet_subflow


def test_epoch_subflows_run_without_a_heartbeat_thread_of_their_own():
    # Rule: Prefect joins a flow's heartbeat thread on exit while it sleeps out its second (~1 s
    # per epoch); epochs turn it off (the run flow's own heartbeat stays on).
    before = get_current_settings().flows.heartbeat_frequency
    quiet = quiet_subflow()
    for _ in range(2):  # the same settings, entered once per epoch
        with quiet():
            assert get_current_settings().flows.heartbeat_frequency is None
        assert get_current_settings().flows.heartbeat_frequency == before is not None
