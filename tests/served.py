"""The service on a real loopback port, served by uvicorn from a thread of the test
process: what a browser or a shell script needs (an HTTP server), without a process start.

A ``switchboard serve`` process pays the app's import (about 2 s of CPU) at every start;
here the app is imported once per test session and every server is a fresh ``Runtime``
on a fresh store, built and served as ``switchboard serve`` builds and serves it (the
same limits middleware and guarded protocol). Tests that need the process itself (its
signals, its environment, its start-up output) keep ``ServiceProcess`` (tests/conftest.py).

``ThreadServer`` has the parts of ``ServiceProcess`` the tests use (``url``, ``port``,
``client``, ``bootstrap_token``, ``database_url``), so a test reads the same either way.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ADMIN, ServiceProcess
from tests.spill_paths import spill_setting

READY_TIMEOUT_S = 60.0


class ThreadServer:
    """One service (its own ``Runtime``) served by uvicorn in a daemon thread."""

    def __init__(
        self, database_url: str, *, bootstrap_token: str | None = ADMIN, **settings: Any
    ) -> None:
        self.database_url = database_url
        self.bootstrap_token = bootstrap_token
        self.settings = settings
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, timeout: float = READY_TIMEOUT_S) -> ThreadServer:
        """Serve, and wait until ``/readyz`` answers 200; stopped again when it never does."""
        import uvicorn
        from mla_switchboard.service.api.app import create_app
        from mla_switchboard.service.api.conn_events import ConnectionEvents
        from mla_switchboard.service.api.server import server_options, with_limits
        from mla_switchboard.service.config import Settings
        from mla_switchboard.service.runtime import Runtime

        try:
            fields = {**spill_setting(self.database_url), **self.settings}
            settings = Settings(
                database_url=self.database_url, admin_token=self.bootstrap_token, **fields
            )
            runtime = Runtime(settings)
            runtime.prepare_store()
            events = ConnectionEvents(runtime.metrics)
            config = uvicorn.Config(
                with_limits(create_app(runtime=runtime), settings, events),
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=5,
                **server_options(settings, events),
            )
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(
                target=self._serve, name=f"service-{self.port}", daemon=True
            )
            self._thread.start()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        _log_start("thread")
        return self

    def _serve(self) -> None:
        # uvicorn's own Server.run, keeping the loop it serves on (hung() blocks it)
        from uvicorn._compat import asyncio_run

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await self._server.serve(sockets=[self._sock])

        try:
            asyncio_run(serve(), loop_factory=self._server.config.get_loop_factory())
        except BaseException as exc:  # shown by _wait_ready, not lost in the thread
            self._failure = exc

    @contextmanager
    def hung(self) -> Iterator[None]:
        """The service stops answering (its event loop blocked, as a stopped process's
        would be: connections are accepted by the kernel, nothing is read or answered)
        until the block ends."""
        assert self._loop is not None, "start() first"
        release = threading.Event()
        self._loop.call_soon_threadsafe(release.wait)
        try:
            yield
        finally:
            release.set()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._thread is not None
            if not self._thread.is_alive():
                raise RuntimeError(f"the server thread ended before it was ready: {self._failure}")
            if self._server.started:
                try:
                    if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.02)
        raise RuntimeError(f"the server on {self.url} was not ready in {timeout} s")

    @property
    def serving(self) -> bool:
        """Whether the server thread still runs."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop serving (uvicorn's graceful shutdown runs the app's lifespan end, which
        stops the runtime) and wait for the thread; safe to call more than once."""
        if self._loop is not None and not self._loop.is_closed():
            with suppress(RuntimeError):  # the loop closed meanwhile: nothing left to end
                self._loop.call_soon_threadsafe(_end_event_streams)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(30)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(10)
        self._sock.close()

    def client(self, token: str | None = ADMIN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)


def _end_event_streams() -> None:
    """End this thread's open change streams, as sse-starlette does when uvicorn gets
    SIGTERM: a server in a thread installs no signal handler, so sse-starlette's watcher
    (one per thread) never hears of the stop, and every open stream would be cut off
    mid-answer at the graceful-shutdown timeout instead (the browser logs that). Runs
    on the server's loop."""
    try:
        from sse_starlette.sse import _get_shutdown_state
    except ImportError:  # another sse-starlette: streams are cut off at the timeout
        return
    for event in list(_get_shutdown_state().events):
        event.set()


def _log_start(kind: str) -> None:
    """Counted like ``ServiceProcess`` starts when SWITCHBOARD_TEST_STARTS_LOG names a
    file: the line says it was a thread, not a process."""
    path = os.environ.get("SWITCHBOARD_TEST_STARTS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{kind}: {os.environ.get('PYTEST_CURRENT_TEST', '?')}\n")


@contextmanager
def serving(database_url: str, **settings: Any) -> Iterator[ThreadServer]:
    """A started server, stopped on the way out (also when the body fails)."""
    server = ThreadServer(database_url, **settings).start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def thread_servers(directory: Path) -> Iterator[Callable[..., ThreadServer]]:
    """A factory of started servers, each on its own SQLite file in ``directory`` unless
    given a ``database_url``; every one it started is stopped on the way out."""
    started: list[ThreadServer] = []

    def make(database_url: str | None = None, **settings: Any) -> ThreadServer:
        url = database_url or f"sqlite:///{directory / f'switchboard-{len(started)}.db'}"
        server = ThreadServer(url, **settings)
        started.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in started:
            server.stop()


# what the tests' helpers take: either kind of server answers them alike
Server = ServiceProcess | ThreadServer
