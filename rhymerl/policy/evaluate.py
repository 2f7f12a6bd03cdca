"""Evaluating a built model with a small torch sampler: accuracy, format rate and length by bucket
(recorded in the build's info; `rhymerl.policy.build` runs it after training)."""

from __future__ import annotations

from typing import Iterable, Protocol

import torch

from rhymerl.data.builtin import ANSWER_MARKER
from rhymerl.data.records import Problem


class EvalRecipe(Protocol):
    """What `evaluate` reads of a build recipe (`rhymerl.policy.build.BuildSettings` and its kin)."""

    eval_max_tokens: int

    def eval_groups(self) -> Iterable[list[Problem]]: ...

    def bucket(self, problem: Problem) -> tuple[str, int | str]: ...


@torch.no_grad()
def sample_responses(model, tokenizer, questions: list[str], max_tokens: int = 160,
                     temperature: float = 1.0, seed: int = 0) -> list[str]:
    """Sample one response per question (prompt = question + "\\n"), cut at EOS; a small torch sampler."""
    torch.manual_seed(seed)
    enc = tokenizer([q + "\n" for q in questions], return_tensors="pt", padding=True,
                    add_special_tokens=False)
    # top_k=0 turns off generate()'s default top-k of 50: we want the model's full distribution.
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    out = model.generate(**enc, max_new_tokens=max_tokens, **(sampling if temperature > 0 else {}),
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    new = out[:, enc["input_ids"].shape[1]:]
    texts = []
    for row in new.tolist():
        if tokenizer.eos_token_id in row:
            row = row[:row.index(tokenizer.eos_token_id)]
        texts.append(tokenizer.decode(row))
    return texts


def final_answer(text: str) -> str | None:
    """The text after the last "#### " marker, or None when the response has none."""
    if ANSWER_MARKER not in text:
        return None
    return text.rsplit(ANSWER_MARKER, 1)[1].strip()


def evaluate(model, tokenizer, spec: EvalRecipe, temperature: float = 1.0, seed: int = 7) -> dict:
    """Accuracy, format rate and mean response length (chars) on fresh problems, by term count."""
    problems, texts = [], []
    for group in spec.eval_groups():
        problems += group
        texts += sample_responses(model, tokenizer, [p.question for p in group],
                                  spec.eval_max_tokens, temperature, seed)
    correct = [final_answer(t) == p.answer for p, t in zip(problems, texts)]
    by_bucket: dict[int | str, list[bool]] = {}
    for p, ok in zip(problems, correct):
        by_bucket.setdefault(spec.bucket(p)[1], []).append(ok)
    name = spec.bucket(problems[0])[0]
    return {
        "temperature": temperature,
        "accuracy": sum(correct) / len(problems),
        "format_rate": sum(final_answer(t) is not None for t in texts) / len(problems),
        "exact_solution_rate": sum(t == p.solution for p, t in zip(problems, texts)) / len(problems),
        "mean_response_chars": sum(len(t) for t in texts) / len(texts),
        f"accuracy_by_{name}": {k: sum(v) / len(v) for k, v in sorted(by_bucket.items())},
        f"count_by_{name}": {k: len(v) for k, v in sorted(by_bucket.items())},
    }
