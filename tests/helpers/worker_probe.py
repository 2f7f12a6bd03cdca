"""Functions a test runs inside an engine's worker (`LLM.collective_rpc` with a callable).

vLLM ships a callable with cloudpickle; this module is registered to travel by value, so the
worker needs no import of the tests' modules.
"""

from __future__ import annotations

import sys

import cloudpickle


def count_draft_requests(worker) -> None:
    """Count the engine core's separate calls for a step's drafts (`take_draft_token_ids`, which
    the engine core calls by name on `worker`, vLLM's wrapper of the real worker)."""
    take = worker.take_draft_token_ids
    worker.rhymerl_draft_requests = 0

    def counted(*args, **kwargs):
        worker.rhymerl_draft_requests += 1
        return take(*args, **kwargs)

    worker.take_draft_token_ids = counted


def draft_requests(worker) -> int:
    """The count since `count_draft_requests`."""
    return worker.rhymerl_draft_requests


cloudpickle.register_pickle_by_value(sys.modules[__name__])
