"""Write examples/chat-reward/train.jsonl and eval.jsonl: built-in addition problems as chat messages,
with the gold sum and a per-row `tolerance` column that the plug-in reward (reward.py) reads.

Each row: {"messages": [{"role": "user", "content": "a=8 b=7 c=3"}], "answer": "18", "tolerance": 2}.
The tolerance grows with the number of additions (each one is a chance to slip). The evaluation
rows are other problems of the same kind, none of them a training prompt.

    PYTHONPATH=. python examples/chat-reward/make_data.py
"""

from __future__ import annotations

import json
from pathlib import Path

from rhymerl.data.builtin import ProblemSettings, builtin_problems, parse_terms

HERE = Path(__file__).parent
TRAIN, EVAL = 24, 8
SETTINGS = ProblemSettings(min_terms=2, max_terms=5)


def row(question: str) -> dict:
    terms = parse_terms(question)
    return {"messages": [{"role": "user", "content": question}], "answer": str(sum(terms)),
            "tolerance": len(terms) - 1}


def files() -> dict[Path, list[dict]]:
    """Each file this script writes, with its rows."""
    problems = builtin_problems(TRAIN + EVAL, seed=21, spec=SETTINGS)  # distinct questions
    return {HERE / "train.jsonl": [row(p.question) for p in problems[:TRAIN]],
            HERE / "eval.jsonl": [row(p.question) for p in problems[TRAIN:]]}


if __name__ == "__main__":
    for path, rows in files().items():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} rows to {path}")
