"""A run's settings, typed and frozen, and the checks on them.

- `options`: `option(default, help)`, a dataclass field that carries its help line.
- `fields`: typed dataclasses from nested dicts (TOML's layout), `key=value` overrides, flat keys.
- `run`: `RunConfig` and the component configs it composes; `load_config`.
- `spec`: HistoSpec's settings (`SpecConfig`, `spec.*`); `pipe`: HistoPipe's (`PipeConfig`, `pipe.*`).
- `environment`: the environment's settings that move a run from the embedded defaults to a cluster.
- `reference`: docs/configuration.md, written from the dataclasses (`python -m rhymerl.config.reference`).

Imports nothing, so importing one settings module loads only what that module needs.
"""
