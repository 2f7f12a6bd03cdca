"""The switchboard: environment settings that move a run from the embedded defaults to a cluster.

Two kinds of setting:

- `CONFIG_ENV`: environment variables that set a run-config key (`RHYMERL_LAKE` -> `lake.url`, ...).
  Precedence, highest first: a CLI flag (`--lake`) > `--set key=value` > the environment > the
  config file (`--config`, or a resumed run's stored config) > the dataclass default. An empty
  variable counts as unset, so `RHYMERL_LAKE= rhymerl run` is the same as not setting it.
- `PROCESS_ENV`: variables the libraries read themselves (Ray, Prefect, s3fs/boto3); RhymeRL only
  passes them through, and documents them here so one table names every setting.

Pure: reads only the mapping it is given (the CLI passes `os.environ`), so tests need no patching.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class EnvSetting:
    """One environment variable: the config key it sets ('' = read by a library) and what it does."""

    name: str
    key: str
    help: str


CONFIG_ENV: tuple[EnvSetting, ...] = (
    EnvSetting("RHYMERL_LAKE", "lake.url", "lake: local folder or s3://bucket/prefix (also the `rhymerl lake` default)"),
    EnvSetting("RHYMERL_MODEL", "model.path", "policy model: a local Hugging Face causal-LM directory"),
    EnvSetting("RHYMERL_DATASET", "data.dataset", "prompts: `builtin` or a GSM8K-format .jsonl/.parquet file"),
    EnvSetting("MLFLOW_TRACKING_URI", "tracking.uri", "MLflow store: sqlite:///file.db or http://server:5000"),
    EnvSetting("MLFLOW_EXPERIMENT_NAME", "tracking.experiment", "MLflow experiment the run is logged to"),
)

PROCESS_ENV: tuple[EnvSetting, ...] = (
    EnvSetting("RAY_ADDRESS", "", "Ray cluster to join (`host:6379`, `ray://host:10001`, `auto`); unset = local Ray"),
    EnvSetting("PREFECT_API_URL", "", "Prefect server (`http://host:4200/api`); unset = temporary local API"),
    EnvSetting("AWS_ENDPOINT_URL", "", "S3-compatible endpoint for an s3:// lake (MinIO); unset = AWS"),
    EnvSetting("AWS_ACCESS_KEY_ID", "", "S3 key id (or a profile / instance role)"),
    EnvSetting("AWS_SECRET_ACCESS_KEY", "", "S3 secret key; never printed or logged"),
    EnvSetting("AWS_DEFAULT_REGION", "", "S3 region (MinIO: any, e.g. us-east-1)"),
)

ALL_ENV: tuple[EnvSetting, ...] = CONFIG_ENV + PROCESS_ENV


def env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """The config keys the environment sets, as nested dicts (the TOML layout); empty values skipped."""
    out: dict[str, Any] = {}
    for s in CONFIG_ENV:
        value = environ.get(s.name, "")
        if value:
            section, name = s.key.split(".")
            out.setdefault(section, {})[name] = value
    return out


def env_sources(environ: Mapping[str, str]) -> dict[str, str]:
    """{config key: variable name} for each key the environment sets (for `--print-config`)."""
    return {s.key: s.name for s in CONFIG_ENV if environ.get(s.name, "")}


def merge(base: Mapping[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with every leaf of `layer` set on top (nested dicts merged, not replaced)."""
    out = dict(base)
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
