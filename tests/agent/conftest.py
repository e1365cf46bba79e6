"""Fixtures for the agent tests: one real service per session, and real bad servers.

Starting ``switchboard serve`` takes seconds (migrations, imports), so the tests
that only read from the service share the session's process; the tests that stop
the service start their own through ``service_factory`` (tests/conftest.py). The
"service hangs" and "5xx/429" cases are real sockets on loopback, not mocks: a
listener that accepts and never answers, and a small HTTP server that answers what
the test tells it to and forwards the rest to the real service.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest


def _shared_conftest() -> Any:
    """tests/conftest.py, for its ServiceProcess (its fixtures are function-scoped)."""
    path = Path(__file__).resolve().parent.parent / "conftest.py"
    spec = importlib.util.spec_from_file_location("switchboard_shared_conftest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_shared = _shared_conftest()
ADMIN: str = _shared.ADMIN
ServiceProcess = _shared.ServiceProcess
free_port = _shared.free_port


@pytest.fixture(scope="session")
def agent_service(shared_service: Any) -> Any:
    """The session's real service (tests/conftest.py's ``shared_service``), with the
    token the agent tests use: they never stop it, and each reads back only its own
    clusters and pods, so one process serves them all."""
    shared_service.token = ADMIN
    return shared_service


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def closed_url() -> str:
    """A loopback URL nobody listens on: connections are refused at once."""
    return f"http://127.0.0.1:{free_port()}"


class HangingServer:
    """Accepts connections and reads requests, and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = threading.Event()
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self._conns.append(conn)
            self.accepted.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()
        self.sock.close()


@pytest.fixture
def hanging_server() -> Iterator[HangingServer]:
    server = HangingServer()
    yield server
    server.close()


class ScriptedServer:
    """A real HTTP server that answers ``script`` entries in order, then forwards each
    request to ``upstream`` (the real service). ``requests`` counts what it received."""

    def __init__(self, upstream: str | None = None) -> None:
        self.upstream = upstream
        self.script: list[tuple[int, dict[str, str], bytes]] = []
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests += 1
                if outer.script:
                    status, headers, payload = outer.script.pop(0)
                else:
                    assert outer.upstream is not None
                    forwarded = httpx.post(
                        outer.upstream + self.path,
                        content=body,
                        headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
                        timeout=5,
                    )
                    status, payload = forwarded.status_code, forwarded.content
                    headers = {
                        k: v
                        for k, v in forwarded.headers.items()
                        if k.lower() in ("etag", "x-decision-id", "content-type")
                    }
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted_server(agent_service: Any) -> Iterator[ScriptedServer]:
    server = ScriptedServer(agent_service.url)
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _isolated_agent_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's SWITCHBOARD_* settings or writes to ~/.cache."""
    for name in ("URL", "TOKEN", "DEADLINE", "CLUSTER", "CACHE_DIR", "NODE", "POD", "ENGINE"):
        monkeypatch.delenv(f"SWITCHBOARD_{name}", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make the probe see a GPU (this machine has none): ``gpu("NVIDIA H200", (9, 0))``.

    A pod on a real GPU is recorded by the service; ``--capability``/``--device-name``
    pretend instead, which is a dry run (nothing recorded). Tests that need a recorded
    GPU decision set the probe's answer here, at the hardware boundary."""
    from mla_switchboard.agent import pod as agent_pod
    from mla_switchboard.agent.probe import DeviceProbe

    def see(name: str | None, capability: tuple[int, int] | None) -> None:
        via = "nvml" if capability is not None else "none"
        monkeypatch.setattr(agent_pod, "probe_device", lambda: DeviceProbe(name, capability, via))

    return see
