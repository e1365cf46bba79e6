"""Evidence with a long history does not slow decisions: 64,000 results in one
situation, a new report, another replica's report, and selects from this cluster and
another one, answered within 50 ms (in-process app, real SQLite file).

On two shared cores one answer in a hundred may be late for reasons outside the service
(another process's burst, the collector), so the stream of selects allows 1% over 50 ms
and none over 250 ms: the stall this guards against (the index rebuilt on the event loop)
took seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from mla_switchboard.core.evidence import packages_key
from mla_switchboard.service.config import Settings
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.store.models import MeasurementRow, Meta
from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from tests.conftest import make_inprocess_client
from tests.service.test_select_decisions import ALL, body
from tests.spill_paths import default_spill_path

pytestmark = pytest.mark.serial

DEVICE = {"name": "NVIDIA H200", "capability": [9, 0]}
RESULTS = 64_000
PODS = 2_000
LIMIT_S = 0.050
STALL_S = 0.250  # no single answer may wait this long, noise or not


def _row(i: int, cluster: str, at: datetime, report_id: str) -> dict[str, Any]:
    fast = i % 2 == 0
    return {
        "report_id": report_id,
        "at": at,
        "cluster": cluster,
        "pod": f"bench-{i % PODS}",
        "device_name": DEVICE["name"],
        "capability": "9.0",
        "dims": "128,64,128",
        "num_heads": 128,
        "dtype": "bfloat16",
        "packages": packages_key(ALL),
        "backend": "FLASHINFER" if fast else "CUDNN",
        "impl": "test",
        "shape": "{}",
        "median_ms": 1.0,
        "tflops": (600.0 if fast else 400.0) + i % 7,
        "correct": True,
        "engine": "switchboard",
        "counted": True,
    }


def _history(url: str) -> None:
    """64,000 counted results of one situation from 2,000 pods of prod-east, over 30
    days, as reports of 32 results."""
    runtime = Runtime(Settings(database_url=url, spill_path=default_spill_path(url)))
    runtime.prepare_store()
    start = datetime.now(UTC) - timedelta(days=29)
    rows = [
        _row(i, "prod-east", start + timedelta(seconds=i * 30), f"history-{i // 32:06d}")
        for i in range(RESULTS)
    ]
    with Session(runtime.engine) as s, s.begin():
        s.execute(insert(MeasurementRow), rows)
    runtime.engine.dispose()


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    url = f"sqlite:///{tmp_path_factory.mktemp('scale') / 'sb.db'}"
    _history(url)
    with make_inprocess_client(url) as client:  # type: ignore[attr-defined]
        yield client


def _select(c: httpx.Client, cluster: str, pod: str) -> tuple[float, dict[str, Any]]:
    payload = body(cluster=cluster, pod=pod, packages=ALL)
    payload["device"] = DEVICE
    started = time.perf_counter()
    r = c.post("/v1/select", json=payload)
    took = time.perf_counter() - started
    assert r.status_code == 200, r.text
    return took, r.json()


def test_selects_stay_fast_with_64000_results_in_one_situation(app: httpx.Client) -> None:
    c = app
    for cluster in ("prod-east", "prod-west"):
        r = c.put(f"/v1/overrides/{cluster}", json={"policy": "measured", "note": "scale"})
        assert r.status_code == 200, r.text
    _, answer = _select(c, "prod-east", "r1-0")
    assert answer["source"] == "measured", answer["messages"]
    assert answer["evidence"]["pods"] == PODS // 2  # each pod measured one backend
    assert answer["evidence"]["samples"] == 8 * PODS // 2  # 16 each, 8 most recent count
    _select(c, "prod-west", "w-0")

    # a new report on this replica: the next decisions are cache misses
    _select(c, "prod-east", "bench-new")
    r = c.post(
        "/v1/measurements",
        json={
            "cluster": "prod-east",
            "pod": "bench-new",
            "device": DEVICE,
            "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
            "dtype": "bfloat16",
            "packages": ALL,
            "results": [
                {
                    "backend": "CUDNN",
                    "shape": {"seqlens": [4096], "num_heads": 128},
                    "median_ms": 1.0,
                    "tflops": 410.0,
                    "correct": True,
                }
            ]
            * 256,
        },
    )
    assert r.status_code == 201 and r.json()["counted"], r.text
    took_here, answer = _select(c, "prod-east", "r1-1")
    took_other, _ = _select(c, "prod-west", "w-1")
    assert answer["source"] == "measured"
    print(f"after a report: {took_here * 1000:.1f} ms here, {took_other * 1000:.1f} ms other")
    assert took_here < LIMIT_S and took_other < LIMIT_S, (took_here, took_other)

    # another replica's report of 256 results: this replica reads only those rows, in
    # its evidence thread, while selects go on
    runtime: Runtime = c.app.state.runtime  # type: ignore[attr-defined]
    now = datetime.now(UTC)
    with Session(runtime.engine) as s, s.begin():
        s.execute(
            insert(MeasurementRow),
            [_row(i, "prod-east", now, "other-replica") for i in range(256)],
        )
        s.execute(update(Meta).where(Meta.key == "evidence_version").values(value=Meta.value + 1))
    before = runtime.publisher.current().tag
    took_all: list[float] = []
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        n = len(took_all)
        took, _ = _select(c, "prod-west" if n % 2 else "prod-east", f"p-{n}")
        took_all.append(took)
    assert runtime.publisher.current().tag != before  # the rows were applied meanwhile
    late = [t for t in took_all if t >= LIMIT_S]
    print(
        f"{len(took_all)} selects while another replica's report was applied: "
        f"worst {max(took_all) * 1000:.1f} ms, {len(late)} over {LIMIT_S * 1000:.0f} ms"
    )
    assert len(took_all) >= 50, len(took_all)  # 2 s of selects, not a handful
    assert len(late) <= len(took_all) // 100, sorted(took_all)[-5:]
    assert max(took_all) < STALL_S, max(took_all)
