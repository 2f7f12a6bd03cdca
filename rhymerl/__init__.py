"""RhymeRL core: pure algorithms and small classes (no Prefect, Ray, MLflow or DuckDB).

- `errors`: the errors the core shares (`ConfigError`, ...); a leaf.
- `records`: small typed records that cross task and process boundaries; a leaf.
- `config/`: a run's settings (`RunConfig` and its component configs), the environment's layer, the
  generated reference page, and the pure preflight checks.
- `data/`: training problems (built-in, long-tail, dataset files), prompts, and the verifiable reward.
- `policy/`: the policy model, built, checked, evaluated, trained (GRPO, sharded), checkpointed and
  sent to the engines.
- `run/`: pure helpers of a run's loop: rollouts, resume, console, report, timing, heap.
- `histospec/`: history-drafted speculative decoding (drafting semantics, engine path, offline tools).
- `histopipe/`: length forecasts and rollout placement.
- `vllm/`: the vLLM adapter, the one package that imports vLLM.

Package `__init__` modules import nothing, so importing a config class never loads an engine.
"""

__version__ = "0.1.0"
