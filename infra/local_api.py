"""The temporary local Prefect API of a run that names no server, with short retry waits.

Without PREFECT_API_URL, Prefect starts a temporary API (uvicorn over a SQLite file in
PREFECT_HOME) for the process. SQLite lets one writer in at a time; when a write meets
another (`SQLITE_BUSY_SNAPSHOT` under WAL), the API answers 503 and Prefect's client retries.
The 503 carries no `Retry-After`, so the client waits 2^1 s (jittered) before the retry,
which then succeeds at once: seconds added to an epoch subflow's start, now and then in a
run. Prefect's client honours `Retry-After`
(`prefect.client.base`, `_send_with_retry`). This module starts the same app Prefect would,
wrapped: a 503 is first replayed in the server after short waits (20-800 ms), and one that is
still left goes out with `Retry-After: RETRY_AFTER_S`, so the client retries ~50 ms later.

Two more differences from Prefect's own temporary server, both for machines with few cores:
it waits for its first start as long as a fresh database's migrations take (Prefect's 20 s limit
is not enough on a slow machine), and it does not run the automation services (triggers,
actions) or the telemetry heartbeat: nobody can define an automation on an API that lives for
one process, and evaluating every event against none costs the server CPU for nothing.

`local_api()` is the context `rhymerl run` trains in: it starts the API as a child process
(same command line and environment as Prefect's own temporary server), points this process's
Prefect settings at it, and stops it when the process exits (after Prefect's log and event
workers drained, as Prefect does for its own); a process killed outright (SIGKILL) takes the API
with it (Linux's parent-death signal). With PREFECT_API_URL set it does nothing.
`rhymerl ui`'s server (`infra.servers.ServerStack`) runs the same wrapped app, with the UI and
every service, from `infra.servers.api_argv`.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

from infra.servers import Child, ServerError, api_argv, free_port, wait_http

RETRY_AFTER_S = 0.05  # a SQLite write lock is held for milliseconds; a 2 s wait would be pure loss
# The server replays a request that met SQLITE_BUSY itself, after these waits, before the client
# sees a 503: with Retry-After alone the client's 5 retries span 0.25 s, which a busy server can
# outlast (the task run then fails). ~1.6 s per client attempt, ~10 s in all.
SERVER_RETRY_WAITS_S = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
_HEADER = b"retry-after"
# A fresh database's migrations can take about Prefect's own 20 s limit on a small machine.
FIRST_START_S = 180.0
PARENT_ENV = "RHYMERL_API_PARENT_PID"  # the process whose death stops the temporary API (_die_with_parent)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class RetryAfter503:
    """ASGI wrapper for Prefect's API: a request answered 503 (a database write that met another
    writer; Prefect's transaction rolled back, so a replay is what its client would send anyway)
    is replayed after each of `waits`; a 503 still left then goes to the client with a Retry-After
    header. Other answers, websockets and lifespan pass through untouched."""

    def __init__(self, app: Callable[..., Awaitable[None]], seconds: float = RETRY_AFTER_S,
                 waits: tuple[float, ...] = SERVER_RETRY_WAITS_S):
        self.app, self.waits = app, waits
        self.value = f"{seconds:g}".encode()

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        for wait in (*self.waits, None):
            # A copy each time: Starlette's routers rewrite the scope's path as they route it.
            refused = await self._attempt(dict(scope), _replay(body, receive), send, last=wait is None)
            if not refused:
                return
            await asyncio.sleep(wait)

    async def _attempt(self, scope: Message, receive: Receive, send: Send, last: bool) -> bool:
        """One pass through the app; True when it answered 503 and the answer was held back."""
        refused = False

        async def forward(message: Message) -> None:
            nonlocal refused
            if message.get("type") == "http.response.start" and message.get("status") == 503:
                if not last:
                    refused = True
                    return
                headers = list(message.get("headers") or [])
                if not any(name.lower() == _HEADER for name, _ in headers):
                    message = {**message, "headers": headers + [(_HEADER, self.value)]}
            if not refused:
                await send(message)

        try:
            await self.app(scope, receive, forward)
        except Exception:
            # Starlette's error middleware sends the handler's answer (Prefect's 503) and then
            # raises the error again for the server to log: held back, the request is replayed.
            if not refused:
                raise
        return refused


async def _read_body(receive: Receive) -> list[Message]:
    """The request's messages up to its last body chunk (or a disconnect), to replay."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request" or not message.get("more_body", False):
            return messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives `messages` again, then whatever the connection sends next."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()
    return replayed


def create_app() -> RetryAfter503:
    """uvicorn's factory: Prefect's API app (settings from the environment), wrapped."""
    from prefect.server.api.server import create_app as prefect_app

    _die_with_parent()
    return RetryAfter503(prefect_app())


def _die_with_parent() -> None:
    """In the temporary API's process: exit (SIGTERM) when the process that started it dies, however
    it dies, SIGKILL included (Linux's parent-death signal; `PARENT_ENV` names that process). Nothing
    elsewhere, or for a server `rhymerl ui` started (it does not set the variable)."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        return  # not allowed here (a sandbox): the parent's atexit stop still applies
    if os.getppid() != int(parent):  # the parent died before the setting took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _server_env() -> dict[str, str]:
    """The child's environment: Prefect's own temporary-server flags (no UI, the services an
    ephemeral server runs, less automations and telemetry) over this process's Prefect settings."""
    from prefect.settings import get_current_settings

    return {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True),
            "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
            "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            # the parent-death signal follows the thread that started the child: the main thread lives as
            # long as the process, another thread may end first
            PARENT_ENV: str(os.getpid()) if threading.current_thread() is threading.main_thread() else ""}


def start_api(timeout_s: float) -> tuple[str, Callable[[], None]]:
    """Start the wrapped API on a free loopback port; returns (api_url, stop). Raises
    ServerError naming the log when it exits or does not answer within `timeout_s`."""
    port = free_port()
    log = Path(os.environ.get("PREFECT_HOME", ".prefect")) / "logs" / f"local-api-{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = api_argv("127.0.0.1", port) + ["--log-level", "error"]
    with open(log, "ab") as out:  # its own process group, so Child.stop reaches uvicorn's workers too
        child = Child("the temporary Prefect API", subprocess.Popen(
            argv, env=_server_env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True), log)
    url = f"http://127.0.0.1:{port}/api"
    try:
        up = wait_http(f"{url}/health", timeout_s, child.alive, lambda b: b.strip() == b"true", poll_s=0.2)
    except BaseException:  # a stop signal while it starts: it must not outlive this process
        child.stop()
        raise
    if not up:
        state = "exited" if not child.alive() else f"did not answer in {timeout_s:.0f}s"
        child.stop()
        raise ServerError(f"{child.name} {state}; its log {log} ends with:\n{child.tail()}\n"
                          "(or start a server with `rhymerl ui` and set PREFECT_API_URL)")
    return url, child.stop


@contextmanager
def local_api(timeout_s: float | None = None) -> Iterator[str]:
    """Prefect's settings point at a temporary local API for the block; yields its URL.

    With PREFECT_API_URL set, yields that and starts nothing. The server stays up until the
    process exits (atexit runs after Prefect's own exit hooks flushed logs and events to it).
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, \
        temporary_settings

    if PREFECT_API_URL.value():
        yield PREFECT_API_URL.value()
        return
    t0 = time.monotonic()
    limit = max(float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()), FIRST_START_S)
    url, stop = start_api(timeout_s or limit)
    atexit.register(stop)
    print(f"temporary Prefect API at {url} (up in {time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)
    with temporary_settings({PREFECT_API_URL: url}):
        yield url
