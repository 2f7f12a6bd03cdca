"""The temporary local Prefect API: its 503s tell Prefect's client to retry within ~50 ms, not 2 s."""

from __future__ import annotations

import asyncio
import urllib.request

import httpx
import pytest

from infra.local_api import RETRY_AFTER_S, RetryAfter503, local_api, start_api


def _app(statuses: list[int], headers: list[tuple[bytes, bytes]] | None = None):
    """An ASGI app answering the given statuses in turn (then 200)."""
    calls = []

    async def app(scope, receive, send):
        calls.append(scope["path"])
        status = statuses.pop(0) if statuses else 200
        await send({"type": "http.response.start", "status": status, "headers": list(headers or [])})
        await send({"type": "http.response.body", "body": b"{}"})
    app.calls = calls
    return app


def _get(app, path: str = "/x") -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get(path)
    return asyncio.run(go())


def test_503_gets_a_retry_after_and_other_answers_are_untouched():
    assert _get(RetryAfter503(_app([503])), "/a").headers["retry-after"] == f"{RETRY_AFTER_S:g}"
    assert "retry-after" not in _get(RetryAfter503(_app([200]))).headers
    assert "retry-after" not in _get(RetryAfter503(_app([500]))).headers
    # A server that already says how long to wait is believed.
    kept = _get(RetryAfter503(_app([503], [(b"Retry-After", b"7")])))
    assert kept.headers.get_list("retry-after") == ["7"]


@pytest.mark.parametrize("wrapped", [True, False])
def test_prefects_client_retries_after_the_hint_instead_of_two_seconds(monkeypatch, wrapped):
    # Prefect's own client against an API whose first answer is a 503 (SQLite busy): with the
    # hint it sleeps ~RETRY_AFTER_S before the retry; without, 2^1 s (Prefect's back-off) +- jitter.
    import prefect.client.base as base

    slept: list[float] = []

    async def no_sleep(seconds: float) -> None:
        slept.append(seconds)
    monkeypatch.setattr(base.anyio, "sleep", no_sleep)
    inner = _app([503])
    app = RetryAfter503(inner) if wrapped else inner

    async def go():
        async with base.PrefectHttpxAsyncClient(transport=httpx.ASGITransport(app=app),
                                                base_url="http://t") as client:
            return await client.get("/api/flow_runs/")
    assert asyncio.run(go()).status_code == 200
    assert len(inner.calls) == 2 and len(slept) == 1
    if wrapped:
        assert RETRY_AFTER_S <= slept[0] <= RETRY_AFTER_S * 1.5
    else:
        assert slept[0] >= 1.0


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
        assert db.is_file()
    finally:
        stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=2)
