"""Each worker's HistoSpec history for a step (`workers/history_bundles.py`): only the prompts the plan
places on it; a migrated request's prompt joins its new worker's bundle (the Ray part is tested
with the stream driver's fakes in test_stream_driver.py)."""

from __future__ import annotations

from rhymerl.histospec.bundle import HistoryBundle, HistoryColumns, HistorySlicer, bundle_for_epoch
from rhymerl.data.records import Prompt, prompt_id_of
from workers.history_bundles import cut_for_workers


def _prompt(ids: tuple[int, ...]) -> Prompt:
    return Prompt(prompt_id=prompt_id_of(ids), index=0, text="", token_ids=ids, answer="1")


A, B, C, D = (_prompt((10 + i,)) for i in range(4))
ROWS = {"prompt_id": [p.prompt_id for p in (A, A, B, C, D) for _ in range(2)],
        "response_token_ids": [[i] * (5 + i) for i in range(10)], "reward": [1.0] * 10}


def _prompts_in(blob) -> list[int]:
    fb = HistoryBundle.from_bytes(blob.tobytes())
    return [int(fb.prompt(k)[0]) for k in range(len(fb))]


def test_each_worker_gets_exactly_the_prompts_placed_on_it():
    # Rule: worker w's bundle holds placement[w]'s prompts once each (a tier-2 group split over two
    # workers goes to both; a prompt listed twice once), and nothing of the others'.
    slicer = HistorySlicer(HistoryColumns.from_lists(ROWS))
    step = cut_for_workers(slicer, [[A, C, A], [B, A], []])
    assert [_prompts_in(b) for b in step.blobs] == [[10, 12], [11, 10], []]
    assert [[p.prompt_id for p in h] for h in step.held] == [[A.prompt_id, C.prompt_id],
                                                              [B.prompt_id, A.prompt_id], []]
    assert [i.responses for i in step.infos] == [6, 6, 0]  # A has 4 rows, B 2, C 2


def test_a_workers_bundle_is_smaller_than_the_epochs():
    # Rule: the per-worker bundles of a step are a cut of the epoch's: together they hold each of
    # the step's prompts' history once (no split group here), each a fraction of the epoch bundle.
    slicer = HistorySlicer(HistoryColumns.from_lists(ROWS))
    step = cut_for_workers(slicer, [[A], [B]])
    epoch, epoch_info = bundle_for_epoch([A, B, C, D], ROWS)
    assert all(b.nbytes < len(epoch) for b in step.blobs)
    assert sum(i.tokens for i in step.infos) == sum(5 + i for i in range(6)) < epoch_info.tokens
    m = step.metrics()
    assert m["spec/history_tokens"] == 45 and m["spec/history_bytes_max_worker"] == max(b.nbytes for b in step.blobs)
