"""Listing, summary, decision detail, failure reports and restart persistence."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.conftest import InProcessService
from tests.service.test_select_decisions import body


def unique_cluster() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def select(api: httpx.Client, **kw: Any) -> dict[str, Any]:
    r = api.post("/v1/select", json=body(**kw))
    assert r.status_code == 200, r.text
    return r.json()


def test_listing_newest_first_with_filters_and_pages(api: httpx.Client) -> None:
    cluster = unique_cluster()
    ids = [select(api, cluster=cluster, pod=f"p{i}")["decision_id"] for i in range(5)]
    ids.append(select(api, cap=[10, 0], cluster=cluster, pod="bw")["decision_id"])
    page = api.get("/v1/selections", params={"cluster": cluster, "limit": 4}).json()
    assert [i["decision_id"] for i in page["items"]] == ids[::-1][:4]
    assert page["next_cursor"]
    rest = api.get(
        "/v1/selections", params={"cluster": cluster, "limit": 4, "cursor": page["next_cursor"]}
    ).json()
    assert [i["decision_id"] for i in rest["items"]] == ids[::-1][4:]
    assert rest["next_cursor"] is None

    item = page["items"][0]
    assert item["pod"] == "bw"
    assert item["device"]["capability"] == [10, 0]
    assert item["model"]["num_heads"] == 128
    assert item["model"]["qk_rope_head_dim"] == 64
    assert item["dtype"] == "bfloat16"
    assert item["backend"] == "TRTLLM_RAGGED"
    assert item["source"] == "priority"

    only_bw = api.get(
        "/v1/selections", params={"cluster": cluster, "backend": "trtllm_ragged"}
    ).json()
    assert [i["decision_id"] for i in only_bw["items"]] == [ids[-1]]


def test_listing_items_carry_the_engine(api: httpx.Client) -> None:
    """As the pods table does: the engine the pod named (name and version), null for a
    pod that named none (switchboard's own kernels)."""
    cluster = unique_cluster()
    select(api, cluster=cluster, pod="v", engine={"name": "vllm", "version": "0.33.0"})
    select(api, cluster=cluster, pod="s", engine={"name": "sglang"})
    select(api, cluster=cluster, pod="own")
    items = api.get("/v1/selections", params={"cluster": cluster}).json()["items"]
    assert {i["pod"]: i["engine"] for i in items} == {
        "v": {"name": "vllm", "version": "0.33.0"},
        "s": {"name": "sglang", "version": None},
        "own": None,
    }
    schema = api.get("/openapi.json").json()["components"]["schemas"]["SelectionItem"]
    assert "engine" in schema["required"]


def test_listing_bad_params(api: httpx.Client) -> None:
    assert api.get("/v1/selections", params={"limit": 0}).status_code == 422
    assert api.get("/v1/selections", params={"limit": 100000}).status_code == 422
    r = api.get("/v1/selections", params={"cursor": "not-a-cursor"})
    assert r.status_code == 422 and "cursor" in r.text
    r = api.get("/v1/selections", params={"backend": "nope"})
    assert r.status_code == 422 and "valid backends" in r.text


def test_summary_counts_each_pods_latest_decision(api: httpx.Client) -> None:
    cluster = unique_cluster()
    for i in range(3):
        select(api, cluster=cluster, node="n1", pod=f"p{i}")  # Hopper: FLASH_ATTN
    select(api, cluster=cluster, node="n2", pod="p0")  # same pod name, other node
    # p1 on n1 re-boots on Blackwell hardware: only its latest decision counts.
    select(api, cap=[10, 0], cluster=cluster, node="n1", pod="p1")
    summary = api.get("/v1/selections/summary").json()["clusters"][cluster]
    assert summary == {"FLASH_ATTN": 3, "TRTLLM_RAGGED": 1}


def test_decision_detail_and_failure_report(api: httpx.Client) -> None:
    cluster = unique_cluster()
    answer = select(api, cluster=cluster)
    detail = api.get(f"/v1/selections/{answer['decision_id']}").json()
    assert detail["answer"]["candidates"] == answer["candidates"]
    assert detail["failures"] == []
    r = api.post(
        f"/v1/selections/{answer['decision_id']}/failure",
        json={"backend": "FLASH_ATTN", "error": "CUDA error: no kernel image"},
    )
    assert r.status_code == 202
    detail = api.get(f"/v1/selections/{answer['decision_id']}").json()
    assert detail["failures"][0]["error"] == "CUDA error: no kernel image"
    assert api.get("/v1/selections/0000").status_code == 404
    r = api.post("/v1/selections/0000/failure", json={"backend": "CUDNN", "error": "x"})
    assert r.status_code == 404
    r = api.post(f"/v1/selections/{answer['decision_id']}/failure", json={"backend": "X"})
    assert r.status_code == 422


def test_rules_document(api: httpx.Client) -> None:
    r = api.get("/v1/rules")
    doc = r.json()
    assert doc["by_capability"]["10"] == ["TRTLLM_RAGGED", "FLASHINFER", "CUDNN", "FLASH_ATTN"]
    assert doc["default"] == ["FLASH_ATTN"]
    assert isinstance(doc["revision"], int)
    again = api.get("/v1/rules", headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304


def test_probes_are_open(api: httpx.Client) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert api.get(path, headers={"Authorization": ""}).status_code == 200
    ready = api.get("/readyz").json()
    assert ready["status"] == "ready" and ready["store"] == "ok"
    assert "switchboard_decisions_total" in api.get("/metrics").text


def test_restart_keeps_rules_and_selections(
    inprocess_factory: type[InProcessService], sqlite_url: str
) -> None:
    first = inprocess_factory(sqlite_url).start()
    with first.client() as c:
        ids = [
            c.post("/v1/select", json=body(pod=f"p{i}")).json()["decision_id"] for i in range(20)
        ]
        revision = c.get("/v1/rules").json()["revision"]
    first.stop()  # a clean shutdown flushes the buffered decisions
    second = inprocess_factory(sqlite_url).start()
    with second.client() as c:
        items = c.get("/v1/selections", params={"limit": 100}).json()["items"]
        assert {i["decision_id"] for i in items} == set(ids)
        assert c.get("/v1/rules").json()["revision"] == revision
        assert c.get("/v1/selections/summary").json()["clusters"]["prod-east"] == {"FLASH_ATTN": 20}
