"""The summary read right after a fleet-wide override is put, then deleted, is the
summary a fresh replica works out on the same store: what a replica kept of each
cluster's figures (``service/fleet/parts.py``), or carried over from the change's own
preview, is never an answer a cold read would not give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import InProcessService
from tests.service.test_measured import report, select

CLUSTERS = [f"fc-{i}" for i in range(6)]
OTHER_GPU = {"name": "NVIDIA H100", "capability": [9, 0]}


def boot(c: httpx.Client) -> None:
    """Pods of two devices in every cluster; evidence where FLASHINFER is fastest in
    two clusters (a deny of it moves their regret); one cluster with an override of its
    own under policy measured, one with a staged rollout of its own."""
    for cluster in CLUSTERS:
        for i in range(4):
            select(c, cluster, pod=f"p-{i}")
            select(c, cluster, pod=f"q-{i}", device=OTHER_GPU)
    for cluster in CLUSTERS[:2]:
        for p in range(2):
            for sample in range(2):
                speeds = {"FLASHINFER": 600.0, "FLASH_ATTN": 200.0, "CUDNN": 100.0}
                report(c, cluster, f"bench-{p}", [(b, t + sample, True) for b, t in speeds.items()])
    put(c, CLUSTERS[0], {"policy": "measured", "note": "let data decide"})
    put(c, CLUSTERS[3], {"force": "CUDNN", "note": "staged", "rollout": {"percent": 50}})


def put(c: httpx.Client, scope: str, body: dict[str, Any]) -> None:
    r = c.put(f"/v1/overrides/{scope}", json=body)
    assert r.status_code == 200, r.text


def summary(c: httpx.Client) -> dict[str, Any]:
    r = c.get("/v1/selections/summary")
    assert r.status_code == 200, r.text
    return r.json()


def cold_summary(url: str) -> dict[str, Any]:
    with InProcessService(url) as fresh, fresh.client() as c:
        return summary(c)


@pytest.mark.parametrize("change", [{"deny": ["FLASHINFER"]}, {"policy": "measured"}])
def test_summary_after_a_fleet_change_is_a_cold_reads(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    url = f"sqlite:///{tmp_path / 'sb.db'}"
    with InProcessService(url) as server, server.client() as c:
        boot(c)
        before = summary(c)  # every cluster's parts kept
        assert before == cold_summary(url)
        dry = c.put("/v1/overrides/*?dry_run=true", json={**change, "note": "dry"})
        assert dry.status_code == 200, dry.text
        put(c, "*", {**change, "note": "fleet-wide"})
        after_put = summary(c)
        assert after_put == cold_summary(url)
        assert after_put != before or change.get("policy")  # the deny moves a figure
        r = c.delete("/v1/overrides/*")
        assert r.status_code in (200, 204), r.text
        after_delete = summary(c)
        assert after_delete == cold_summary(url)
        assert after_delete == before
