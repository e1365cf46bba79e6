"""Issue 13, item 5 (finding 5): measured evidence that cannot be forged from outside
its scope, through a real server.

The finding: an agent token limited to ``prod-*`` posted two invented pods' reports
(TORCH_SDPA at 99,999 TFLOP/s, every other backend ``correct: false``) and pods in
``dev-victim`` under policy ``measured`` then got TORCH_SDPA. Now:

- a report for a cluster outside the token's scope is 403;
- a figure above the GPU's dense bf16 peak (core/hardware.py) is 422 naming the field;
- a report from a pod without a recorded decision in that cluster for the same
  situation is stored but not counted, and the answer says so;
- even a pod that did boot (so its report counts) sways only its own cluster by
  default; an override's ``trust_clusters`` chooses whose evidence a scope trusts.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import InProcessService

R1 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_heads": 128}
PACKAGES = {"torch": "2.11.0", "flashinfer": "0.7.2", "cudnn": "1.32.0", "flash_attn": "2.8.3"}
OTHERS = ("FLASHINFER", "CUDNN", "FLASH_ATTN", "TRTLLM_RAGGED")


@pytest.fixture
def gpu() -> dict[str, Any]:
    """A device name of the test's own (evidence is per situation)."""
    return {"name": f"NVIDIA H200 #{uuid.uuid4().hex[:6]}", "capability": [9, 0]}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    d = tmp_path_factory.mktemp("evidence")
    s = InProcessService(f"sqlite:///{d / 'sb.db'}").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def admin(service: InProcessService) -> Iterator[httpx.Client]:
    with service.client() as c:
        yield c


@pytest.fixture(scope="module")
def attacker(service: InProcessService, admin: httpx.Client) -> Iterator[httpx.Client]:
    r = admin.post(
        "/v1/tokens", json={"name": "prod-agent", "role": "agent", "clusters": ["prod-*"]}
    )
    assert r.status_code == 201, r.text
    with service.client(r.json()["token"]) as c:
        yield c


def select_body(cluster: str, pod: str, gpu: dict[str, Any]) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "node": "n1",
        "pod": pod,
        "device": gpu,
        "model": {"name": "deepseek-ai/DeepSeek-R1", **R1},
        "dtype": "bfloat16",
        "packages": PACKAGES,
    }


def forged(cluster: str, pod: str, gpu: dict[str, Any], sdpa_tflops: float) -> dict[str, Any]:
    """The finding's report: TORCH_SDPA fastest, every other backend wrong."""
    results = [
        {
            "backend": "TORCH_SDPA",
            "shape": {"seqlens": [4096], "num_heads": 128},
            "median_ms": 0.01,
            "tflops": sdpa_tflops,
            "correct": True,
        }
    ] + [
        {
            "backend": b,
            "shape": {"seqlens": [4096], "num_heads": 128},
            "correct": False,
            "error": "max abs err 9.9",
        }
        for b in OTHERS
    ]
    return {
        "cluster": cluster,
        "pod": pod,
        "device": gpu,
        "model": R1,
        "dtype": "bfloat16",
        "packages": PACKAGES,
        "results": results,
    }


def measured(admin: httpx.Client, cluster: str, **extra: Any) -> None:
    r = admin.put(f"/v1/overrides/{cluster}", json={"policy": "measured", "note": "data", **extra})
    assert r.status_code == 200, r.text


def victim_choice(admin: httpx.Client, cluster: str, gpu: dict[str, Any]) -> dict[str, Any]:
    r = admin.post("/v1/select", json=select_body(cluster, f"victim-{uuid.uuid4().hex[:4]}", gpu))
    assert r.status_code == 200, r.text
    return r.json()


def test_reports_only_for_clusters_in_scope(attacker: httpx.Client, gpu: dict[str, Any]) -> None:
    r = attacker.post("/v1/measurements", json=forged("dev-victim", "fake-1", gpu, 500))
    assert r.status_code == 403, r.text


@pytest.mark.parametrize(
    ("device", "figure", "ok"),
    [
        ("NVIDIA H200", 99_999.0, False),
        ("NVIDIA H200", 1200.0, False),
        ("NVIDIA H100 80GB HBM3", 1000.0, False),
        ("NVIDIA H100 80GB HBM3", 900.0, True),
        ("NVIDIA A100-SXM4-80GB", 400.0, False),
        ("NVIDIA A100-SXM4-80GB", 250.0, True),
        ("NVIDIA B200", 2000.0, True),
        ("NVIDIA L40S", 500.0, False),
        ("Some Future GPU", 4000.0, True),
        ("Some Future GPU", 6000.0, False),
    ],
)
def test_figures_above_the_gpu_peak_are_refused(
    attacker: httpx.Client, device: str, figure: float, ok: bool
) -> None:
    body = forged("prod-east", "bench-x", {"name": device, "capability": [9, 0]}, figure)
    r = attacker.post("/v1/measurements", json=body)
    if ok:
        assert r.status_code == 201, r.text
    else:
        assert r.status_code == 422, r.text
        (problem,) = r.json()["detail"]
        assert problem["loc"] == ["body", "results", 0, "tflops"]
        # above every GPU's peak the schema says so (le=5000), below it the named GPU's
        assert "peak" in problem["msg"] or "less than or equal to 5000" in problem["msg"]


def test_invented_pods_are_stored_not_counted(
    admin: httpx.Client, attacker: httpx.Client, gpu: dict[str, Any]
) -> None:
    measured(admin, "dev-victim")
    measured(admin, "prod-east")
    for pod in ("fake-1", "fake-2"):
        for _ in range(2):
            r = attacker.post("/v1/measurements", json=forged("prod-east", pod, gpu, 900))
            assert r.status_code == 201, r.text
            answer = r.json()
            assert answer["counted"] is False
            assert "no decision recorded for this token" in answer["not_counted_reason"]
    for cluster in ("dev-victim", "prod-east"):
        choice = victim_choice(admin, cluster, gpu)
        assert choice["backend"] != "TORCH_SDPA", choice
        assert choice["source"] == "priority"
    groups = admin.get("/v1/measurements/summary").json()["groups"]
    assert not [g for g in groups if g["device"] == gpu["name"]]


def test_a_booted_pod_sways_only_its_own_cluster(
    admin: httpx.Client, attacker: httpx.Client, gpu: dict[str, Any]
) -> None:
    """The attacker boots its invented pods first (select as them, in its own scope):
    their reports now count, for prod-east only."""
    victim, own = f"dev-victim-{uuid.uuid4().hex[:4]}", f"prod-{uuid.uuid4().hex[:4]}"
    measured(admin, victim)
    measured(admin, own)
    for pod in ("fake-1", "fake-2"):
        r = attacker.post("/v1/select", json=select_body(own, pod, gpu))
        assert r.status_code == 200, r.text
        for _ in range(2):
            r = attacker.post("/v1/measurements", json=forged(own, pod, gpu, 900))
            assert r.status_code == 201, r.text
            assert r.json()["counted"] is True, r.text
    # the reporter's own cluster believes it (what a prod-* agent token may decide)
    assert victim_choice(admin, own, gpu)["backend"] == "TORCH_SDPA"
    # another cluster does not: neither the forged winner nor the forged failures
    choice = victim_choice(admin, victim, gpu)
    assert (choice["backend"], choice["source"]) == ("FLASH_ATTN", "priority"), choice
    assert all(c["valid"] for c in choice["candidates"] if c["backend"] == "FLASHINFER")
    # unless it says it trusts that cluster
    measured(admin, victim, trust_clusters=["prod-*"])
    assert victim_choice(admin, victim, gpu)["backend"] == "TORCH_SDPA"
    # a fleet-wide trust list applies to every cluster without its own
    other = f"dev-other-{uuid.uuid4().hex[:4]}"
    measured(admin, "*", trust_clusters=["prod-*"])
    try:
        assert victim_choice(admin, other, gpu)["backend"] == "TORCH_SDPA"
    finally:
        assert admin.delete("/v1/overrides/*").status_code == 200
    assert victim_choice(admin, other, gpu)["source"] == "priority"


def test_trust_clusters_is_validated(admin: httpx.Client) -> None:
    for bad in ([], ["UPPER"], ["a b"], "prod-*"):
        r = admin.put(
            "/v1/overrides/x1",
            json={"policy": "measured", "note": "n", "trust_clusters": bad},
        )
        assert r.status_code == 422, (bad, r.text)
