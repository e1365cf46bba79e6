"""Measured selection: ranking, thresholds, ties, stale evidence, failures
excluding a backend, overrides beating evidence, and regret; through the app's HTTP API.

Evidence is per situation (device, capability, dims, dtype, packages) and, by default,
trusted only within the reporting pod's cluster; each test measures on a
GPU name of its own as well."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import InProcessService
from tests.service.test_select_decisions import ALL, body

H200 = {"name": "NVIDIA H200", "capability": [9, 0]}


@pytest.fixture(autouse=True)
def own_situation() -> Iterator[None]:
    """A device name of the test's own, so its evidence is not shared with others;
    put back afterwards: other modules import this module's helpers, which read the
    name, and a name left behind made their selects and reports disagree on the
    situation (their reports were then stored as not counted)."""
    global H200
    kept = H200
    H200 = {"name": f"NVIDIA H200 #{uuid.uuid4().hex[:6]}", "capability": [9, 0]}
    yield
    H200 = kept


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    d = tmp_path_factory.mktemp("measured")
    # one pod's failure excludes here: these tests are about what an exclusion does (the
    # default of two pods: tests/core/test_failure_policy.py, test_report_costs.py)
    with InProcessService(f"sqlite:///{d / 'sb.db'}", failure_min_pods=1) as service:
        yield service


@pytest.fixture
def c(server: InProcessService) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def fresh() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


def report(
    c: httpx.Client,
    cluster: str,
    pod: str,
    results: list[tuple[str, float | None, bool]],
    *,
    device: dict[str, Any] | None = None,
    packages: dict[str, str] = ALL,
) -> None:
    device = device or H200
    # a report counts only from a pod with a decision in its cluster for the same
    # situation: the bench pod boots like any other first
    select(c, cluster, pod=pod, device=device, packages=packages)
    r = c.post(
        "/v1/measurements",
        json={
            "cluster": cluster,
            "pod": pod,
            "device": device,
            "model": {
                "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64,
                "v_head_dim": 128,
                "num_heads": 128,
            },
            "dtype": "bfloat16",
            "packages": packages,
            "results": [
                {
                    "backend": b,
                    "impl": "test",
                    "shape": {"seqlens": [4096], "num_heads": 128},
                    "median_ms": None if t is None else 1.0,
                    "tflops": t,
                    "correct": ok,
                    "error": None if ok else "max abs err 3.1 > 0.02",
                }
                for b, t, ok in results
            ],
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["counted"] is True, r.text


def measured_policy(c: httpx.Client, cluster: str) -> None:
    r = c.put(f"/v1/overrides/{cluster}", json={"policy": "measured", "note": "let data decide"})
    assert r.status_code == 200, r.text


def select(c: httpx.Client, cluster: str, **kw: Any) -> dict[str, Any]:
    device = kw.pop("device", H200)
    payload = body(cluster=cluster, packages=kw.pop("packages", ALL), **kw)
    payload["device"] = device
    r = c.post("/v1/select", json=payload)
    assert r.status_code == 200, r.text
    return r.json()


def seed(
    c: httpx.Client,
    cluster: str,
    pods: int = 2,
    packages: dict[str, str] = ALL,
    **speeds: float,
) -> None:
    for p in range(pods):
        for sample in range(2):  # 2 samples per pod: 4 >= 3 with 2 pods
            report(
                c,
                cluster,
                f"bench-{p}",
                [(b, t + sample, True) for b, t in speeds.items()],
                packages=packages,
            )


def test_fastest_correct_backend_wins(c: httpx.Client) -> None:
    cluster = fresh()
    seed(c, cluster, FLASHINFER=650, CUDNN=540, FLASH_ATTN=230)
    assert select(c, cluster)["backend"] == "FLASH_ATTN"  # policy still priority
    measured_policy(c, cluster)
    a = select(c, cluster)
    assert (a["backend"], a["source"]) == ("FLASHINFER", "measured")
    ev = a["evidence"]
    assert ev["samples"] == 4 and ev["pods"] == 2
    assert ev["median_tflops"] == pytest.approx(650.5)
    assert ev["runner_up"] == "CUDNN" and ev["runner_up_tflops"] == pytest.approx(540.5)
    assert ev["margin"] == pytest.approx((650.5 - 540.5) / 540.5, rel=1e-3)
    assert any("measured" in m for m in a["messages"])


def test_thresholds_samples_and_pods(c: httpx.Client) -> None:
    cluster = fresh()
    measured_policy(c, cluster)
    # 4 samples but from ONE pod: not enough
    seed(c, cluster, pods=1, FLASHINFER=650)
    report(c, cluster, "bench-0", [("FLASHINFER", 651, True), ("FLASHINFER", 652, True)])
    a = select(c, cluster)
    assert (a["backend"], a["source"]) == ("FLASH_ATTN", "priority")
    assert any("too thin" in m for m in a["messages"])
    # a second pod, but only 1 more sample still gives >= 3 samples from 2 pods
    report(c, cluster, "bench-1", [("FLASHINFER", 640, True)])
    assert select(c, cluster)["source"] == "measured"


def test_evidence_is_per_situation(c: httpx.Client) -> None:
    cluster = fresh()
    measured_policy(c, cluster)
    seed(c, cluster, FLASHINFER=650, FLASH_ATTN=230)
    # another FlashInfer version, another GPU: the evidence does not carry over
    newer = {**ALL, "flashinfer": "0.8.0"}
    assert select(c, cluster, packages=newer)["source"] == "priority"
    h100 = select(c, cluster, device={"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]})
    assert h100["source"] == "priority"


def test_valid_backends_only_and_not_only_listed(c: httpx.Client) -> None:
    cluster = fresh()
    measured_policy(c, cluster)
    seed(c, cluster, FLASHINFER=650, CUDNN=540, FLASH_ATTN=230)
    # CUDNN is not in Hopper's priority list, but it can win by evidence; FLASHINFER,
    # faster, is not valid on a pod without the package and is not chosen there.
    no_flashinfer = {"torch": ALL["torch"], "cudnn": ALL["cudnn"], "flash_attn": "2.8.3"}
    seed(c, cluster, packages=no_flashinfer, CUDNN=540, FLASH_ATTN=230)
    a = select(c, cluster, packages=no_flashinfer)
    assert (a["backend"], a["source"]) == ("CUDNN", "measured")


def test_failed_correctness_excludes_backend(c: httpx.Client) -> None:
    cluster = fresh()
    measured_policy(c, cluster)
    seed(c, cluster, FLASHINFER=650, CUDNN=540)
    report(c, cluster, "bench-9", [("FLASHINFER", None, False)])  # wrong once: never chosen
    a = select(c, cluster)
    assert (a["backend"], a["source"]) == ("CUDNN", "measured")
    summary = c.get("/v1/measurements/summary").json()["groups"]
    (fi,) = [g for g in summary if g["backend"] == "FLASHINFER" and g["failures"] == 1]
    assert fi["samples"] == 4 and fi["pods"] == 2


def test_build_failure_on_matching_pod_excludes_backend(c: httpx.Client) -> None:
    cluster = fresh()
    seed(c, cluster, FLASHINFER=650, CUDNN=540)
    measured_policy(c, cluster)
    chosen = select(c, cluster)
    assert chosen["backend"] == "FLASHINFER"
    r = c.post(
        f"/v1/selections/{chosen['decision_id']}/failure",
        json={"backend": "FLASHINFER", "error": "JIT compile failed"},
    )
    assert r.status_code == 202
    assert select(c, cluster)["backend"] == "CUDNN"


def test_ties_break_by_table_order(c: httpx.Client) -> None:
    cluster = fresh()
    measured_policy(c, cluster)
    seed(c, cluster, CUDNN=600, FLASHINFER=600)
    a = select(c, cluster)
    assert a["backend"] == "FLASHINFER"  # FLASHINFER precedes CUDNN in the backend table
    assert a["evidence"]["margin"] == 0


def test_overrides_beat_evidence(c: httpx.Client) -> None:
    cluster = fresh()
    seed(c, cluster, FLASHINFER=650, CUDNN=540, FLASH_ATTN=230)
    c.put(
        f"/v1/overrides/{cluster}",
        json={"policy": "measured", "deny": ["FLASHINFER"], "note": "incident"},
    )
    assert select(c, cluster)["backend"] == "CUDNN"
    c.put(
        f"/v1/overrides/{cluster}",
        json={"policy": "measured", "force": "FLASH_ATTN", "note": "pin"},
    )
    a = select(c, cluster)
    assert (a["backend"], a["source"]) == ("FLASH_ATTN", "override")
    # and a pod's valid request still beats evidence
    c.put(f"/v1/overrides/{cluster}", json={"policy": "measured", "note": "data"})
    assert select(c, cluster, requested_backend="CUDNN")["source"] == "requested"


def test_fleet_policy_and_cluster_opt_out(c: httpx.Client) -> None:
    a_cluster, b_cluster = fresh(), fresh()
    seed(c, a_cluster, FLASHINFER=650, FLASH_ATTN=230)
    try:
        c.put("/v1/overrides/*", json={"policy": "measured", "note": "fleet-wide"})
        c.put(f"/v1/overrides/{b_cluster}", json={"policy": "priority", "note": "opt out"})
        assert select(c, a_cluster)["source"] == "measured"
        assert select(c, b_cluster)["source"] == "priority"
    finally:
        c.delete("/v1/overrides/*")


def test_regret_in_summary(c: httpx.Client) -> None:
    cluster = fresh()
    seed(c, cluster, FLASHINFER=600, FLASH_ATTN=200)
    for i in range(3):  # three pods on the seed choice
        select(c, cluster, pod=f"serve-{i}")
    regret = c.get("/v1/selections/summary").json()["regret"][cluster]
    # 3 serving pods and the 2 bench pods (they boot too): at 200.5 vs 600.5 possible
    assert regret["pods_measured"] == 5 and regret["pods_on_best"] == 0
    assert regret["throughput_lost_pct"] == pytest.approx(100 * (1 - 200.5 / 600.5), abs=0.01)
    assert regret["best_alternatives"] == {"FLASHINFER": 5}
    measured_policy(c, cluster)
    for pod in ["serve-0", "serve-1", "serve-2", "bench-0", "bench-1"]:
        select(c, cluster, pod=pod)
    regret = c.get("/v1/selections/summary").json()["regret"][cluster]
    assert regret["throughput_lost_pct"] == 0 and regret["pods_on_best"] == 5


def test_measurement_validation(c: httpx.Client) -> None:
    ok = {
        "cluster": "x",
        "pod": "p",
        "device": H200,
        "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
        "dtype": "bf16",
        "results": [
            {
                "backend": "CUDNN",
                "shape": {"seqlens": [8], "num_heads": 16},
                "median_ms": 1,
                "tflops": 1,
                "correct": True,
            }
        ],
    }
    assert c.post("/v1/measurements", json=ok).status_code == 201
    for bad in (
        {**ok, "results": []},
        {**ok, "results": [{**ok["results"][0], "backend": "FA9"}]},
        {**ok, "results": [{**ok["results"][0], "tflops": -1}]},
        {**ok, "results": [{**ok["results"][0], "tflops": None}]},  # correct needs a speed
        {**ok, "results": [{**ok["results"][0], "shape": {"seqlens": [0], "num_heads": 16}}]},
        {**ok, "cluster": "BAD"},
    ):
        r = c.post("/v1/measurements", json=bad)
        assert r.status_code == 422, (bad, r.text)


def test_stale_evidence_ages_out(
    inprocess_factory: type[InProcessService], sqlite_url: str
) -> None:
    window_s = 2.0
    service = inprocess_factory(
        sqlite_url, env={"SWITCHBOARD_MEASURED_MAX_AGE_DAYS": str(window_s / 86400)}
    ).start()
    with service.client() as c:
        cluster = fresh()
        measured_policy(c, cluster)
        seed(c, cluster, FLASHINFER=650)
        assert select(c, cluster)["source"] == "measured"
        time.sleep(window_s + 0.5)
        # the store is re-read within the poll interval after any new evidence
        report(c, cluster, "other", [("CUDNN", 500, True)])
        deadline = time.monotonic() + 5
        while (a := select(c, cluster))["source"] == "measured" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (a["backend"], a["source"]) == ("FLASH_ATTN", "priority")


def test_retried_report_is_stored_once(c: httpx.Client) -> None:
    doc = {
        "report_id": uuid.uuid4().hex[:26],
        "cluster": "x",
        "pod": "p",
        "device": H200,
        "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
        "dtype": "bf16",
        "packages": ALL,
        "results": [
            {
                "backend": "CUDNN",
                "shape": {"seqlens": [8], "num_heads": 16},
                "median_ms": 1,
                "tflops": 123,
                "correct": True,
            }
        ],
    }
    select(c, "x", pod="p", packages=ALL)  # the pod has a decision: its report counts
    first, again = c.post("/v1/measurements", json=doc), c.post("/v1/measurements", json=doc)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["duplicate"] is True
    assert first.json()["measurement_id"] == again.json()["measurement_id"] == doc["report_id"]
    groups = [
        g for g in c.get("/v1/measurements/summary").json()["groups"] if g["device"] == H200["name"]
    ]
    assert [g["samples"] for g in groups] == [1]
    bad = c.post("/v1/measurements", json={**doc, "report_id": "x; DROP"})
    assert bad.status_code == 422


# ----------------------------------------------- failures and engines in the situation


def test_decision_cache_keys_the_device_name(c: httpx.Client) -> None:
    """Issue 11, reproduction 1: an H100 (also 9.0) asking first used to poison the
    H200's measured answer, and the other way round."""
    h100 = {"name": H200["name"].replace("H200", "H100"), "capability": [9, 0]}
    for order in ((h100, H200), (H200, h100)):
        cluster = fresh()
        seed(c, cluster, FLASHINFER=600, FLASH_ATTN=200)
        measured_policy(c, cluster)
        answers = {d["name"]: select(c, cluster, device=d) for d in order}
        assert (answers[H200["name"]]["backend"], answers[H200["name"]]["source"]) == (
            "FLASHINFER",
            "measured",
        )
        assert (answers[h100["name"]]["backend"], answers[h100["name"]]["source"]) == (
            "FLASH_ATTN",
            "priority",
        )


def test_a_failure_report_explains_itself_and_stays_in_its_situation(c: httpx.Client) -> None:
    """Issue 11, reproduction 3: one failure report from staging removed FLASHINFER for
    prod-west with no reason shown; now the reason names the pod, time and error, and
    a pod with other kernel package versions is not affected."""
    staging, prod = fresh(), fresh()
    seed(c, prod, FLASHINFER=600, FLASH_ATTN=200)
    newer = {**ALL, "flashinfer": "0.7.3"}
    seed(c, prod, packages=newer, FLASHINFER=610, FLASH_ATTN=200)
    # prod trusts staging's evidence too (by default only its own)
    r = c.put(
        f"/v1/overrides/{prod}",
        json={"policy": "measured", "trust_clusters": [prod, staging], "note": "trust staging"},
    )
    assert r.status_code == 200, r.text
    assert select(c, prod)["backend"] == "FLASHINFER"
    decision = select(c, staging, pod="staging-pod-1")
    r = c.post(
        f"/v1/selections/{decision['decision_id']}/failure",
        json={
            "backend": "FLASHINFER",
            "error": "RuntimeError: CUDA error: illegal address\nat ...",
        },
    )
    assert r.status_code == 202, r.text
    answer = select(c, prod)
    assert answer["backend"] == "FLASH_ATTN"
    flashinfer = next(x for x in answer["candidates"] if x["backend"] == "FLASHINFER")
    assert not flashinfer["valid"]
    (reason,) = flashinfer["reasons"]
    assert reason.startswith("failed on 1 pod in the last 24 h (measured policy): ")
    assert f"{staging}/staging-pod-1" in reason and "CUDA error: illegal address" in reason
    assert "\nat" not in reason
    assert select(c, prod, packages=newer, pod="p2")["backend"] == "FLASHINFER"  # other situation
    excluded = c.get("/v1/selections/summary").json()["excluded"]
    assert "staging-pod-1" in excluded[prod]["FLASHINFER"]
    # an admin declares it fixed: cleared for that situation, audited
    group = next(
        g
        for g in c.get("/v1/measurements/summary").json()["groups"]
        if g["device"] == H200["name"] and g["backend"] == "FLASHINFER" and g["failures"]
    )
    assert group["excluded"].startswith("failed on 1 pod")
    clear = {k: group[k] for k in ("device", "capability", "dims", "dtype", "packages", "engine")}
    r = c.post("/v1/measurements/failures/clear", json={**clear, "note": "driver 580.2 fixes it"})
    assert r.status_code == 200, r.text
    assert r.json()["cleared"] == 1
    assert select(c, prod)["backend"] == "FLASHINFER"
    audit = c.get("/v1/audit", params={"action": "evidence.clear_failures"}).json()["items"]
    assert audit[0]["note"] == "driver 580.2 fixes it"
    bad = c.post("/v1/measurements/failures/clear", json={**clear, "dims": [1, 2], "note": "x"})
    assert bad.status_code == 422 and "dims" in str(bad.json()["detail"][0]["loc"])


def test_a_refusal_lists_the_real_reasons(c: httpx.Client) -> None:
    """Issue 11, reproduction 4: torch forgotten gave a 409 that listed FLASHINFER valid."""
    payload = body(cluster=fresh(), packages={"flashinfer": "0.7.2"})
    r = c.post("/v1/select", json=payload)
    assert r.status_code == 409
    detail = r.json()["detail"]
    assert detail["kind"] == "no_valid_backend"
    assert not any(x["valid"] for x in detail["candidates"])
    flashinfer = next(x for x in detail["candidates"] if x["backend"] == "FLASHINFER")
    assert "required package torch not installed" in flashinfer["reasons"]


def test_vllm_pods_get_engine_flags_and_never_flashinfer_on_hopper(c: httpx.Client) -> None:
    """Issue 12's done-means through the wire: FLASHINFER evidence measured on vLLM H200
    pods, policy measured: the answer is FLASH_ATTN, FLASHINFER carries vLLM's reason."""
    cluster = fresh()
    vllm = {"name": "vllm", "version": "0.33.0"}
    for p in range(2):
        select(c, cluster, pod=f"bench-{p}", engine=vllm)  # so that its reports count
        for sample in range(2):
            r = c.post(
                "/v1/measurements",
                json={
                    "cluster": cluster,
                    "pod": f"bench-{p}",
                    "device": H200,
                    "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
                    "dtype": "bfloat16",
                    "packages": ALL,
                    "engine": vllm,
                    "results": [
                        {
                            "backend": b,
                            "impl": impl,
                            "shape": {"seqlens": [4096] * 4, "num_heads": 16},
                            "median_ms": 1.0,
                            "tflops": t + sample,
                            "correct": True,
                        }
                        for b, impl, t in (
                            ("FLASHINFER", "flashinfer-fa3", 634),
                            ("FLASH_ATTN", "vllm-fa3", 623),
                        )
                    ],
                },
            )
            assert r.status_code == 201, r.text
    measured_policy(c, cluster)
    answer = select(c, cluster, engine=vllm)
    assert (answer["backend"], answer["source"]) == ("FLASH_ATTN", "measured")
    assert answer["engine"] == vllm
    assert answer["engine_args"] == ["--attention-config.mla_prefill_backend=FLASH_ATTN"]
    flashinfer = next(x for x in answer["candidates"] if x["backend"] == "FLASHINFER")
    assert any(
        "vLLM 0.33.0 runs FLASHINFER prefill only on compute capability 10.x" in x
        for x in flashinfer["reasons"]
    )
    # the same pod under our own kernels would take the measured FLASHINFER: no evidence
    # is shared between engines
    assert select(c, cluster)["source"] == "priority"


def test_the_evidence_summary_answers_304_until_evidence_changes(c: httpx.Client) -> None:
    """A dashboard polls the evidence summary; while no report arrives the answer is
    kept and a matching If-None-Match costs a 304 without a body."""
    cluster = fresh()
    report(c, cluster, "poll-a", [("FLASHINFER", 600.0, True)])
    first = c.get("/v1/measurements/summary")
    assert first.status_code == 200 and first.headers["etag"]
    etag = first.headers["etag"]
    again = c.get("/v1/measurements/summary", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    report(c, cluster, "poll-b", [("FLASHINFER", 610.0, True)])
    moved = c.get("/v1/measurements/summary", headers={"If-None-Match": etag})
    assert moved.status_code == 200 and moved.headers["etag"] != etag
    groups = [g for g in moved.json()["groups"] if g["device"] == H200["name"]]
    assert [g["samples"] for g in groups] == [2]


def test_a_clear_leaves_the_failures_reported_after_the_person_looked(
    c: httpx.Client, server: InProcessService
) -> None:
    """A clear names the rows it clears (the summary's ``seen_through``): a failure
    reported between looking and clicking stays counted, and the answer says so.
    Before: a clear took every failure stored at the moment of the click."""
    cluster = fresh()
    measured_policy(c, cluster)
    seed(c, cluster, FLASHINFER=650, CUDNN=540)
    report(c, cluster, "bench-8", [("FLASHINFER", None, False)])

    def group() -> tuple[dict[str, Any], dict[str, int]]:
        summary = c.get("/v1/measurements/summary").json()
        found = [
            g
            for g in summary["groups"]
            if g["device"] == H200["name"] and g["backend"] == "FLASHINFER"
        ]
        return (found[0] if found else {}), summary["seen_through"]

    # its own report, applied here at once, is read back before the summary shows it
    db = sqlite3.connect(server.database_url.removeprefix("sqlite:///"))
    (stored,) = db.execute("SELECT max(id) FROM measurements").fetchone()
    db.close()
    shown, seen = group()
    assert shown["failures"] == 1 and seen["measurement_id"] >= stored, (shown, seen, stored)
    clear = {k: shown[k] for k in ("device", "capability", "dims", "dtype", "packages", "engine")}
    report(c, cluster, "bench-9", [("FLASHINFER", None, False)])  # after the person looked
    r = c.post(
        "/v1/measurements/failures/clear",
        json={**clear, "backend": "FLASHINFER", "seen_through": seen, "note": "fixed"},
    )
    assert r.status_code == 200, r.text
    assert (r.json()["cleared"], r.json()["newer_not_cleared"]) == (1, 1), r.text
    assert "arrived after the ones you saw" in r.json()["message"]
    assert group()[0]["failures"] == 1  # bench-9's still counts, here and in decisions
    assert select(c, cluster)["backend"] == "CUDNN"
    # clicked again on the page that is now stale: nothing of what it saw is left
    again = c.post(
        "/v1/measurements/failures/clear",
        json={**clear, "backend": "FLASHINFER", "seen_through": seen, "note": "fixed"},
    )
    assert (again.json()["cleared"], again.json()["newer_not_cleared"]) == (0, 1), again.text
    bad = c.post(
        "/v1/measurements/failures/clear",
        json={**clear, "seen_through": {"measurement_id": -1, "failure_id": 0}, "note": "x"},
    )
    assert bad.status_code == 422 and "seen_through" in str(bad.json()["detail"][0]["loc"])
