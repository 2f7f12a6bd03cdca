"""Fixtures the vLLM engine tests share: exported checkpoints of a tiny model and one engine on them.

An engine start is 20-60 s on 2 busy cores. `test_export_vllm` needs an engine started on an export
folder (`LLM(OUT)`); `test_engine_weight_sync` needs an engine of the same architecture whose
weights it then replaces in place. Both use one engine, started once for this folder's tests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

MAX_MODEL_LEN = 512  # the weight-sync tests prompt with 300 tokens


@dataclass(frozen=True)
class ExportEngine:
    """An engine started on the one-rank export, and its probe log-probs right after the start
    (before any test loaded other weights into it)."""

    engine: object  # rhymerl.vllm.engine.VllmEngine
    started_logprobs: list[float]


@pytest.fixture(scope="package")
def exports(tmp_path_factory):
    """`helpers.export.trained_exports`: ({"one-rank"|"two-rank": (folder, trainer's probe
    log-probs)}, probe ids), of a tiny Qwen2 (hidden 64, 2 layers, 512 positions)."""
    from helpers.export import trained_exports

    return trained_exports(tmp_path_factory.mktemp("export_vllm"), max_positions=MAX_MODEL_LEN)


@pytest.fixture(scope="package")
def export_engine(exports):
    """`LLM(OUT)` (through `VllmEngine`) on the one-rank export, for this folder's tests; a test
    that loads other weights into it must not rely on what an earlier test left there."""
    from rhymerl.vllm.engine import EngineSettings, VllmEngine
    from rhymerl.vllm.spec_guard import shutdown_llm

    found, ids = exports
    engine = VllmEngine(EngineSettings(str(found["one-rank"][0]), max_model_len=MAX_MODEL_LEN))
    try:
        yield ExportEngine(engine, engine.probe_logprobs(ids))
    finally:
        shutdown_llm(engine.llm)
