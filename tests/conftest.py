"""Shared pytest fixtures."""

from __future__ import annotations

import functools
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

S3_BUCKET = "rhymerl-test"


@dataclass(frozen=True)
class S3Endpoint:
    """A running S3-compatible HTTP server on the loopback interface, with one bucket."""

    url: str  # http://127.0.0.1:PORT
    bucket: str


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Endpoint]:
    """moto's S3 server on a free local port for the whole session (real HTTP, no AWS)."""
    import boto3  # only the tests that use S3 pay for boto3 and moto
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=S3_BUCKET)
    yield S3Endpoint(url, S3_BUCKET)
    server.stop()


@pytest.fixture
def s3_url(s3_server: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh `s3://bucket/prefix` on the test server, with the AWS env pointing at it only."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.url)
    # Never pick up a developer's own AWS profile, config or endpoint override.
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    return f"s3://{s3_server.bucket}/{uuid.uuid4().hex}"


@pytest.fixture(params=["local", "s3"])
def lake_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """Every lake protocol test runs on a local folder and on S3 over HTTP (moto)."""
    if request.param == "local":
        return str(tmp_path / "lake")
    return request.getfixturevalue("s3_url")


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test harness (a temporary API server and database) for every test that runs a
    flow, started once per session instead of once per test (10-30 s each on 2 busy cores)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=240):
        yield


@pytest.fixture(scope="session")
def local_ray(tmp_path_factory):
    """One local Ray (4 logical CPUs) for every test that runs on a local Ray, started once per
    session instead of once per test (15-20 s each with a stop on 2 busy cores).

    A run joins it (`tasks.setup.init_ray` starts no Ray when one is up, and the run then leaves it
    running) and stops only its own actors; a test must not shut it down. It starts in a session
    folder, which Ray's worker processes keep as their working directory, and its workers see the
    environment of this moment only: a test's own environment settings do not reach its actors."""
    import ray

    from tasks.setup import init_ray

    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("ray"))
    try:
        init_ray(num_workers=3)  # as a 3-worker run starts it, with its retries on a slow start
    finally:
        os.chdir(cwd)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):
    """A barely trained built-in model (30 SFT steps, ~10 s), built once for every slow run test.

    What it learns does not matter to the tests that use it (they check plumbing, rows, weights
    and recovery); one build per session instead of one per module saves a build per file."""
    from rhymerl.policy.build import BuildSettings, build_model

    out = tmp_path_factory.mktemp("model") / "tiny"
    return build_model(out, BuildSettings(steps=30, eval_problems=0), progress=False)


@pytest.fixture(autouse=True)
def _no_log_handler_on_a_closed_capture():
    """After each test, drop log handlers writing to a stream that is closed by now. A library that
    sets up logging inside a test (Prefect, imported by a run's code) binds its console handler to
    that test's captured stderr; once the capture closes, the next record any later test logs
    would print "--- Logging error ---" into that test's own captured output."""
    yield
    loggers = [logging.getLogger()] + [x for x in logging.Logger.manager.loggerDict.values()
                                       if isinstance(x, logging.Logger)]
    for logger in loggers:
        for handler in list(logger.handlers):
            if getattr(getattr(handler, "stream", None), "closed", False):
                logger.removeHandler(handler)


# ---------------------------------------------------------------- two workers (`make test`)

RUN_FIXTURES = ("prefect_harness", "local_ray")
ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def worker_group(path: str) -> str:
    """The worker group of a test file: every file that names the session's Ray or Prefect harness
    fixture runs on one worker (they share those, and their runs' engines load both cores); the vLLM
    engine tests on one worker (their engines are package- and module-scoped); any other file is
    its own group. Whole files, so a module-scoped fixture is never built twice. Read from the
    file's text, so the controller, which collects nothing, groups as the workers do."""
    if any(name in Path(path).read_text() for name in RUN_FIXTURES):
        return "runs"
    return "vllm-engines" if "/tests/rhymerl/vllm/" in path else path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The two longest groups first (`worker_group`), so under `-n 2 --dist loadgroup` each worker
    starts on one of them and the short files fill the gaps; the order changes only between files."""
    rank = {"runs": 0, "vllm-engines": 1}
    items.sort(key=lambda item: rank.get(worker_group(item.path.as_posix()), 2))  # stable within a file


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup` by `worker_group`: pytest-xdist's own `xdist_group` marks rename node ids,
    which pytest 9's node ids no longer allow, so the scheduler asks `worker_group` instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByTestGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group((ROOT / nodeid.split("::")[0]).as_posix())

    return ByTestGroup(config, log)
