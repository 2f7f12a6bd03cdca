"""infra/k8s/: the manifests parse, and what a cluster would reject or misplace is caught here.

Checked without a cluster: every object has apiVersion/kind/metadata.name and the rhymerl
namespace; kustomization lists every file; the GPU worker group asks for GPUs (requests equal to
limits, as Kubernetes requires for extended resources) and the head for none; images are pinned;
Deployments select their own pods and Services select a Deployment's pods; every ConfigMap,
Secret and PVC a pod refers to is created here or documented as the user's; the variables are those
of docs/cluster.md; the model and dataset paths are compose's and the docs', and mounted where read. What a live cluster adds (CRDs installed, storage classes, GPUs present) is not checked.
"""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from helpers.infra import ROOT, SETTINGS_DOC, image_pinned, load_yaml_docs, settings_table, undocumented
from rhymerl.config.environment import CONFIG_ENV

K8S = ROOT / "infra" / "k8s"
COMPOSE = ROOT / "infra" / "compose.yaml"
PATH_SETTINGS = ("RHYMERL_MODEL", "RHYMERL_DATASET")  # files the pods read from their mounts
USER_SECRETS = {"rhymerl-s3": {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"},
                "rhymerl-db": {"MLFLOW_BACKEND_STORE_URI"}}  # created by the user (docs/cluster.md)
CLUSTER_SCOPED = {"Namespace"}


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    files = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert files, "infra/k8s has no manifests"
    return [d for f in files for d in load_yaml_docs(f)]


def _by_kind(objects, kind) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def _pod_specs(objects) -> list[tuple[str, dict]]:
    """(owner, pod spec) for every pod template, the RayCluster groups and the Prefect job template."""
    out = []
    for o in objects:
        name = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            out.append((name, o["spec"]["template"]["spec"]))
        elif o["kind"] == "RayCluster":
            out.append((f"{name}/head", o["spec"]["headGroupSpec"]["template"]["spec"]))
            out += [(f"{name}/{g['groupName']}", g["template"]["spec"]) for g in o["spec"]["workerGroupSpecs"]]
    manifest = _job_template(objects)["job_configuration"]["job_manifest"]
    out.append(("prefect job template", manifest["spec"]["template"]["spec"]))
    return out


def _job_template(objects) -> dict:
    (cm,) = [o for o in _by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "prefect-job-template"]
    return json.loads(cm["data"]["base-job-template.json"])


def _settings(objects) -> dict[str, str]:
    (cm,) = [o for o in _by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "rhymerl-settings"]
    return cm["data"]


def test_every_object_has_what_the_api_server_requires(objects):
    for o in objects:
        assert o.get("apiVersion") and o.get("kind"), o
        meta = o.get("metadata") or {}
        assert meta.get("name"), f"{o['kind']} without metadata.name"
        if o["kind"] not in CLUSTER_SCOPED:
            assert meta.get("namespace") == "rhymerl", f"{o['kind']}/{meta['name']} outside namespace rhymerl"


def test_kustomization_applies_every_file():
    (kust,) = load_yaml_docs(K8S / "kustomization.yaml")
    listed = set(kust["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_gpu_worker_group_requests_gpus_and_the_head_does_not(objects):
    (ray,) = _by_kind(objects, "RayCluster")
    assert ray["apiVersion"] == "ray.io/v1"
    head = ray["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in head.get("limits", {}) and ray["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    (gpu,) = [g for g in ray["spec"]["workerGroupSpecs"] if g["groupName"] == "gpu"]
    assert gpu["minReplicas"] <= gpu["replicas"] <= gpu["maxReplicas"]
    res = gpu["template"]["spec"]["containers"][0]["resources"]
    # Extended resources must be requested and limited alike, or the API server refuses the pod.
    assert int(res["requests"]["nvidia.com/gpu"]) >= 1
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"]
    assert gpu["template"]["spec"]["containers"][0]["image"].startswith("rhymerl-gpu:")


def test_ray_version_matches_the_pinned_ray(objects):
    (ray,) = _by_kind(objects, "RayCluster")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if d.startswith("ray[")]
    assert pin.endswith("==" + ray["spec"]["rayVersion"])


def test_every_container_image_is_pinned(objects):
    images = [(owner, c["image"]) for owner, spec in _pod_specs(objects) for c in spec["containers"]
              if "{{" not in c["image"]]
    images.append(("job template default", _job_template(objects)["variables"]["properties"]["image"]["default"]))
    assert len(images) >= 7
    for owner, image in images:
        assert image_pinned(image), f"{owner}: {image!r}"


def test_deployments_select_their_pods_and_services_select_some(objects):
    pod_labels = []
    for d in _by_kind(objects, "Deployment"):
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"].items() <= labels.items(), d["metadata"]["name"]
        pod_labels.append(labels)
    for s in _by_kind(objects, "Service"):
        sel = s["spec"]["selector"]
        assert any(sel.items() <= labels.items() for labels in pod_labels), f"Service {s['metadata']['name']} selects no pod"


def test_referenced_configmaps_secrets_and_claims_exist(objects):
    configmaps = {o["metadata"]["name"]: o["data"] for o in _by_kind(objects, "ConfigMap")}
    claims = {o["metadata"]["name"] for o in _by_kind(objects, "PersistentVolumeClaim")}
    for owner, spec in _pod_specs(objects):
        for v in spec.get("volumes", []):
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, owner
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps, owner
        for c in spec["containers"]:
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    assert src["configMapRef"]["name"] in configmaps, owner
                if "secretRef" in src:
                    assert src["secretRef"]["name"] in USER_SECRETS, owner
            env = c.get("env") if isinstance(c.get("env"), list) else []
            for e in env:
                ref = e.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    r = ref["configMapKeyRef"]
                    assert r["key"] in configmaps.get(r["name"], {}), f"{owner}: {r}"
                if "secretKeyRef" in ref:
                    r = ref["secretKeyRef"]
                    assert r["key"] in USER_SECRETS.get(r["name"], set()), f"{owner}: {r}"


def test_settings_are_the_readme_switchboard(objects):
    data = _settings(objects)
    assert not undocumented(data), f"not in docs/cluster.md's settings table: {undocumented(data)}"
    assert {s.name for s in CONFIG_ENV} | {"RAY_ADDRESS", "PREFECT_API_URL"} <= set(data)
    # No credentials in a ConfigMap: they belong in Secret rhymerl-s3.
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(data)
    # The Ray address is the Service KubeRay makes for this RayCluster's head.
    (ray,) = _by_kind(objects, "RayCluster")
    assert data["RAY_ADDRESS"].startswith(f"{ray['metadata']['name']}-head-svc.")
    # The user's secrets' keys are documented too (docs/cluster.md), so the names match end to end.
    table = settings_table()
    assert USER_SECRETS["rhymerl-s3"] <= set(table)


def test_prefect_job_template_joins_ray_and_takes_the_settings(objects):
    job = _job_template(objects)["job_configuration"]
    container = job["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "prefect-job" and container["args"] == "{{ command }}"
    assert container["command"] == ["/opt/rhymerl/infra/docker/join-ray.sh"]
    assert (ROOT / "infra" / "docker" / "join-ray.sh").is_file()
    refs = {next(iter(s.values()))["name"] for s in container["envFrom"]}
    assert refs == {"rhymerl-settings", "rhymerl-s3"}
    (worker,) = [d for d in _by_kind(objects, "Deployment") if d["metadata"]["name"] == "prefect-worker"]
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--type") + 1] == "kubernetes"


def test_job_template_placeholders_are_declared_and_render(objects):
    # Prefect fills the template with its own templating; an undeclared placeholder would stay
    # unrendered (or vanish) in the Job it creates.
    from prefect.utilities.templating import apply_values, find_placeholders

    template = _job_template(objects)
    declared = template["variables"]["properties"]
    used = {p.name for p in find_placeholders(template["job_configuration"])}
    assert used <= set(declared), f"undeclared: {used - set(declared)}"
    defaults = {k: v["default"] for k, v in declared.items() if "default" in v}
    job = apply_values(template["job_configuration"], defaults)["job_manifest"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == declared["image"]["default"] and job["metadata"]["namespace"] == "rhymerl"
    assert container["resources"]["requests"] == container["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}


def _under(path: str, mounts: set[str]) -> bool:
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


def _compose_mounts(volumes: list[str]) -> set[str]:
    """Container paths of compose's short-form volumes, `host:container[:mode]` (host may be ${VAR:-dir})."""
    return {re.search(r":(/[^:]*)(?::ro|:rw)?$", v).group(1) for v in volumes}


def test_model_and_dataset_paths_agree_with_compose_and_docs(objects):
    # Rule: one path per setting on every platform, documented, and mounted in every pod that reads it.
    (compose,) = load_yaml_docs(COMPOSE)
    settings, docs = _settings(objects), SETTINGS_DOC.read_text()
    readers = {name: _compose_mounts(svc.get("volumes", [])) for name, svc in compose["services"].items()
               if "RHYMERL_DATASET" in (svc.get("environment") or {})}
    for owner, spec in _pod_specs(objects):
        for c in spec["containers"]:
            if {"name": "rhymerl-settings"} in [s.get("configMapRef") for s in c.get("envFrom", [])]:
                readers[owner] = {m["mountPath"] for m in c.get("volumeMounts", [])}
    assert len(readers) >= 6, sorted(readers)  # 3 compose services, head, GPU group, flow-run Jobs
    for key in PATH_SETTINGS:
        path = compose["x-rhymerl-env"][key]
        assert settings[key] == path, f"{key}: compose {path!r}, Kubernetes {settings[key]!r}"
        assert f"`{path}`" in docs, f"docs/cluster.md never names {key}'s path {path}"
        unmounted = sorted(owner for owner, mounts in readers.items() if not _under(path, mounts))
        assert not unmounted, f"{key}={path} is on no volume of {unmounted}"
