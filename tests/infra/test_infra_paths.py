"""Who chooses a run's model and data, and where the containers find them. One rule: a config names
what to train; the cluster (its layer configs/cluster.toml, the environment compose and Kubernetes
set) says where the services are.

Checked for infra/compose.yaml and infra/k8s/ without Docker or a cluster:
- the shared environment (compose's x-rhymerl-env, ConfigMap rhymerl-settings) sets no config key
  but the cluster layer's, and the layer none that a run config sets: with it, every run config of
  configs/ and examples/ resolves to its own model, data and experiment. A copy with RHYMERL_MODEL
  back fails both checks (the 7B config would train the 0.5B model);
- every RhymeRL container (the rhymerl images in compose, the pods reading rhymerl-settings) starts
  in the images' WORKDIR and finds each file a run config names by a relative path there: in the
  image, or on a read-only mount that hides none of the image's files. A copy mounting the models
  elsewhere fails;
- compose mounts the repository's own models/ and data/ (where a run on one machine reads them),
  Kubernetes the folders of those names on its volume, and docs/cluster.md names the mount points.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Mapping

import pytest
import yaml

from helpers.image import ImageFiles, image_files
from helpers.infra import (CLUSTER_LAYER, ROOT, SETTINGS_DOC, config_keys, load_yaml_docs, pod_specs,
                           run_configs)
from rhymerl.config.environment import CONFIG_ENV
from rhymerl.config.run import RunConfig, load_config
from rhymerl.config.task import BUILTIN_DATASETS

COMPOSE = ROOT / "infra" / "compose.yaml"
K8S = ROOT / "infra" / "k8s"
DOCKER = ROOT / "infra" / "docker"
RHYMERL_IMAGES = ("rhymerl-cpu:", "rhymerl-gpu:")
RUNS = run_configs()
SEVEN_B = ROOT / "configs" / "gpu-qwen2.5-7b.toml"
OLD_OVERRIDE = "  RHYMERL_MODEL: /opt/rhymerl/models/Qwen2.5-0.5B-Instruct\n"  # what a shared env once held


@dataclass(frozen=True)
class Mount:
    """A folder mounted into a container: where, from what (a host folder, or a folder of the volume)."""

    path: str
    source: str
    read_only: bool


def compose_value(value: str) -> str:
    """A compose value as a container gets it when the host sets none of its `${VAR:-default}`."""
    return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def compose_env(compose: dict) -> dict[str, str]:
    return {k: compose_value(str(v)) for k, v in compose["x-rhymerl-env"].items()}


def compose_mounts(compose: dict) -> dict[str, list[Mount]]:
    """{service: its mounts} for the services running a rhymerl image (short form `host:path[:ro]`)."""
    out = {}
    for name, svc in compose["services"].items():
        if svc.get("image", "").startswith(RHYMERL_IMAGES):
            parts = [compose_value(v).split(":") for v in svc.get("volumes", [])]
            out[name] = [Mount(p[1], p[0], p[2:] == ["ro"]) for p in parts]
    return out


def k8s_settings(objects: list[dict]) -> dict[str, str]:
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "rhymerl-settings"]
    return cm["data"]


def k8s_containers(objects: list[dict]) -> dict[str, dict]:
    """{owner: container} for every container that reads the switchboard: the RhymeRL pods."""
    return {f"{owner}/{c['name']}": c for owner, spec in pod_specs(objects) for c in spec["containers"]
            if {"name": "rhymerl-settings"} in [s.get("configMapRef") for s in c.get("envFrom", [])]}


def k8s_mounts(objects: list[dict]) -> dict[str, list[Mount]]:
    return {owner: [Mount(m["mountPath"], m.get("subPath", ""), bool(m.get("readOnly")))
                    for m in c.get("volumeMounts", [])] for owner, c in k8s_containers(objects).items()}


def env_overrides(env: Mapping[str, str]) -> dict[str, str]:
    """{variable: config key} for each variable of `env` that sets a key the cluster layer does not:
    a choice of what to train, which would beat every config file's."""
    layer = config_keys(CLUSTER_LAYER)
    return {s.name: s.key for s in CONFIG_ENV if s.name in env and s.key not in layer}


def wrong_choices(env: Mapping[str, str]) -> list[str]:
    """Each run config whose model, data or experiment differ once the cluster layer and `env` are on top."""
    out = []
    for path in RUNS:
        alone, there = load_config(path), load_config([path, CLUSTER_LAYER], env=env)
        for part in ("model", "data", "eval"):
            if getattr(alone, part) != getattr(there, part):
                out.append(f"{path.name}: {part} {getattr(alone, part)} became {getattr(there, part)}")
        if alone.tracking.experiment != there.tracking.experiment:
            out.append(f"{path.name}: experiment {alone.tracking.experiment!r} became {there.tracking.experiment!r}")
    return out


def named_files(cfg: RunConfig) -> list[str]:
    """The local files a config names by a relative path: its model and its datasets."""
    sources = [cfg.model.path]
    for dataset in (cfg.data.dataset, cfg.eval.dataset):
        sources += dataset if isinstance(dataset, (list, tuple)) else [dataset]
    return [s for s in sources if isinstance(s, str) and s and s not in BUILTIN_DATASETS
            and "://" not in s and not s.startswith("/")]


def unreachable(mounts: dict[str, list[Mount]], image: ImageFiles) -> list[str]:
    """'container: file' for each file a run config names that a container finds neither in its image
    nor on a read-only mount, looking from the image's WORKDIR."""
    out = []
    for owner, owned in mounts.items():
        for path in RUNS:
            for name in named_files(load_config(path)):
                full = posixpath.join(image.workdir, name)
                in_image = full in image.files or any(f.startswith(full + "/") for f in image.files)
                mounted = any(m.read_only and full.startswith(m.path.rstrip("/") + "/") for m in owned)
                if not (in_image or mounted):
                    out.append(f"{owner}: {path.name}'s {name}")
    return out


@pytest.fixture(scope="module")
def compose() -> dict:
    (doc,) = load_yaml_docs(COMPOSE)
    return doc


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return [d for f in sorted(K8S.glob("*.yaml")) if f.name != "kustomization.yaml" for d in load_yaml_docs(f)]


@pytest.fixture(scope="module")
def image() -> ImageFiles:
    return image_files(DOCKER / "cpu.Dockerfile", ROOT)


def test_the_cluster_layer_sets_no_key_a_run_config_sets():
    layer = config_keys(CLUSTER_LAYER)
    assert layer and not {k for k in layer if k.split(".")[0] in ("model", "data", "eval")}
    for path in RUNS:
        assert not layer & config_keys(path), f"configs/cluster.toml overrides {path.name}'s {layer & config_keys(path)}"


def test_the_shared_environment_chooses_nothing_a_config_chooses(compose, objects):
    for where, env in (("compose", compose_env(compose)), ("Kubernetes", k8s_settings(objects))):
        assert env_overrides(env) == {}, f"{where} sets {env_overrides(env)}"
        assert wrong_choices(env) == [], where


@pytest.mark.parametrize("where", ["compose", "Kubernetes"])
def test_an_environment_that_sets_the_model_again_fails_the_rule(where):
    path = COMPOSE if where == "compose" else K8S / "settings.yaml"
    text, anchor = path.read_text(), "  RHYMERL_LAKE: s3://rhymerl/lake\n"
    assert text.count(anchor) == 1
    docs = [d for d in yaml.safe_load_all(text.replace(anchor, anchor + OLD_OVERRIDE)) if d]
    env = compose_env(docs[0]) if where == "compose" else k8s_settings(docs)
    assert env_overrides(env) == {"RHYMERL_MODEL": "model.path"}
    # The harm it does: the 7B config, layered for the cluster, would train the 0.5B model.
    assert load_config([SEVEN_B, CLUSTER_LAYER], env=env).model.path.endswith("Qwen2.5-0.5B-Instruct")
    assert any(w.startswith("gpu-qwen2.5-7b.toml: model ") for w in wrong_choices(env))


def test_every_rhymerl_container_starts_in_the_images_workdir(compose, objects, image):
    assert image_files(DOCKER / "gpu.Dockerfile", ROOT).workdir == image.workdir == "/opt/rhymerl"
    assert len(compose_mounts(compose)) >= 3 and len(k8s_containers(objects)) >= 3
    for name in compose_mounts(compose):
        assert "working_dir" not in compose["services"][name], name
    for owner, container in k8s_containers(objects).items():
        assert "workingDir" not in container, owner


def test_every_file_a_config_names_is_in_the_image_or_mounted_read_only(compose, objects, image):
    mounts = {**compose_mounts(compose), **k8s_mounts(objects)}
    assert len(mounts) >= 6, sorted(mounts)  # 3 compose services, Ray head, GPU group, flow-run Jobs
    assert any(name.startswith("models/") for path in RUNS for name in named_files(load_config(path)))
    assert unreachable(mounts, image) == []
    for owner, owned in mounts.items():  # a mount hides nothing the image holds
        for m in owned:
            assert not any(f.startswith(m.path.rstrip("/") + "/") for f in image.files), f"{owner}: {m.path}"


def test_a_model_mounted_elsewhere_is_unreachable(compose, image):
    text = COMPOSE.read_text().replace(":/opt/rhymerl/models:ro", ":/models:ro")
    (moved,) = yaml.safe_load_all(text)
    found = unreachable(compose_mounts(moved), image)
    assert "prefect-worker: gpu-qwen2.5-7b.toml's models/Qwen2.5-7B-Instruct" in found
    assert not any("data/" in f for f in found)  # the data mount is untouched


def test_the_mounts_hold_the_folders_of_a_run_on_one_machine(compose, objects, image):
    # Compose mounts the repository's own models/ and data/; the Kubernetes volume has folders of the
    # same names. So models/X in a config is one file on a machine, in compose and in a pod.
    root = image.workdir + "/"
    for owner, owned in compose_mounts(compose).items():
        for m in owned:
            if m.path.startswith(root):
                assert (COMPOSE.parent / m.source).resolve() == ROOT / m.path[len(root):], f"{owner}: {m}"
    for owner, owned in k8s_mounts(objects).items():
        for m in owned:
            if m.path.startswith(root):
                assert m.source == m.path[len(root):], f"{owner}: {m}"


def test_the_docs_name_the_mount_points(compose, image):
    docs = SETTINGS_DOC.read_text()
    points = {m.path for owned in compose_mounts(compose).values() for m in owned}
    assert points >= {f"{image.workdir}/models", f"{image.workdir}/data"}
    for point in points:
        assert f"`{point}`" in docs, f"docs/cluster.md never names the mount point {point}"
