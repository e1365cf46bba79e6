"""The decision log through the in-process app: a report waits for its own decision's
position (however slow the database), a read holds every decision answered before it
or answers 503 at its deadline (never an answer without them), and an app's threads
end with it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from tests.conftest import make_inprocess_client
from tests.reliability.conftest import select_body, wait_until
from tests.service.test_select_decisions import ALL


def _client(tmp_path: Path, **settings: Any) -> Any:
    url = f"sqlite:///{tmp_path / 'sb.db'}"
    return make_inprocess_client(url, spill_path=str(tmp_path / "spill.jsonl"), **settings)


def _measurement(cluster: str, pod: str) -> dict[str, Any]:
    body = select_body(cluster, pod)
    return {
        "cluster": cluster,
        "pod": pod,
        "device": body["device"],
        "model": {k: v for k, v in body["model"].items() if k != "name"},
        "dtype": "bfloat16",
        "packages": ALL,
        "results": [
            {
                "backend": "FLASHINFER",
                "impl": "test",
                "shape": {"seqlens": [4096], "num_heads": 128},
                "median_ms": 1.0,
                "tflops": 400.0,
                "correct": True,
            }
        ],
    }


@pytest.mark.postgres
def test_a_report_counts_against_its_decision_in_the_log_without_waiting_for_the_database(
    pg_url_factory: Callable[[], str],
) -> None:
    """A decision in the log is acknowledged: a report of its pod, for its situation and
    from the caller that asked, counts while the decision's database write is still in
    flight (held here, far past the stall bound); one from another caller waits for the
    stored decisions and is not counted. Before the log: the slow batch was spilled
    while its call still committed, the flush gave up and the report was stored as not
    counted with its decision in the database."""
    with make_inprocess_client(pg_url_factory()) as client:  # type: ignore[attr-defined]
        runtime = client.app.state.runtime
        recorder = runtime.recorder
        held = threading.Event()

        def slow_commit(*_: Any) -> None:
            held.wait(60)  # released by the test

        event.listen(runtime.writer_engine, "commit", slow_commit)
        try:
            body = select_body("logged", "logged-pod")
            body["packages"] = ALL
            r = client.post("/v1/select", json=body)
            assert r.status_code == 200 and r.json()["recorded"] is True, r.text
            r = client.post("/v1/measurements", json=_measurement("logged", "logged-pod"))
            assert r.status_code == 201 and r.json()["counted"] is True, r.json()
            assert recorder.position_of("logged", "logged-pod") is not None  # not stored yet
            held.set()

            other = client.post("/v1/tokens", json={"name": "other", "role": "agent"})
            token = {"Authorization": f"Bearer {other.json()['token']}"}
            r = client.post(
                "/v1/measurements", json=_measurement("logged", "logged-pod"), headers=token
            )
            assert r.status_code == 201 and r.json()["counted"] is False, r.json()
        finally:
            held.set()
            event.remove(runtime.writer_engine, "commit", slow_commit)


def test_reads_on_a_store_slower_than_the_stall_bound_hold_the_pods_just_booted(
    tmp_path: Path,
) -> None:
    """A busy machine: each decision write takes 1 s, past the stall bound (0.2 s).
    Before, a read stopped waiting once the write counted as stalled and answered from
    a database without the pods booted just before it: a preview left their cluster
    out, a listing missed them."""
    with _client(tmp_path) as client:
        runtime = client.app.state.runtime

        def slow_commit(*_: Any) -> None:
            time.sleep(1.0)

        event.listen(runtime.writer_engine, "commit", slow_commit)
        try:
            for i in range(3):
                r = client.post("/v1/select", json=select_body("busy", f"pod-{i}"))
                assert r.status_code == 200 and r.json()["recorded"] is True, r.text
            r = client.put(
                "/v1/overrides/busy?dry_run=true", json={"force": "FLASHINFER", "note": "n"}
            )
            assert r.status_code == 200, r.text
            rows = [c for c in r.json()["preview"]["changes"] if c["cluster"] == "busy"]
            assert [(c["to"], c["pods"]) for c in rows] == [("FLASHINFER", 3)]
            for i in range(3, 5):
                client.post("/v1/select", json=select_body("busy", f"pod-{i}"))
            r = client.get("/v1/selections", params={"cluster": "busy", "limit": 50})
            assert r.status_code == 200 and len(r.json()["items"]) == 5, r.text
        finally:
            event.remove(runtime.writer_engine, "commit", slow_commit)


def test_a_frozen_read_with_only_logged_decisions_gives_up_waiting_for_the_drain(
    tmp_path: Path,
) -> None:
    """With nothing in memory but 20 decisions logged and not stored, a listing in a
    frozen database waited 3 s for a drain that could not happen, then its own store
    deadline. Now it waits for them at most its store deadline and then answers 503
    rather than read a database without them."""
    with _client(tmp_path, store_deadline_s=1.0) as client:
        runtime = client.app.state.runtime
        frozen = threading.Event()
        thaw = threading.Event()

        def freeze(*_: Any) -> None:
            if frozen.is_set():
                thaw.wait(30)

        event.listen(runtime.writer_engine, "before_cursor_execute", freeze)
        event.listen(runtime.engine, "before_cursor_execute", freeze)
        try:
            frozen.set()
            for i in range(20):
                r = client.post("/v1/select", json=select_body("frozen", f"pod-{i}"))
                assert r.json()["recorded"] is True
            recorder = runtime.recorder
            wait_until(lambda: recorder.degraded is not None, 10, what="stalled")
            r = client.get("/v1/selections", params={"limit": 5})
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"].isdigit()
            assert recorder.pending == 20  # logged, not yet stored
        finally:
            thaw.set()
            frozen.clear()
        assert recorder.flush(30)
        r = client.get("/v1/selections", params={"limit": 50, "cluster": "frozen"})
        assert r.status_code == 200 and len(r.json()["items"]) == 20
        event.remove(runtime.writer_engine, "before_cursor_execute", freeze)
        event.remove(runtime.engine, "before_cursor_execute", freeze)


def test_every_thread_an_app_starts_ends_when_it_stops(tmp_path: Path) -> None:
    def cycle(i: int) -> None:
        with _client(tmp_path / str(i)) as client:
            client.post("/v1/select", json=select_body("cycles", f"pod-{i}"))
            client.get("/v1/selections", params={"limit": 1})

    (tmp_path / "0").mkdir()
    cycle(0)
    after_first = set(threading.enumerate())

    def started_since() -> list[str]:
        # a thread alive after the first cycle may end on its own meanwhile (a pool's
        # idle worker): what counts is that none started by a later app is left
        return sorted(t.name for t in threading.enumerate() if t not in after_first)

    for i in range(1, 21):
        (tmp_path / str(i)).mkdir()
        cycle(i)
    wait_until(lambda: not started_since(), 10, what="threads ended")
    assert started_since() == []


def test_an_app_leaves_the_process_settings_as_it_found_them(tmp_path: Path) -> None:
    import gc
    import sys

    interval, frozen = sys.getswitchinterval(), gc.get_freeze_count()
    with _client(tmp_path) as client:
        client.post("/v1/select", json=select_body("settings", "pod"))
        assert sys.getswitchinterval() == interval
    assert sys.getswitchinterval() == interval
    assert gc.get_freeze_count() == frozen
