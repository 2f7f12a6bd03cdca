"""A run's history as flat columns, and the history bundle a rollout worker's drafter reads.

The history travels DuckDB -> Arrow -> `HistoryColumns` -> bundle bytes -> `HistoryBundle` with no
Python object per token. Every prompt asked for is in the bundle, with or without history: the
drafter recognises only bundled prompts. Bytes: an .npz of `prompt_lens`, `prompt_tokens`,
`num_responses`, `response_lens`, `response_tokens` (int32) and `rewards` (float64).
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from rhymerl.config.spec import SpecConfig
from rhymerl.data.records import Prompt


@dataclass(frozen=True)
class BundleInfo:
    """What a bundle holds (for logs, MLflow and the steps table)."""
    prompts: int
    prompts_with_history: int
    responses: int
    tokens: int  # response tokens in the bundle
    bytes: int
    build_s: float

    def as_metrics(self, prefix: str = "spec/history_") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class PromptHistory:
    """One prompt and its earlier responses (oldest first), one reward each: a bundle's entry."""
    prompt_token_ids: tuple[int, ...]
    responses: tuple[tuple[int, ...], ...] = ()
    rewards: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if len(self.rewards) != len(self.responses):
            raise ValueError(f"PromptHistory has {len(self.responses)} responses but "
                             f"{len(self.rewards)} rewards; give one reward per response")
        if not self.prompt_token_ids:
            raise ValueError("PromptHistory needs the prompt's token ids (got an empty prompt)")


class HistoryBundle:
    """Prompts and their histories as flat arrays; the arrays of one prompt's history are views."""
    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.prompt_lens = np.asarray(arrays["prompt_lens"], np.int64)
        self.prompt_tokens = np.asarray(arrays["prompt_tokens"])
        self.num_responses = np.asarray(arrays["num_responses"], np.int64)
        self.response_lens = np.asarray(arrays["response_lens"], np.int64)
        self.response_tokens = np.asarray(arrays["response_tokens"])
        self.rewards = np.asarray(arrays["rewards"], np.float64)
        self._p = np.concatenate(([0], np.cumsum(self.prompt_lens)))  # prompt k: tokens _p[k]:_p[k+1]
        self._r = np.concatenate(([0], np.cumsum(self.num_responses)))  # its responses: _r[k]:_r[k+1]
        self._t = np.concatenate(([0], np.cumsum(self.response_lens)))  # response i: tokens _t[i]:_t[i+1]

    @classmethod
    def of(cls, prompts: Sequence[PromptHistory]) -> "HistoryBundle":
        """A bundle of Python records (tests, benchmarks)."""
        responses = [r for p in prompts for r in p.responses]
        return cls({"prompt_lens": [len(p.prompt_token_ids) for p in prompts],
                    "prompt_tokens": _ints(t for p in prompts for t in p.prompt_token_ids),
                    "num_responses": [len(p.responses) for p in prompts],
                    "response_lens": [len(r) for r in responses],
                    "response_tokens": _ints(t for r in responses for t in r),
                    "rewards": [x for p in prompts for x in p.rewards]})

    @classmethod
    def from_bytes(cls, blob: bytes) -> "HistoryBundle":
        with np.load(io.BytesIO(blob)) as z:
            return cls({k: z[k] for k in z.files})

    def to_bytes(self) -> bytes:
        return _npz(prompt_lens=self.prompt_lens, prompt_tokens=self.prompt_tokens.astype(np.int32),
                    num_responses=self.num_responses, response_lens=self.response_lens,
                    response_tokens=self.response_tokens.astype(np.int32), rewards=self.rewards).tobytes()

    def __len__(self) -> int:
        return len(self.prompt_lens)

    def prompt(self, k: int) -> np.ndarray:
        """Prompt k's token ids."""
        return self.prompt_tokens[self._p[k]:self._p[k + 1]]

    def history(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Prompt k's responses, oldest first: (tokens one after another, lengths, rewards)."""
        a, b = self._r[k], self._r[k + 1]
        return self.response_tokens[self._t[a]:self._t[b]], self.response_lens[a:b], self.rewards[a:b]


def _ints(values: Any) -> np.ndarray:
    return np.fromiter(values, dtype=np.int32)


def _npz(**arrays: np.ndarray) -> np.ndarray:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return np.frombuffer(buf.getbuffer(), dtype=np.uint8)


@dataclass(frozen=True)
class HistoryColumns:
    """Row i: prompt `prompt_ids[i]`'s response `tokens[offsets[i]:offsets[i + 1]]`, reward `rewards[i]`.
    A prompt's rows keep their order (oldest first) but need not be adjacent."""
    prompt_ids: np.ndarray  # (R,) str objects
    offsets: np.ndarray  # (R + 1,) int64
    tokens: np.ndarray  # (T,) int32
    rewards: np.ndarray  # (R,) float64; a NULL reward is 0

    def __post_init__(self) -> None:
        r = len(self.prompt_ids)
        if len(self.offsets) != r + 1 or len(self.rewards) != r or int(self.offsets[-1]) != len(self.tokens):
            raise ValueError(f"history columns disagree: {r} prompt ids, {len(self.offsets)} offsets, "
                             f"{len(self.rewards)} rewards, {len(self.tokens)} tokens")

    @classmethod
    def empty(cls) -> "HistoryColumns":
        return cls(np.empty(0, dtype=object), np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int32),
                   np.empty(0, dtype=np.float64))

    @classmethod
    def from_arrow(cls, table: Any) -> "HistoryColumns":
        """From an Arrow table with `prompt_id`, `response_token_ids` and `reward` (zero-copy if one int32 chunk)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if table.num_rows == 0:
            return cls.empty()
        column = table.column("response_token_ids")
        lists = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        if lists.null_count:  # a NULL list holds no tokens: an empty one
            lists = pc.if_else(pc.is_null(lists), pa.scalar([], lists.type), lists)
        offsets = lists.offsets.to_numpy().astype(np.int64)
        values = lists.values.to_numpy(zero_copy_only=False)
        tokens = values[offsets[0]:offsets[-1]].astype(np.int32, copy=False)
        rewards = pc.fill_null(table.column("reward").combine_chunks(), 0.0).to_numpy(zero_copy_only=False)
        return cls(table.column("prompt_id").to_numpy(zero_copy_only=False).astype(object),
                   offsets - offsets[0], tokens, rewards.astype(np.float64, copy=False))

    @classmethod
    def from_lists(cls, columns: Mapping[str, Sequence[Any]]) -> "HistoryColumns":
        """From Python columns `prompt_id`, `response_token_ids`, `reward` (tests, benchmarks)."""
        ids, responses = columns.get("prompt_id", ()), columns.get("response_token_ids", ())
        rewards = columns.get("reward", ())
        if not len(ids) == len(responses) == len(rewards):
            raise ValueError(f"history columns differ in length: prompt_id {len(ids)}, "
                             f"response_token_ids {len(responses)}, reward {len(rewards)}")
        lens = np.asarray([len(r or ()) for r in responses], dtype=np.int64)
        tokens = np.fromiter((t for r in responses for t in (r or ())), dtype=np.int32, count=int(lens.sum()))
        return cls(np.asarray(list(ids), dtype=object), np.concatenate(([0], np.cumsum(lens))), tokens,
                   np.asarray([float(x or 0.0) for x in rewards], dtype=np.float64))

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def rows_by_prompt(self) -> dict[str, np.ndarray]:
        """Row indices of each prompt, in row order."""
        if not len(self):
            return {}
        uniq, codes = np.unique(self.prompt_ids.astype(str), return_inverse=True)
        order = np.argsort(codes, kind="stable")
        cuts = np.flatnonzero(np.diff(codes[order])) + 1
        return {str(uniq[codes[g[0]]]): g for g in np.split(order, cuts)}

    def merged(self, warm: "HistoryColumns") -> "HistoryColumns":
        """These rows, plus `warm`'s rows of prompts that have none here (own history wins)."""
        rows = np.flatnonzero(~np.isin(warm.prompt_ids.astype(str), self.prompt_ids.astype(str)))
        tokens, lens = _gather(warm, rows)
        return HistoryColumns(np.concatenate((self.prompt_ids, warm.prompt_ids[rows])),
                              np.concatenate((self.offsets, self.offsets[-1] + np.cumsum(lens))),
                              np.concatenate((self.tokens, tokens)),
                              np.concatenate((self.rewards, warm.rewards[rows])))


def _gather(cols: HistoryColumns, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of `rows` one after another (one numpy gather) and their lengths."""
    starts = cols.offsets[rows]
    lens = cols.offsets[rows + 1] - starts
    total = int(lens.sum())
    if not total:
        return np.empty(0, dtype=np.int32), lens
    shift = np.repeat(starts - (np.cumsum(lens) - lens), lens)  # row start minus its place in the output
    return cols.tokens[shift + np.arange(total)], lens


class HistorySlicer:
    """Bundles for any set of prompts from one history: rows grouped by prompt once, then gathered."""
    def __init__(self, columns: HistoryColumns) -> None:
        self.columns = columns
        self.rows = columns.rows_by_prompt()
        self._prompt_tokens: dict[str, np.ndarray] = {}

    def bundle(self, prompts: Sequence[Prompt]) -> tuple[np.ndarray, BundleInfo]:
        """`prompts` (each once, in order) with their history as `HistoryBundle` bytes in a uint8 array
        (zero-copy through Ray), and what it holds. Empty responses are left out."""
        t0 = time.perf_counter()
        none = np.empty(0, dtype=np.int64)
        rows = [self.rows.get(p.prompt_id, none) for p in prompts]
        rows = [r[self.columns.offsets[r + 1] > self.columns.offsets[r]] for r in rows]
        flat = np.concatenate(rows) if rows else none
        tokens, lens = _gather(self.columns, flat)
        blob = _npz(prompt_lens=np.asarray([len(p.token_ids) for p in prompts], dtype=np.int64),
                    prompt_tokens=np.concatenate([self._tokens(p) for p in prompts]) if prompts
                    else np.empty(0, dtype=np.int32),
                    num_responses=np.asarray([len(r) for r in rows], dtype=np.int64),
                    response_lens=lens.astype(np.int64, copy=False),
                    response_tokens=tokens.astype(np.int32, copy=False), rewards=self.columns.rewards[flat])
        info = BundleInfo(prompts=len(prompts), prompts_with_history=sum(1 for r in rows if len(r)),
                          responses=len(flat), tokens=len(tokens), bytes=blob.nbytes,
                          build_s=time.perf_counter() - t0)
        return blob, info

    def _tokens(self, p: Prompt) -> np.ndarray:
        got = self._prompt_tokens.get(p.prompt_id)
        if got is None:
            got = self._prompt_tokens[p.prompt_id] = np.asarray(p.token_ids, dtype=np.int32)
        return got


def total_info(infos: Sequence[BundleInfo]) -> BundleInfo:
    """Several bundles' contents summed (a step's bundles over its workers)."""
    return BundleInfo(**{k: sum(getattr(i, k) for i in infos) for k in BundleInfo.__dataclass_fields__})


def bundle_for_epoch(prompts: Sequence[Prompt], history: Mapping[str, Sequence[Any]]) -> tuple[bytes, BundleInfo]:
    """`HistorySlicer.bundle` from Python columns `prompt_id`, `response_token_ids`, `reward`."""
    blob, info = HistorySlicer(HistoryColumns.from_lists(history)).bundle(prompts)
    return blob.tobytes(), info


def uses_bundle(spec: SpecConfig) -> bool:
    """True when the engine's drafter is HistoSpec's and so needs a bundle each step."""
    return spec.enabled and spec.method == "histospec"


def counted_by_vllm(spec: SpecConfig) -> bool:
    """Whether acceptance counts come from vLLM's metrics (its own drafters without the goodput
    controller, which counts them otherwise: needs `log_stats`)."""
    return spec.enabled and spec.method in ("ngram", "suffix") and not spec.cost_aware
