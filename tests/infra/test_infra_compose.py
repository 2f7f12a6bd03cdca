"""infra/compose.yaml: valid for Compose, and what `up` would get wrong checked before anyone runs it.

Validation uses Debian's `docker-compose` (1.29, installed by `make setup`): `config` checks the
file against the Compose specification's JSON schema and its own rules (unknown keys, missing
build contexts, depends_on targets) without a Docker daemon. No container is started here.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from helpers.infra import ROOT, cluster_settings, image_pinned, load_yaml_docs, undocumented
from helpers.marks import docker_compose

COMPOSE = ROOT / "infra" / "compose.yaml"
ONE_SHOT = {"minio-init"}  # jobs that exit; everything else must report health


@pytest.fixture(scope="module")
def compose() -> dict:
    (doc,) = load_yaml_docs(COMPOSE)
    return doc


def _config(tool: str, path) -> subprocess.CompletedProcess:
    # A throwaway DOCKER_HOST: `config` must never need (or reach) a daemon.
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock"}
    return subprocess.run([tool, "-f", str(path), "config", "-q"], capture_output=True, text=True,
                          timeout=120, env=env)


def test_docker_compose_accepts_the_file():
    out = _config(docker_compose(), COMPOSE)
    assert out.returncode == 0, out.stderr


def test_docker_compose_rejects_a_broken_copy(tmp_path):
    # The validator has teeth: an unknown key and a missing build context are both refused.
    tool = docker_compose()
    text = COMPOSE.read_text()
    (tmp_path / "docker").mkdir()
    bad_key = tmp_path / "bad_key.yaml"
    bad_key.write_text(text.replace("    shm_size: 2gb    #", "    shm_sise: 2gb    #", 1))
    out = _config(tool, bad_key)
    assert out.returncode != 0 and "shm_sise" in out.stderr
    no_context = tmp_path / "no_context.yaml"
    no_context.write_text(text.replace("context: ./docker", "context: ./no-such-dir", 1))
    out = _config(tool, no_context)
    assert out.returncode != 0 and "no-such-dir" in out.stderr


def test_every_published_port_is_loopback_only(compose):
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), f"{name}: {port!r}"
        assert "network_mode" not in svc, f"{name}: host networking would publish every port"


def test_images_pinned_and_builds_tagged(compose):
    for name, svc in compose["services"].items():
        assert "image" in svc, f"{name}: no image (a build without a tag gets a generated name)"
        assert image_pinned(svc["image"]), f"{name}: {svc['image']!r} is not pinned to a version tag"


def test_dockerfiles_exist_pin_their_base_and_copy_real_paths(compose):
    for name, svc in compose["services"].items():
        if "build" not in svc:
            continue
        context = (COMPOSE.parent / svc["build"]["context"]).resolve()
        dockerfile = context / svc["build"]["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        text = dockerfile.read_text()
        for base in re.findall(r"^FROM\s+(\S+)", text, flags=re.M):
            assert image_pinned(base), f"{dockerfile.name}: base {base!r} not pinned"
        # (that the rhymerl images hold and start the project: tests/infra/test_image_files.py)
        sources = re.findall(r"^COPY\s+(?!--)(\S+)\s", text, flags=re.M)
        for src in sources:
            assert (context / src).exists(), f"{dockerfile.name}: COPY {src} - not in the build context"


def test_long_running_services_have_healthchecks_and_waits_are_satisfiable(compose):
    services = compose["services"]
    for name, svc in services.items():
        if name not in ONE_SHOT:
            assert "test" in svc.get("healthcheck", {}), f"{name}: no healthcheck"
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}'s health, which it never reports"
            if cond["condition"] == "service_completed_successfully":
                assert dep in ONE_SHOT, f"{name} waits for long-running {dep} to exit"


def test_gpu_worker_reserves_gpus_and_cpu_services_do_not(compose):
    services = compose["services"]
    devices = services["ray-gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert services["ray-gpu-worker"]["image"].startswith("rhymerl-gpu:")
    for name in ("ray-head", "prefect-worker"):
        assert "deploy" not in services[name] and services[name]["image"].startswith("rhymerl-cpu:")


def test_rhymerl_services_get_the_whole_documented_switchboard(compose):
    env = compose["x-rhymerl-env"]
    assert not undocumented(env), f"not in docs/cluster.md's settings table: {undocumented(env)}"
    # Every setting that says where a service is; what to train is each config's (test_infra_paths.py).
    assert cluster_settings() <= set(env), sorted(cluster_settings() - set(env))
    # Every address points at a service of this file (a typo would hang the run, not fail it).
    services = set(compose["services"])
    for key in ("RAY_ADDRESS", "PREFECT_API_URL", "MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL"):
        host = re.sub(r"^\w+://", "", env[key]).split(":")[0].split("/")[0]
        assert host in services, f"{key}={env[key]} names no service"
    assert env["RHYMERL_LAKE"].split("/")[2] in _created_buckets(compose)


def _created_buckets(compose) -> set[str]:
    command = " ".join(compose["services"]["minio-init"]["command"])
    return {m for m in re.findall(r"lake/([\w.-]+)", command)}


def test_join_ray_script_is_executable():
    script = ROOT / "infra" / "docker" / "join-ray.sh"
    assert os.access(script, os.X_OK)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
