"""`rhymerl spec replay` on a small rhyming lake, its figures pinned: a refactor of HistoSpec must
draft exactly as before (same steps, tokens, drafted and accepted counts per setting and epoch)."""

from __future__ import annotations

import json
import random

import pytest

from cli.main import main
from helpers.marks import needs_arctic
from rhymerl.policy.build import build_tokenizer
from rhymerl.data.records import prompt_id_of
from storage.lake import LakeWriter, rows_to_table

RUN = "pinned"
PROMPTS, SAMPLES, LENGTH, EPOCHS, VOCAB = 3, 4, 48, 3, 40


def _responses(rng: random.Random) -> dict[int, list[list[list[int]]]]:
    """[epoch][prompt] -> SAMPLES responses: each prompt has a template from a small vocabulary (so
    n-grams recur inside and across responses); every sample changes ~15% of its tokens."""
    templates = [[rng.randrange(VOCAB) for _ in range(LENGTH)] for _ in range(PROMPTS)]
    out: dict[int, list[list[list[int]]]] = {}
    for epoch in range(EPOCHS):
        out[epoch] = [[[t if rng.random() > 0.15 else rng.randrange(VOCAB) for t in templates[p]]
                       for _ in range(SAMPLES)] for p in range(PROMPTS)]
    return out


def _write_lake(url: str) -> str:
    tok = build_tokenizer()
    texts = [f"question {i}: say it again\n" for i in range(PROMPTS)]
    ids = [prompt_id_of(tok.encode(t, add_special_tokens=False)) for t in texts]
    responses = _responses(random.Random(7))
    w = LakeWriter(url)
    w.write_run(RUN, "pinned-replay-test", {"epochs": EPOCHS})
    for epoch in range(EPOCHS):
        for step in (0, 1):  # two training steps per epoch: prompts 0-1, then prompt 2
            rows = [{"run_id": RUN, "epoch": epoch, "step": step, "prompt_id": ids[p], "sample_idx": k,
                     "prompt_text": texts[p], "reward": float((k + p) % 2), "response_token_ids": tokens,
                     "length": len(tokens)}
                    for p in range(PROMPTS) if (p < 2) == (step == 0)
                    for k, tokens in enumerate(responses[epoch][p])]
            w.commit_step(RUN, epoch, step, [w.write_rollouts(RUN, epoch, step, 0, 0, rows_to_table(rows))])
    return url


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _write_lake(str(tmp_path_factory.mktemp("pinned") / "lake"))


def _figures(capsys: pytest.CaptureFixture, lake: str, *argv: str) -> dict[tuple[str, str], tuple]:
    code = main(["spec", "replay", "--lake", lake, "--run", RUN, "--format", "json", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return {(r["setting"], str(r["epoch"])): (r["steps"], r["tokens"], r["drafted"], r["accepted"],
                                              round(r["mean_accepted_length"], 6), round(r["acceptance_rate"], 6))
            for r in json.loads(out)}


# (setting, epoch) -> (steps, tokens, drafted, accepted, tokens per verification, acceptance), measured
# on the drafter before it was restructured
WITHOUT_TREE: dict[tuple[str, str], tuple] = {
    ('histospec', '0'): (553, 564, 665, 11, 1.019892, 0.016541),
    ('histospec', '1'): (267, 564, 1169, 297, 2.11236, 0.254063),
    ('histospec', '2'): (248, 564, 1028, 316, 2.274194, 0.307393),
    ('histospec', 'all'): (1068, 1692, 2862, 624, 1.58427, 0.218029),
    ('histospec-no-siblings', '0'): (564, 564, 84, 0, 1.0, 0.0),
    ('histospec-no-siblings', '1'): (273, 564, 1232, 291, 2.065934, 0.236201),
    ('histospec-no-siblings', '2'): (255, 564, 1153, 309, 2.211765, 0.267997),
    ('histospec-no-siblings', 'all'): (1092, 1692, 2469, 600, 1.549451, 0.243013),
    ('histospec-reward', '0'): (553, 564, 665, 11, 1.019892, 0.016541),
    ('histospec-reward', '1'): (267, 564, 1172, 297, 2.11236, 0.253413),
    ('histospec-reward', '2'): (246, 564, 1022, 318, 2.292683, 0.311155),
    ('histospec-reward', 'all'): (1066, 1692, 2859, 626, 1.587242, 0.218958),
    ('ngram', '0'): (558, 564, 3278, 6, 1.010753, 0.00183),
    ('ngram', '1'): (555, 564, 3174, 9, 1.016216, 0.002836),
    ('ngram', '2'): (556, 564, 3139, 8, 1.014388, 0.002549),
    ('ngram', 'all'): (1669, 1692, 9591, 23, 1.013781, 0.002398),
}
WITH_TREE: dict[tuple[str, str], tuple] = {
    ('histospec', '0'): (544, 564, 1688, 20, 1.036765, 0.011848),
    ('histospec', '1'): (261, 564, 1678, 303, 2.16092, 0.180572),
    ('histospec', '2'): (250, 564, 1638, 314, 2.256, 0.191697),
    ('histospec', 'all'): (1055, 1692, 5004, 637, 1.603791, 0.127298),
    ('suffix', '0'): (545, 564, 493, 19, 1.034862, 0.03854),
    ('suffix', '1'): (307, 564, 710, 257, 1.837134, 0.361972),
    ('suffix', '2'): (300, 564, 740, 264, 1.88, 0.356757),
    ('suffix', 'all'): (1152, 1692, 1943, 540, 1.46875, 0.277921),
    ('suffix-step', '0'): (545, 564, 493, 19, 1.034862, 0.03854),
    ('suffix-step', '1'): (536, 564, 561, 28, 1.052239, 0.049911),
    ('suffix-step', '2'): (532, 564, 551, 32, 1.06015, 0.058076),
    ('suffix-step', 'all'): (1613, 1692, 1605, 79, 1.048977, 0.049221),
}


# The drafting rules the figures were measured under (the defaults then): long own drafts and the tree.
PINNED_RULES = ("min_token_prob=0.0", "max_spec_factor=2.0", "max_match=7", "recent_spec_factor=4.0")


def test_replay_without_the_tree_is_pinned(lake: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: the prompt's own index, siblings and n-gram lookup draft exactly as before.
    got = _figures(capsys, lake, "--settings", "histospec", "histospec-no-siblings", "histospec-reward", "ngram",
                   "--set", "recent_responses=0", *PINNED_RULES)
    assert got == WITHOUT_TREE


@needs_arctic
def test_replay_with_the_tree_and_suffix_arms_is_pinned(lake: str, capsys: pytest.CaptureFixture) -> None:
    # Rule: the default HistoSpec (with the cross-prompt tree) and the suffix arms draft exactly as before.
    got = _figures(capsys, lake, "--settings", "histospec", "suffix", "suffix-step",
                   "--set", "recent_responses=512", *PINNED_RULES)
    assert got == WITH_TREE
