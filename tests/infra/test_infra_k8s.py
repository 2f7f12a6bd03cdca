"""infra/k8s/: the manifests parse, and what a cluster would reject or misplace is caught here.

Checked without a cluster: every object has apiVersion/kind/metadata.name and the rhymerl
namespace; kustomization lists every file; the GPU worker group asks for GPUs (requests equal to
limits, as Kubernetes requires for extended resources) and the head for none; images are pinned;
Deployments select their own pods and Services select a Deployment's pods; every ConfigMap,
Secret and PVC a pod refers to is created here or documented as the user's; the variables are those
of docs/cluster.md (where the model and data are, and that nothing here overrides what a config
trains: tests/infra/test_infra_paths.py). What a live cluster adds (CRDs installed, storage
classes, GPUs present) is not checked.
"""

from __future__ import annotations

import tomllib

import pytest

from helpers.infra import (ROOT, cluster_settings, image_pinned, job_template, load_yaml_docs, pod_specs,
                           settings_table, undocumented)

K8S = ROOT / "infra" / "k8s"
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
    images = [(owner, c["image"]) for owner, spec in pod_specs(objects) for c in spec["containers"]
              if "{{" not in c["image"]]
    images.append(("job template default", job_template(objects)["variables"]["properties"]["image"]["default"]))
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
    for owner, spec in pod_specs(objects):
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
    # Every setting that says where a service is but the credentials, which belong in Secret rhymerl-s3.
    assert cluster_settings() - USER_SECRETS["rhymerl-s3"] <= set(data)
    assert not USER_SECRETS["rhymerl-s3"] & set(data)
    # The Ray address is the Service KubeRay makes for this RayCluster's head.
    (ray,) = _by_kind(objects, "RayCluster")
    assert data["RAY_ADDRESS"].startswith(f"{ray['metadata']['name']}-head-svc.")
    # The user's secrets' keys are documented too (docs/cluster.md), so the names match end to end.
    table = settings_table()
    assert USER_SECRETS["rhymerl-s3"] <= set(table)


def test_prefect_job_template_joins_ray_and_takes_the_settings(objects):
    job = job_template(objects)["job_configuration"]
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

    template = job_template(objects)
    declared = template["variables"]["properties"]
    used = {p.name for p in find_placeholders(template["job_configuration"])}
    assert used <= set(declared), f"undeclared: {used - set(declared)}"
    defaults = {k: v["default"] for k, v in declared.items() if "default" in v}
    job = apply_values(template["job_configuration"], defaults)["job_manifest"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == declared["image"]["default"] and job["metadata"]["namespace"] == "rhymerl"
    assert container["resources"]["requests"] == container["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}
