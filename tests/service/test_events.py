"""``GET /v1/events`` against a real ``switchboard serve`` process: a scoped caller's
stream carries only its clusters' and the fleet's changes, a stream resumes from
``Last-Event-ID`` (or is told to read everything again), and a replica past its limit
of streams answers 503 with Retry-After."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN, ServiceProcess

MAX_STREAMS = 3


class Stream:
    """One open stream read on a thread: its events as (event, id, data) in order."""

    def __init__(self, service: ServiceProcess, token: str, last_id: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        self.client = httpx.Client(base_url=service.url, headers=headers, timeout=None)
        self.events: list[tuple[str, str | None, dict[str, Any]]] = []
        self.status: int | None = None
        self._opened = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self._opened.wait(10), "the stream did not answer"

    def _read(self) -> None:
        try:
            with self.client.stream("GET", "/v1/events") as r:
                self.status = r.status_code
                self._opened.set()
                event, eid, data = "message", None, ""
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("id:"):
                        eid = line[3:].strip()
                    elif line.startswith("data:"):
                        data += line[5:].strip()
                    elif line == "" and data:
                        self.events.append((event, eid, json.loads(data)))
                        event, eid, data = "message", None, ""
        except httpx.HTTPError:
            pass
        finally:
            self._opened.set()

    def wait_for(self, pred: Any, timeout: float = 5.0) -> tuple[str, str | None, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in list(self.events):
                if pred(e):
                    return e
            time.sleep(0.02)
        raise AssertionError(f"no such event in {timeout} s; got {self.events}")

    def close(self) -> None:
        self.client.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    tmp = tmp_path_factory.mktemp("events")
    svc = ServiceProcess(
        f"sqlite:///{tmp / 'sb.db'}", env={"SWITCHBOARD_EVENT_STREAMS_MAX": str(MAX_STREAMS)}
    ).start(tmp)
    yield svc
    svc.stop()


def _token(service: ServiceProcess, name: str, clusters: list[str] | None) -> str:
    with service.client() as api:
        r = api.post("/v1/tokens", json={"name": name, "role": "viewer", "clusters": clusters})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def _open_when_free(service: ServiceProcess, token: str, last_id: str) -> Stream:
    """A stream, once the replica noticed a closed one went (within a second or so)."""
    deadline = time.monotonic() + 5
    while True:
        stream = Stream(service, token, last_id=last_id)
        if stream.status == 200 or time.monotonic() > deadline:
            return stream
        stream.close()
        time.sleep(0.1)


def _put(service: ServiceProcess, cluster: str, note: str) -> None:
    with service.client() as api:
        r = api.put(f"/v1/overrides/{cluster}", json={"force": "FLASHINFER", "note": note})
    assert r.status_code in (200, 201), r.text


def test_scoped_stream_resume_and_limit(service: ServiceProcess) -> None:
    east = _token(service, "east-viewer", ["prod-east"])
    scoped, full = Stream(service, east), Stream(service, ADMIN)
    try:
        assert scoped.status == full.status == 200
        hello = scoped.wait_for(lambda e: e[0] == "hello")
        _put(service, "prod-west", "west's")
        _put(service, "prod-east", "east's")
        _put(service, "*", "fleet's")
        # the unrestricted stream sees all three, in order
        for cluster in ("prod-west", "prod-east", "*"):
            full.wait_for(lambda e, c=cluster: e[0] == "override" and e[2]["cluster"] == c)
        scoped.wait_for(lambda e: e[0] == "override" and e[2]["cluster"] == "*")
        seen = [e[2].get("cluster") for e in scoped.events if e[0] == "override"]
        assert seen == ["prod-east", "*"], scoped.events
        put = next(e for e in full.events if e[0] == "override")[2]
        assert put["action"] == "put" and put["by"] and put["revision"] >= 1

        # resumed from the hello's id: what happened since, nothing of prod-west's
        again = Stream(service, east, last_id=hello[1])
        again.wait_for(lambda e: e[0] == "override" and e[2]["cluster"] == "*")
        assert [e[2]["cluster"] for e in again.events if e[0] == "override"] == ["prod-east", "*"]

        # three streams open: the fourth is refused and told when to come back
        with httpx.Client(base_url=service.url) as c:
            r = c.get("/v1/events", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 503 and r.headers["Retry-After"] == "30", r.text
        assert "SWITCHBOARD_EVENT_STREAMS_MAX" in r.json()["detail"]["message"]
        again.close()

        # an id of another process (or older than the ring keeps): read everything again
        stale = _open_when_free(service, east, "0badbeef-3")
        stale.wait_for(lambda e: e[0] == "resync")
        stale.close()

        # a removal reaches the stream too
        with service.client() as api:
            assert api.delete("/v1/overrides/prod-east").status_code in (200, 204)
        scoped.wait_for(lambda e: e[0] == "override" and e[2]["action"] == "delete")
    finally:
        scoped.close()
        full.close()


def test_stream_needs_a_token(service: ServiceProcess) -> None:
    with httpx.Client(base_url=service.url) as c:
        assert c.get("/v1/events").status_code == 401
