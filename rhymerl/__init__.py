"""RhymeRL core: pure algorithms and small classes (no Prefect, Ray, MLflow or DuckDB).

- `errors`: the errors the core shares (`ConfigError`, ...); a leaf.
- `config/`: a run's settings (`RunConfig` and every component's config, HistoSpec's and HistoPipe's
  included), the environment's layer and the generated reference page; imports no other package.
- `data/`: the records that cross task and process boundaries, training problems (built-in,
  long-tail, dataset sources), prompts and chat rendering, and the rewards.
- `policy/`: the policy model, built, checked, evaluated, trained (GRPO, sharded), checkpointed and
  sent to the engines.
- `run/`: pure helpers of a run's loop: input checks, rollouts, resume, console, report, timing, heap.
- `histospec/`: history-drafted speculative decoding (drafting semantics, engine path, offline tools).
- `histopipe/`: length forecasts and rollout placement.
- `vllm/`: the vLLM adapter, the one package that imports vLLM.

Package `__init__` modules import nothing of the project, so importing a config class never loads an
engine (`histospec/__init__` only keeps numba's on-disk cache in step with its sources).
"""

__version__ = "0.1.0"
