"""The temporary local Prefect API: its 503s tell Prefect's client to retry within ~50 ms, not 2 s."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import httpx
import pytest
from helpers.proc import processes_with_env

from infra.local_api import RETRY_AFTER_S, RetryAfter503, local_api, start_api


def _app(statuses: list[int], headers: list[tuple[bytes, bytes]] | None = None):
    """An ASGI app answering the given statuses in turn (then 200), echoing the request body."""
    calls = []

    async def app(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        calls.append((scope["path"], body))
        status = statuses.pop(0) if statuses else 200
        await send({"type": "http.response.start", "status": status, "headers": list(headers or [])})
        await send({"type": "http.response.body", "body": body or b"{}"})
    app.calls = calls
    return app


def _send(app, path: str = "/x", body: bytes | None = None) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            if body is None:
                return await client.get(path)
            return await client.post(path, content=body)
    return asyncio.run(go())


def test_a_503_is_replayed_in_the_server_with_the_same_body():
    inner = _app([503, 503])
    answer = _send(RetryAfter503(inner, waits=(0.0, 0.0, 0.0)), "/api/task_runs/", b'{"name": "t"}')
    assert answer.status_code == 200 and answer.content == b'{"name": "t"}'
    assert inner.calls == [("/api/task_runs/", b'{"name": "t"}')] * 3
    assert "retry-after" not in answer.headers


def test_a_503_left_after_the_server_retries_gets_a_retry_after_and_other_answers_are_untouched():
    inner = _app([503] * 3)
    answer = _send(RetryAfter503(inner, waits=(0.0, 0.0)), "/a")
    assert answer.status_code == 503 and len(inner.calls) == 3  # the first try and two replays
    assert answer.headers["retry-after"] == f"{RETRY_AFTER_S:g}"
    for status in (200, 500):  # a 500 is not a busy database: never replayed
        inner = _app([status])
        answer = _send(RetryAfter503(inner, waits=(0.0,)))
        assert answer.status_code == status and len(inner.calls) == 1 and "retry-after" not in answer.headers
    # A server that already says how long to wait is believed.
    kept = _send(RetryAfter503(_app([503], [(b"Retry-After", b"7")]), waits=()))
    assert kept.headers.get_list("retry-after") == ["7"]


def test_a_replay_through_starlettes_routing_and_error_handler_reaches_the_same_endpoint():
    # As in Prefect's app: a mounted router (which rewrites the scope's path while routing) and a
    # catch-all handler that answers 503 and then raises the error again (Starlette's error middleware).
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Mount, Route

    seen = []

    async def endpoint(request):
        seen.append(await request.body())
        if len(seen) < 3:
            raise RuntimeError("database is locked")
        return JSONResponse({"tries": len(seen)})

    async def busy(request, exc):
        return JSONResponse({"exception_message": "Service Unavailable"}, status_code=503)
    app = Starlette(routes=[Mount("/api", routes=[Route("/task_runs/", endpoint, methods=["POST"])])],
                    exception_handlers={Exception: busy})
    answer = _send(RetryAfter503(app, waits=(0.0, 0.0)), "/api/task_runs/", b"{}")
    assert answer.status_code == 200 and answer.json() == {"tries": 3} and seen == [b"{}"] * 3


@pytest.mark.parametrize("waits", [None, (), "unwrapped"])
def test_prefects_client_waits_milliseconds_not_two_seconds(monkeypatch, waits):
    # Prefect's own client against an API whose first answer is a 503 (SQLite busy). Wrapped, the
    # server's own replay answers it (no client retry); with the server's retries used up the client
    # sleeps ~RETRY_AFTER_S before its retry; unwrapped, 2^1 s (Prefect's back-off) +- jitter.
    import prefect.client.base as base

    slept: list[float] = []

    async def no_sleep(seconds: float) -> None:
        slept.append(seconds)
    monkeypatch.setattr(base.anyio, "sleep", no_sleep)
    inner = _app([503])
    if waits == "unwrapped":
        app = inner
    else:
        app = RetryAfter503(inner) if waits is None else RetryAfter503(inner, waits=waits)

    async def go():
        async with base.PrefectHttpxAsyncClient(transport=httpx.ASGITransport(app=app),
                                                base_url="http://t") as client:
            return await client.get("/api/flow_runs/")
    assert asyncio.run(go()).status_code == 200
    assert len(inner.calls) == 2
    if waits is None:
        assert slept == []
    elif waits == ():
        assert len(slept) == 1 and RETRY_AFTER_S <= slept[0] <= RETRY_AFTER_S * 1.5
    else:
        assert len(slept) == 1 and slept[0] >= 1.0


def test_a_configured_api_url_is_used_as_is():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}), local_api() as url:
        assert url == "http://127.0.0.1:9/api"


def test_the_temporary_api_starts_answers_and_stops(tmp_path, monkeypatch):
    # The child runs with this process's Prefect settings: here, a database file of the test's own.
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))  # its log folder
    db = tmp_path / "api.db"
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{db}"}):
        url, stop = start_api(timeout_s=180)
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
            assert resp.read().strip() == b"true"
        with urllib.request.urlopen(f"{url}/admin/version", timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{url}/admin/settings", timeout=10) as resp:
            server = json.load(resp)["server"]  # no automations on a per-process API, no heartbeat
        assert server["services"]["triggers"]["enabled"] is False and server["analytics_enabled"] is False
        assert db.is_file()
    finally:
        stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=2)


PARENT = """
import sys, time
from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings
from infra.local_api import start_api
with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: sys.argv[1]}):
    url, stop = start_api(timeout_s=180)
print(url, flush=True)
time.sleep(600)
"""


def test_the_temporary_api_dies_with_a_process_killed_outright(tmp_path, monkeypatch):
    # Rule: the API is bound to the process that started it: SIGKILL (no atexit, no handler) takes
    # it along (Linux's parent-death signal), though it runs in a session of its own.
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-c", PARENT, f"sqlite+aiosqlite:///{tmp_path / 'api.db'}"],
                              cwd=root, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    try:
        url = parent.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
            assert resp.read().strip() == b"true"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
    deadline = time.monotonic() + 60  # generous: a loaded machine; it goes within a second normally
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
        except OSError:
            return
        time.sleep(0.5)
    left = processes_with_env("RHYMERL_API_PARENT_PID", str(parent.pid))
    for pid in left:  # not left behind by this test either
        os.kill(pid, signal.SIGKILL)
    pytest.fail(f"the temporary API at {url} outlived the process that started it: {left}")
