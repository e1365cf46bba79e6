"""Guarded rollouts on a simulated fleet of 1,000 named pods, through two
real replicas on one PostgreSQL schema: the stage is the same on both, raising the
percentage keeps every pod, guards halt the rollout on both replicas, steps promote it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mla_switchboard.core.schemas import Rollout
from mla_switchboard.core.stages import stage_bucket, stage_buckets

from tests.conftest import ServiceProcess, post_all, start_together
from tests.reliability.conftest import terminate_all, wait_until
from tests.service.test_select_decisions import ALL, body

pytestmark = [pytest.mark.postgres, pytest.mark.serial]

PODS = 1000
HALT_BOUND_S = 1.5  # the contract is 1 s (0.5 s poll + reload); a little room for noise


@pytest.fixture(scope="module")
def replicas(
    pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    d = tmp_path_factory.mktemp("rollouts")
    a, b = start_together(d, ServiceProcess(pg_url), ServiceProcess(pg_url))
    yield a, b
    terminate_all([a, b])


def device() -> dict[str, Any]:
    return {"name": f"NVIDIA H200 #{uuid.uuid4().hex[:6]}", "capability": [9, 0]}


def pick(c: httpx.Client, cluster: str, pod: str, dev: dict[str, Any]) -> dict[str, Any]:
    payload = body(cluster=cluster, pod=pod, packages=ALL)
    payload["device"] = dev
    r = c.post("/v1/select", json=payload)
    assert r.status_code == 200, r.text
    return r.json()


def staged(service: ServiceProcess, cluster: str, dev: dict[str, Any], backend: str) -> set[str]:
    """The fleet's pods that ``service`` answers ``backend``, all of them asking at
    once (over a few keep-alive connections, as pods booting together do)."""
    pods = [f"r1-{i}" for i in range(PODS)]
    bodies = ({**body(cluster=cluster, pod=pod, packages=ALL), "device": dev} for pod in pods)
    answers = post_all(service.port, "/v1/select", bodies, conns=8)
    assert [code for code, _, _ in answers] == [200] * PODS, {a[0] for a in answers}
    backends = [json.loads(content)["backend"] for _, _, content in answers]
    return {pod for pod, got in zip(pods, backends, strict=True) if got == backend}


def in_stage(cluster: str, rollout: Rollout) -> set[str]:
    """The fleet's pods in the stage of ``rollout``, from the hashes alone: a stage is
    exact for a given rollout id, so the test asserts it exactly rather than a share
    near the percentage (which a random id and cluster would put out of any bound now
    and then)."""
    buckets = stage_buckets(rollout)
    pods = (f"r1-{i}" for i in range(PODS))
    return {pod for pod in pods if stage_bucket(cluster, pod) in buckets}


def put(c: httpx.Client, cluster: str, *, dry_run: bool = False, **spec: Any) -> httpx.Response:
    params = {"dry_run": "true"} if dry_run else None
    return c.put(f"/v1/overrides/{cluster}", params=params, json={"note": "staged", **spec})


def test_stage_is_stable_across_replicas_and_percentages(replicas) -> None:  # type: ignore[no-untyped-def]
    a, b = replicas
    cluster, dev = f"ro-{uuid.uuid4().hex[:6]}", device()
    with a.client() as ca, b.client() as cb:
        assert staged(a, cluster, dev, "FLASHINFER") == set()  # everyone on FLASH_ATTN
        dry = put(ca, cluster, force="FLASHINFER", rollout={"percent": 10}, dry_run=True)
        assert dry.status_code == 200, dry.text
        predicted = dry.json()["preview"]["pods_changed"]
        r = put(ca, cluster, force="FLASHINFER", rollout={"percent": 10})
        assert r.status_code == 200, r.text
        rev = r.json()["override"]["revision"]
        rollout = Rollout.model_validate(r.json()["override"]["rollout"])
        assert rollout.state == "active"
        wait_until(lambda: pick(cb, cluster, "probe", dev)["overrides"] != [], 3, what="B sees it")
        ten_a = staged(a, cluster, dev, "FLASHINFER")
        ten_b = staged(b, cluster, dev, "FLASHINFER")
        assert ten_a == ten_b
        assert ten_a == in_stage(cluster, rollout)  # the pods the rollout's buckets hold
        assert predicted == len(ten_a)  # the dry run counted exactly the stage
        (progress,) = [
            x
            for x in cb.get("/v1/selections/summary").json()["rollouts"]
            if x["cluster"] == cluster
        ]
        assert progress["pods_in_scope"] == PODS + 1  # and the probe
        assert abs(progress["pods_in_stage"] - len(ten_a)) <= 1
        assert progress["pods_booted_with_it"] == progress["pods_in_stage"]
        assert progress["rollout"]["percent"] == 10 and progress["failures"] == 0
        inside = pick(cb, cluster, sorted(ten_a)[0], dev)
        assert f"In the 10 % rollout of override {cluster} rev {rev}." in inside["messages"]
        assert inside["overrides"][0]["rollout"]["in_stage"] is True
        outside = pick(
            cb, cluster, next(f"r1-{i}" for i in range(PODS) if f"r1-{i}" not in ten_a), dev
        )
        assert any(
            m.startswith(f"Not in the 10 % rollout of override {cluster}")
            for m in outside["messages"]
        )
        assert outside["backend"] == "FLASH_ATTN" and outside["overrides"][0]["effect"] == "none"
        nameless = {**body(cluster=cluster, packages=ALL), "device": dev}
        nameless.pop("pod")
        assert ca.post("/v1/select", json=nameless).json()["backend"] == "FLASH_ATTN"

        r = put(ca, cluster, force="FLASHINFER", rollout={"percent": 50})
        assert r.status_code == 200, r.text
        rollout = Rollout.model_validate(r.json()["override"]["rollout"])
        wait_until(
            lambda: "50 %" in " ".join(pick(cb, cluster, sorted(ten_a)[0], dev)["messages"]),
            3,
            what="B sees 50 %",
        )
        fifty = staged(b, cluster, dev, "FLASHINFER")
        assert ten_a <= fifty and fifty == in_stage(cluster, rollout)


def test_one_failure_from_a_stage_pod_halts_it_on_both_replicas(replicas) -> None:  # type: ignore[no-untyped-def]
    a, b = replicas
    cluster, dev = f"ro-{uuid.uuid4().hex[:6]}", device()
    with a.client() as ca, b.client() as cb:
        assert put(ca, cluster, force="FLASHINFER", rollout={"percent": 20}).status_code == 200
        pod = next(
            f"r1-{i}"
            for i in range(200)
            if pick(ca, cluster, f"r1-{i}", dev)["backend"] == "FLASHINFER"
        )
        decision = pick(ca, cluster, pod, dev)
        wait_until(
            lambda: pick(cb, cluster, pod, dev)["backend"] == "FLASHINFER", 3, what="B staged"
        )
        r = ca.post(
            f"/v1/selections/{decision['decision_id']}/failure",
            json={
                "backend": "FLASHINFER",
                "error": "RuntimeError: illegal memory access\n  at ...",
            },
        )
        assert r.status_code == 202, r.text
        start = time.monotonic()
        assert pick(ca, cluster, pod, dev)["backend"] == "FLASH_ATTN"  # this replica: at once
        took = wait_until(
            lambda: pick(cb, cluster, pod, dev)["backend"] == "FLASH_ATTN",
            5,
            interval=0.02,
            what="B halted",
        )
        ms = (time.monotonic() - start) * 1000
        print(f"\nhalt honoured by replica B {ms:.0f} ms after the report")
        assert took <= HALT_BOUND_S
        shown = cb.get(f"/v1/overrides/{cluster}").json()["rollout"]
        assert shown["state"] == "halted"
        assert (
            f"{cluster}/{pod} ran FLASHINFER: RuntimeError: illegal memory access"
            in shown["halted_reason"]
        )
        entry = ca.get("/v1/audit", params={"target": cluster, "action": "rollout.failure"}).json()[
            "items"
        ][0]
        assert entry["actor"] == "switchboard" and entry["after"]["rollout"]["state"] == "halted"
        assert (
            'switchboard_rollout_changes_total{change="halt"}' in httpx.get(a.url + "/metrics").text
        )
        again = pick(cb, cluster, pod, dev)
        assert any("is halted" in m for m in again["messages"])
        # an admin resumes it (audited like any write)
        assert put(ca, cluster, force="FLASHINFER", rollout={"percent": 20}).status_code == 200
        assert ca.get(f"/v1/overrides/{cluster}").json()["rollout"]["state"] == "active"


def test_stage_pods_measuring_a_slowdown_halt_it_with_the_figures(replicas) -> None:  # type: ignore[no-untyped-def]
    a, _ = replicas
    cluster, dev = f"ro-{uuid.uuid4().hex[:6]}", device()
    with a.client() as ca:
        assert (
            put(
                ca, cluster, force="CUDNN", rollout={"percent": 30, "max_slowdown_pct": 5}
            ).status_code
            == 200
        )
        stage = [
            f"r1-{i}" for i in range(100) if pick(ca, cluster, f"r1-{i}", dev)["backend"] == "CUDNN"
        ]
        assert len(stage) >= 2
        for pod in stage[:2]:
            # each pod under its own token: one token is one evidence source, however
            # many pods it names (docs/security.md)
            made = ca.post("/v1/tokens", json={"name": pod, "role": "agent"})
            assert made.status_code == 201, made.text
            own = a.client(made.json()["token"])
            pick(own, cluster, pod, dev)
            for sample in range(2):
                r = own.post(
                    "/v1/measurements",
                    json={
                        "cluster": cluster,
                        "pod": pod,
                        "device": dev,
                        "model": body()["model"],
                        "dtype": "bfloat16",
                        "packages": ALL,
                        "results": [
                            {"backend": b, "shape": {"seqlens": [4096], "num_heads": 128},
                             "median_ms": 1.0, "tflops": t + sample, "correct": True}
                            for b, t in (("CUDNN", 400.0), ("FLASH_ATTN", 600.0))
                        ],
                    },
                )  # fmt: skip
                assert r.status_code == 201, r.text
        shown = ca.get(f"/v1/overrides/{cluster}").json()["rollout"]
        assert shown["state"] == "halted", shown
        reason = shown["halted_reason"]
        # halted at the first moment the evidence was enough: 3 samples from 2 pods
        assert "CUDNN at 400.0 TFLOP/s median (3 samples from 2 pods" in reason
        assert "FLASH_ATTN at 600.0 without the override" in reason and "33.3 % slower" in reason
        assert pick(ca, cluster, stage[0], dev)["backend"] == "FLASH_ATTN"


def test_steps_promote_by_themselves_when_nothing_fires(replicas) -> None:  # type: ignore[no-untyped-def]
    a, b = replicas
    cluster, dev = f"ro-{uuid.uuid4().hex[:6]}", device()
    with a.client() as ca:
        spec = {
            "force": "FLASHINFER",
            "rollout": {"percent": 10, "steps": [10, 50, 100], "step_every": "1s"},
        }
        assert put(ca, cluster, **spec).status_code == 200
        wait_until(
            lambda: ca.get(f"/v1/overrides/{cluster}").json()["rollout"]["state"] == "complete",
            10,
            what="complete",
        )
        entries = ca.get(
            "/v1/audit", params={"target": cluster, "action": "rollout.promote"}
        ).json()["items"]
        notes = sorted(e["note"] for e in entries)
        assert notes == [
            "promoted from 10 % to 50 %: no guard fired during the 1s step",
            "promoted from 50 % to 100 %: no guard fired during the 1s step",
        ]
        assert all(e["actor"] == "switchboard" for e in entries)
    with b.client() as cb:
        wait_until(
            lambda: pick(cb, cluster, "r1-1", dev)["backend"] == "FLASHINFER", 3, what="B complete"
        )
