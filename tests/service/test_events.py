"""``GET /v1/events`` against a real ``switchboard serve`` process: a scoped caller's
stream carries only its clusters' changes, a stream resumes from ``Last-Event-ID`` (or
is told to read everything again). The limit of streams per replica (503 with
Retry-After) is checked in tests/browser/test_console_live.py, with the page's
fallback to polling."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from tests.conftest import ADMIN, ServiceProcess


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


def _token(service: ServiceProcess, name: str, clusters: list[str] | None) -> str:
    with service.client() as api:
        r = api.post("/v1/tokens", json={"name": name, "role": "viewer", "clusters": clusters})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def _put(service: ServiceProcess, cluster: str, note: str) -> None:
    with service.client() as api:
        r = api.put(f"/v1/overrides/{cluster}", json={"force": "FLASHINFER", "note": note})
    assert r.status_code in (200, 201), r.text


def test_scoped_stream_and_resume(shared_service: ServiceProcess) -> None:
    service = shared_service
    east = _token(service, "ev-east-viewer", ["ev-east"])
    scoped, full = Stream(service, east), Stream(service, ADMIN)
    try:
        assert scoped.status == full.status == 200
        hello = scoped.wait_for(lambda e: e[0] == "hello")
        _put(service, "ev-west", "west's")
        _put(service, "ev-east", "east's")
        _put(service, "ev-east-2", "not east's either")
        # the unrestricted stream sees all three, in order
        for cluster in ("ev-west", "ev-east", "ev-east-2"):
            full.wait_for(lambda e, c=cluster: e[0] == "override" and e[2]["cluster"] == c)
        put = next(e for e in full.events if e[0] == "override")[2]
        assert put["action"] == "put" and put["by"] and put["revision"] >= 1
        # the scoped one only its cluster's (and the fleet's counts, which name none)
        with service.client() as api:
            assert api.delete("/v1/overrides/ev-east").status_code in (200, 204)
        scoped.wait_for(lambda e: e[0] == "override" and e[2]["action"] == "delete")
        seen = [(e[2]["cluster"], e[2]["action"]) for e in scoped.events if e[0] == "override"]
        assert seen == [("ev-east", "put"), ("ev-east", "delete")], scoped.events
        assert all(e[2].get("cluster") in (None, "ev-east") for e in scoped.events[1:])

        # resumed from the hello's id: what happened since, nothing of the others'
        again = Stream(service, east, last_id=hello[1])
        again.wait_for(lambda e: e[0] == "override" and e[2]["action"] == "delete")
        resumed = [(e[2]["cluster"], e[2]["action"]) for e in again.events if e[0] == "override"]
        assert resumed == seen
        again.close()

        # an id of another process (or older than the ring keeps): read everything again
        stale = Stream(service, east, last_id="0badbeef-3")
        stale.wait_for(lambda e: e[0] == "resync")
        stale.close()
    finally:
        scoped.close()
        full.close()
        with service.client() as api:
            for cluster in ("ev-west", "ev-east-2"):
                api.delete(f"/v1/overrides/{cluster}")


def test_a_streams_latency_is_its_first_byte(shared_service: ServiceProcess) -> None:
    """The request-time histogram counts a stream until its first byte, not its life."""
    stream = Stream(shared_service, ADMIN)
    stream.wait_for(lambda e: e[0] == "hello")
    time.sleep(1.2)
    stream.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = httpx.get(shared_service.url + "/metrics").text
        sums = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("switchboard_request_seconds_sum") and '"/v1/events"' in line
        ]
        if sums:
            break
        time.sleep(0.1)
    assert sums and max(sums) < 1.0, sums


def test_stream_needs_a_token(shared_service: ServiceProcess) -> None:
    with httpx.Client(base_url=shared_service.url) as c:
        assert c.get("/v1/events").status_code == 401
