"""What a report costs and waits for, and what reported failures do to the answers.

- A measurement report writes a rollout guard note only when a rollout's guard counts
  it: fifty rollouts active elsewhere (other clusters, or another model) cost it no
  statement on ``guard_pending``; a stage pod's report notes and removes its own.
- A report waits for its own decision's position to be stored, and returns once it is.
- One pod's wrong result does not exclude a backend (the answer says how far from it
  it is); a second pod's does; failures never leave a pod with no valid backend.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from mla_switchboard.core.evidence import observations_of_report
from mla_switchboard.core.schemas import MeasurementReport
from mla_switchboard.service.ids import new_id
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.measurements import PendingReport
from sqlalchemy import event

from tests.conftest import ADMIN, make_inprocess_client
from tests.reliability.conftest import FlakyStore, recorder, row
from tests.service.test_rollout_guards import DEVICE, SLOW, measured_stage_pods, report
from tests.service.test_select_decisions import ALL, body


@pytest.fixture
def api(sqlite_url: str) -> Iterator[httpx.Client]:
    with make_inprocess_client(sqlite_url) as client:  # type: ignore[attr-defined]
        client.headers["Authorization"] = f"Bearer {ADMIN}"
        yield client


class NoteStatements:
    """Writes to ``guard_pending`` run through the service's engine meanwhile (the
    periodic rollout check reads it on its own thread: its reads are not counted)."""

    def __init__(self, api: httpx.Client) -> None:
        self.engine = api.app.state.runtime.store.guard_pending.engine  # type: ignore[attr-defined]
        self.seen: list[str] = []

    def _count(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        verb = statement.split(None, 1)[0].upper()
        if "guard_pending" in statement and verb in ("INSERT", "DELETE", "UPDATE"):
            self.seen.append(verb)

    def __enter__(self) -> NoteStatements:
        event.listen(self.engine, "before_cursor_execute", self._count)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._count)


def fifty_rollouts_elsewhere(api: httpx.Client) -> None:
    """45 on clusters no pod here reports from, 5 on prod-east for another model."""
    for i in range(50):
        spec: dict[str, Any] = {**SLOW, "rollout": {"percent": 50}}
        cluster = f"canary-{i}"
        if i % 10 == 9:
            cluster, spec["model"] = "prod-east", "acme/not-deployed-*"
        r = api.put(f"/v1/overrides/{cluster}", json=spec)
        assert r.status_code == 200, r.text


def test_a_report_under_fifty_unrelated_rollouts_writes_no_guard_note(
    api: httpx.Client,
) -> None:
    fifty_rollouts_elsewhere(api)
    payload = body(cluster="prod-east", pod="pod-1", packages=ALL)
    payload["device"] = DEVICE
    assert api.post("/v1/select", json=payload).status_code == 200
    with NoteStatements(api) as notes:
        r = report(api, "prod-east", "pod-1")
    assert r.status_code == 201 and r.json()["counted"] is True, r.text
    assert notes.seen == []


def test_a_stage_pods_report_notes_its_evaluation_and_removes_the_note(
    api: httpx.Client,
) -> None:
    fifty_rollouts_elsewhere(api)
    r = api.put("/v1/overrides/*", json={**SLOW, "rollout": {"percent": 50}})
    assert r.status_code == 200, r.text
    (pod, _), *_ = measured_stage_pods(api, "prod-west", 1)
    with NoteStatements(api) as notes:
        r = report(api, "prod-west", pod)
    assert r.status_code == 201 and r.json()["guard"] == "checked", r.text
    assert notes.seen == ["INSERT", "DELETE"]  # the note, stored with the report, then done
    assert api.app.state.runtime.store.guard_pending.count() == 0  # type: ignore[attr-defined]


def test_a_report_waits_for_its_own_decision_and_returns_once_it_is_stored(
    tmp_path: Path,
) -> None:
    store = FlakyStore()
    store.up = True
    store.answering.clear()  # every write waits: nothing is stored yet
    rec = recorder(store, tmp_path / "log", Metrics(), batch=1)
    rec.open()
    rec.start()
    assert rec.submit(row(1, pod="a")) and rec.submit(row(2, pod="b"))
    position = rec.position_of("c", "b")
    assert position == 2
    seen: dict[str, Any] = {}

    def wait() -> None:
        seen["stored"] = rec.wait_stored(position, 60)
        seen["in_store"] = "id00002" in store.rows

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert "stored" not in seen  # the write hangs: it waits
    store.answering.set()
    waiter.join(60)
    assert seen == {"stored": True, "in_store": True}
    assert rec.position_of("c", "b") is None
    rec.stop()


def test_a_failure_report_right_after_its_select_finds_its_decision(api: httpx.Client) -> None:
    answer = api.post("/v1/select", json=body(pod="fresh")).json()
    r = api.post(
        f"/v1/selections/{answer['decision_id']}/failure",
        json={"backend": answer["backend"], "error": "RuntimeError: boom"},
    )
    assert r.status_code == 202, r.text


# ------------------------------------------------------------ the failure policy


def measured_select(api: httpx.Client, pod: str, packages: dict[str, str]) -> dict[str, Any]:
    payload = body(cluster="prod-east", pod=pod, packages=packages)
    payload["device"] = DEVICE
    r = api.post("/v1/select", json=payload)
    assert r.status_code == 200, r.text
    return r.json()


def report_body(
    pod: str, packages: dict[str, str], results: list[dict[str, Any]]
) -> dict[str, Any]:
    """A measurement report of ``pod`` in prod-east on the H200 of these tests."""
    return {
        "cluster": "prod-east",
        "pod": pod,
        "device": DEVICE,
        "model": body()["model"],
        "dtype": "bfloat16",
        "packages": packages,
        "results": results,
    }


def wrong(api: httpx.Client, pod: str, packages: dict[str, str], backends: list[str]) -> None:
    measured_select(api, pod, packages)
    results = [
        {"backend": b, "shape": {"seqlens": [4096], "num_heads": 128}, "correct": False}
        for b in backends
    ]
    r = api.post("/v1/measurements", json=report_body(pod, packages, results))
    assert r.status_code == 201 and r.json()["counted"], r.text


def candidate(answer: dict[str, Any], backend: str) -> dict[str, Any]:
    return next(c for c in answer["candidates"] if c["backend"] == backend)


def test_one_pods_wrong_result_is_said_and_two_pods_exclude(api: httpx.Client) -> None:
    r = api.put("/v1/overrides/*", json={"policy": "measured", "note": "measured"})
    assert r.status_code == 200, r.text
    wrong(api, "pod-a", ALL, ["FLASHINFER"])
    answer = measured_select(api, "pod-z", ALL)
    fi = candidate(answer, "FLASHINFER")
    assert fi["valid"] and fi["exclusion"] is None
    assert fi["failures"] == {
        "kind": "measured_failures_below_policy",
        "backend": "FLASHINFER",
        "pods": 1,
        "needed": 2,
        "window_h": 24.0,
    }
    assert any(
        m.startswith("1 of 2 pods needed to exclude FLASHINFER for this situation")
        for m in answer["messages"]
    ), answer["messages"]
    summary = api.get("/v1/measurements/summary").json()["groups"]
    (group,) = [g for g in summary if g["backend"] == "FLASHINFER" and g["failures"]]
    assert group["excluded"] is None
    assert group["not_excluded"].startswith("1 of 2 pods needed to exclude FLASHINFER")

    wrong(api, "pod-b", ALL, ["FLASHINFER"])
    fi = candidate(measured_select(api, "pod-z", ALL), "FLASHINFER")
    assert not fi["valid"] and fi["exclusion"]["pods"] == 2 and fi["failures"] is None


def test_failures_never_leave_a_pod_with_no_valid_backend(api: httpx.Client) -> None:
    r = api.put("/v1/overrides/*", json={"policy": "measured", "note": "measured"})
    assert r.status_code == 200, r.text
    torch_only = {"torch": "2.11.0"}  # FLASH_ATTN and TORCH_SDPA are valid here
    wrong(api, "pod-a", torch_only, ["FLASH_ATTN", "TORCH_SDPA"])
    wrong(api, "pod-b", torch_only, ["FLASH_ATTN", "TORCH_SDPA"])
    wrong(api, "pod-c", torch_only, ["TORCH_SDPA"])
    answer = measured_select(api, "pod-z", torch_only)  # 200, not 409
    assert answer["backend"] == "FLASH_ATTN"  # the fewer failing pods
    assert candidate(answer, "FLASH_ATTN")["failures"]["kind"] == "measured_exclusion_waived"
    assert not candidate(answer, "TORCH_SDPA")["valid"]
    assert any("the one with the fewest failing pods (2 pods" in m for m in answer["messages"])


# ------------------------------------------------------------ reports in one batch


def measurement(pod: str, packages: dict[str, str]) -> MeasurementReport:
    result = {"backend": "FLASH_ATTN", "shape": {"seqlens": [4096], "num_heads": 128},
              "median_ms": 1.0, "tflops": 600.0, "correct": True}  # fmt: skip
    return MeasurementReport.model_validate(report_body(pod, packages, [result]))


def test_a_batch_looks_up_its_pods_stored_decisions_in_one_statement(
    api: httpx.Client,
) -> None:
    """Reports whose decisions are stored (no longer in the log's memory) share one
    read of their pods' newest decisions, and each counts as alone it would: only for
    its own pod's decision, in its situation, asked for with its token."""
    runtime = api.app.state.runtime  # type: ignore[attr-defined]
    answer = measured_select(api, "pod-a", ALL)
    runtime.recorder.settle_for_read()
    asker = runtime.store.decisions.get_decision(answer["decision_id"]).principal
    assert runtime.recorder.logged_decision("prod-east", "pod-a") is None  # stored
    other = {**ALL, "torch": "2.10.0"}
    cases = [
        (measurement("pod-a", ALL), asker, True),
        (measurement("pod-a", other), asker, False),  # another situation
        (measurement("pod-b", ALL), asker, False),  # a pod never decided for
        (measurement("pod-a", ALL), "token:someone-else", False),  # another token
    ]
    reads: list[str] = []
    entered, release = threading.Event(), threading.Event()

    def watch(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO MEASUREMENTS"):
            entered.set()
            assert release.wait(60)
        elif "FROM decisions" in statement:  # one read, whatever its parts
            reads.append(statement)

    writer = runtime.report_writer
    event.listen(runtime.engine, "before_cursor_execute", watch)
    try:
        opener = writer.submit(PendingReport(measurement("pod-z", ALL), new_id(), None, asker))
        assert entered.wait(60)
        reads.clear()
        tickets = []
        for report, who, _ in cases:
            situation = observations_of_report(report, datetime.now(UTC), "r")[0].situation
            tickets.append(writer.submit(PendingReport(report, new_id(), situation, who)))
        release.set()
        opener.wait(60)
        stored = [t.wait(60) for t in tickets]
    finally:
        release.set()
        event.remove(runtime.engine, "before_cursor_execute", watch)
    assert [s is not None and s.counted for s in stored] == [c for *_, c in cases]
    assert len(reads) == 1
