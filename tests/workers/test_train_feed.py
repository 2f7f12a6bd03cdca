"""workers/train_feed.py: complete groups go to the trainer once, as the batch path would train
them; anything that makes the stream differ from the step's committed samples aborts it."""

from __future__ import annotations

import pytest

from helpers.feed import FakeTrainer
from rhymerl.data.records import Prompt, Sample
from rhymerl.data.rewards import load_reward_set
from rhymerl.run.rollout import train_examples
from workers.stream import Scoring
from workers.train_feed import GroupFeed

PROMPTS = [Prompt("a", 0, "a", (1, 2), answer="7", row={"answer": "7"}),
           Prompt("b", 1, "b", (3,), answer="5", row={"answer": "5"})]
SCORING = Scoring.of(load_reward_set(["gsm8k"]), PROMPTS)


def sample(pid: str, k: int, text: str) -> Sample:
    return Sample(pid, k, (4 + k, 5), (-0.1, -0.2), text, "stop", 0, 0.0, 1.0)


# Arrival order interleaves the groups: a0 b0 a1 completes "a", b1 then completes "b".
SAMPLES = [sample("a", 0, "#### 7"), sample("b", 0, "#### 5"), sample("a", 1, "no"), sample("b", 1, "#### 4")]
SCORES = SCORING.score(SAMPLES)


def fed(trainer: FakeTrainer, samples=SAMPLES) -> GroupFeed:
    feed = GroupFeed(trainer, PROMPTS, n=2, scale=True, eps=1e-6, scoring=SCORING)
    feed.begin()
    for s in samples:
        feed.finished(s)
    return feed


def test_each_group_goes_over_once_complete_as_the_batch_path_trains_it(local_ray):
    trainer = FakeTrainer()
    feed = fed(trainer)
    assert trainer.names() == ["begin", "add", "add"]
    # Rule: a streamed example equals the batch path's example of the same sample.
    batch = dict(zip([(s.prompt_id, s.sample_idx) for s in SAMPLES],
                     train_examples(PROMPTS, SAMPLES, [r.total for r in SCORES], True, 1e-6)))
    first, second = trainer.added()
    assert first == [batch[("a", 0)], batch[("a", 1)]] and second == [batch[("b", 0)], batch[("b", 1)]]
    assert first[0].advantage == pytest.approx(0.5 / 0.5 ** 0.5, rel=1e-5)  # rewards 1, 0: (1 - mean) / (std + eps)
    assert feed.finish(SAMPLES, SCORES) == {"loss": 0.5}
    assert trainer.calls[-1] == ("finish", 4) and not feed.broken


def test_an_incomplete_group_is_not_handed(local_ray):
    trainer = FakeTrainer()
    feed = fed(trainer, SAMPLES[:3])
    assert len(trainer.added()) == 1
    assert feed.finish(SAMPLES, SCORES) is None  # the step has a group the trainer lacks
    assert trainer.names()[-1] == "abort"


@pytest.mark.parametrize("why", ["retry", "discard", "other rows", "other rewards", "trainer"])
def test_the_stream_aborts_when_it_cannot_be_the_steps_update(local_ray, why):
    trainer = FakeTrainer(incomplete=why == "trainer")
    feed = fed(trainer)
    samples, scores = list(SAMPLES), list(SCORES)
    if why == "retry":  # the rollout task ran again: the trainer may hold the first attempt's groups
        feed.begin()
    elif why == "discard":  # a worker died after its samples finished
        feed.discard([("a", 0)])
    elif why == "other rows":  # the lake held rows committed before, same keys, other tokens
        samples[0] = Sample("a", 0, (9, 9), (-0.1, -0.2), "#### 7", "stop", 0, 0.0, 1.0)
    elif why == "other rewards":
        scores[3] = SCORES[0]
    assert feed.finish(samples, scores) is None
    assert trainer.names()[-1] == "abort" and feed.broken
    assert trainer.names().count("finish") == (1 if why == "trainer" else 0)
