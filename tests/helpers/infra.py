"""Shared by the infra tests: the settings table of docs/cluster.md, YAML loading, the pod templates
of infra/k8s, and which config keys the cluster may set (the cluster layer's) and which it may not."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

from rhymerl.config.environment import ALL_ENV

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_LAYER = ROOT / "configs" / "cluster.toml"  # where the services are; never what to train
# Names that belong to the switchboard; any variable with these prefixes in infra/ must be one
# docs/cluster.md documents (catches a typo such as RHYMERL_LAKE_URL, which RhymeRL would ignore).
SWITCHBOARD_PREFIXES = ("RHYMERL_", "MLFLOW_TRACKING", "MLFLOW_EXPERIMENT", "AWS_", "RAY_ADDRESS",
                        "PREFECT_API_URL")


SETTINGS_DOC = ROOT / "docs" / "cluster.md"


def settings_table() -> dict[str, str]:
    """{variable: row} from docs/cluster.md's "Settings: one table" (rows starting with a `NAME`)."""
    text = SETTINGS_DOC.read_text()
    assert "\n## Settings: one table" in text, "docs/cluster.md lost its 'Settings: one table' section"
    section = text.split("\n## Settings: one table", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): line for line in section.splitlines()
            if (m := re.match(r"\|\s*`([A-Z][A-Z0-9_]+)`", line))}


def undocumented(names) -> set[str]:
    """Switchboard-looking variable names the settings table does not list."""
    table = settings_table()
    return {n for n in names if n.startswith(SWITCHBOARD_PREFIXES) and n not in table}


def load_yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def image_pinned(image: str) -> bool:
    """name:tag (or @digest) with a tag other than latest."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    """(owner, pod spec) for every pod template of infra/k8s: workloads, the RayCluster's groups and
    the Prefect job template's Job."""
    out = []
    for o in objects:
        name = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            out.append((name, o["spec"]["template"]["spec"]))
        elif o["kind"] == "RayCluster":
            out.append((f"{name}/head", o["spec"]["headGroupSpec"]["template"]["spec"]))
            out += [(f"{name}/{g['groupName']}", g["template"]["spec"]) for g in o["spec"]["workerGroupSpecs"]]
    manifest = job_template(objects)["job_configuration"]["job_manifest"]
    out.append(("prefect job template", manifest["spec"]["template"]["spec"]))
    return out


def job_template(objects: list[dict]) -> dict:
    """The Prefect worker's base job template (ConfigMap prefect-job-template), parsed."""
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "prefect-job-template"]
    return json.loads(cm["data"]["base-job-template.json"])


def run_configs() -> list[Path]:
    """The run configs the project ships: configs/*.toml but the cluster layer, and examples/*/config.toml."""
    return (sorted(p for p in (ROOT / "configs").glob("*.toml") if p != CLUSTER_LAYER)
            + sorted(ROOT.glob("examples/*/config.toml")))


def config_keys(path: Path) -> set[str]:
    """The dotted keys a TOML config file sets: `seed`, `model.path`, ..."""
    def walk(table: dict, prefix: str) -> set[str]:
        return {k for name, value in table.items()
                for k in (walk(value, f"{prefix}{name}.") if isinstance(value, dict) else {prefix + name})}
    return walk(tomllib.loads(path.read_text()), "")


def cluster_settings() -> set[str]:
    """The variables a cluster's shared environment may set: those read by the libraries (Ray,
    Prefect, S3) and those setting a key of the cluster layer. The rest (RHYMERL_MODEL, ...) would
    beat what every run config chooses."""
    layer = config_keys(CLUSTER_LAYER)
    return {s.name for s in ALL_ENV if not s.key or s.key in layer}
