"""vLLM's suffix decoding (Arctic Inference's suffix trees) as a comparison arm for HistoSpec.

`spec.method = "suffix"` runs vLLM's own `method="suffix"` proposer at its stock settings (drafts
verified by RhymeRL's exact verifier like every method); `rhymerl spec replay` replays the same
library's `SuffixDecodingCache` offline (`rhymerl.histospec.replay`) in the cache scopes of `SuffixArm`.

The library is `arctic-inference`, which `make setup` builds from its sdist (no wheel for this
platform). vLLM's `suffix` method only imports `arctic_inference.suffix_decoding`; the package's vLLM
plug-in (patches for CUDA) stays inert unless `ARCTIC_INFERENCE_ENABLED` is set, and nothing here
sets it. Imports are lazy: this module loads without the library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

INSTALL_HINT = ("arctic-inference (Arctic Inference's suffix trees, the engine of vLLM's `suffix` method) is not "
                "installed: run `make setup` (it builds arctic-inference==0.3.0 from source, ~1.5 min; "
                "`make arctic` retries only that step, log in .venv/arctic-inference-build.log)")

# vLLM 0.32's defaults for `method="suffix"` (vllm/config/speculative.py, suffix_decoding_*): "stock".
STOCK_TREE_DEPTH = 24
STOCK_CACHED_REQUESTS = 10_000
STOCK_SPEC_FACTOR = 1.0
STOCK_MIN_TOKEN_PROB = 0.1


class SuffixUnavailable(RuntimeError):
    """arctic-inference is missing; the message names the fix (`make setup`)."""


def has_arctic_inference() -> bool:
    """True when Arctic Inference's suffix cache can be imported."""
    try:
        require_arctic_inference()
    except SuffixUnavailable:
        return False
    return True


def require_arctic_inference() -> type:
    """`arctic_inference.suffix_decoding.SuffixDecodingCache`, or SuffixUnavailable naming `make setup`."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise SuffixUnavailable(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from None
    return SuffixDecodingCache


@dataclass(frozen=True)
class SuffixArm:
    """Which responses a replayed suffix cache holds, and its drafting knobs (vLLM's stock by default).

    scope "global": one cache for the whole run, fed every response in the order the run generated
    them (epoch, step), the newest `max_cached_requests` kept (FIFO; requests in flight count) — what
    one vLLM engine's stock cache holds when it serves every request. `cache_steps > 0` sizes it
    instead to that many training steps of finished responses plus the step in flight (steps of the
    records' median size): what a per-engine cache keeps at real scale, where an epoch's responses
    are spread over many engines and far outnumber any cache, so a prompt's own earlier responses
    are gone and only recent responses of other prompts and its siblings remain.
    scope "prompt": a fresh cache per group holding exactly HistoSpec's information — the prompt's
    responses from its last `spec.history_epochs` epochs plus its siblings as they grow.
    """

    scope: Literal["global", "prompt"] = "global"
    max_cached_requests: int = STOCK_CACHED_REQUESTS  # -1: unlimited
    cache_steps: float = 0.0  # > 0: size the global cache to this many steps' responses
    max_tree_depth: int = STOCK_TREE_DEPTH
    max_spec_factor: float = STOCK_SPEC_FACTOR
    min_token_prob: float = STOCK_MIN_TOKEN_PROB

    def __post_init__(self) -> None:
        if self.scope not in ("global", "prompt"):
            raise ValueError(f"SuffixArm.scope={self.scope!r}: use 'global' or 'prompt'")
        if self.max_cached_requests == 0 or self.max_cached_requests < -1:
            raise ValueError(f"SuffixArm.max_cached_requests={self.max_cached_requests}: use >= 1, or -1 "
                             "for no limit")
        if self.cache_steps < 0 or self.max_tree_depth < 1:
            raise ValueError("SuffixArm: cache_steps must be >= 0 and max_tree_depth >= 1")

    def new_cache(self, max_cached_requests: int | None = None) -> Any:
        """An empty `SuffixDecodingCache` of this depth (size: the argument, else the arm's)."""
        cache_cls = require_arctic_inference()
        size = self.max_cached_requests if max_cached_requests is None else max_cached_requests
        return cache_cls(max_tree_depth=self.max_tree_depth, max_cached_requests=size)


__all__ = ["INSTALL_HINT", "STOCK_CACHED_REQUESTS", "STOCK_MIN_TOKEN_PROB", "STOCK_SPEC_FACTOR",
           "STOCK_TREE_DEPTH", "SuffixArm", "SuffixUnavailable", "has_arctic_inference",
           "require_arctic_inference"]
