"""``GET /v1/pods``: the live fleet, paged by the server with a cursor and filtered in
the store; pods not seen within the TTL leave it (their decisions stay in the log)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN, make_inprocess_client
from tests.service.test_select_decisions import ALL, body

H200 = {"name": "NVIDIA H200", "capability": [9, 0]}
B200 = {"name": "NVIDIA B200", "capability": [10, 0]}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    url = f"sqlite:///{tmp_path_factory.mktemp('pods') / 'sb.db'}"
    with make_inprocess_client(url) as client:  # type: ignore[attr-defined]
        client.headers["Authorization"] = f"Bearer {ADMIN}"
        for i in range(120):
            cluster = ["east", "west", "dev-a"][i % 3]
            payload = body(cluster=cluster, pod=f"p{i:03d}", node=f"n{i % 7}", packages=ALL)
            payload["device"] = B200 if i % 4 == 0 else H200
            if i % 5 == 0:
                payload["engine"] = {"name": "vllm", "version": "0.33.0"}
            r = client.post("/v1/select", json=payload)
            assert r.status_code == 200, r.text
        yield client


def pages(api: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        r = api.get("/v1/pods", params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["items"]) <= params.get("limit", 100)
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


def test_paging_visits_every_pod_once_in_order(api: httpx.Client) -> None:
    items = pages(api, limit=7)
    keys = [(i["cluster"], i["node"], i["pod"]) for i in items]
    assert len(keys) == 120 == len(set(keys)) and keys == sorted(keys)
    first = items[0]
    assert {"decision_id", "backend", "source", "last_seen", "device", "engine"} <= set(first)


def test_filters(api: httpx.Client) -> None:
    assert {i["cluster"] for i in pages(api, cluster="east")} == {"east"}
    assert len(pages(api, cluster="east")) == 40
    b200 = pages(api, gpu="NVIDIA B200")
    assert len(b200) == 30 and all(i["device"]["name"] == "NVIDIA B200" for i in b200)
    vllm = pages(api, engine="vllm")
    assert len(vllm) == 24 and all(i["engine"]["name"] == "vllm" for i in vllm)
    assert all(i["backend"] == "FLASH_ATTN" for i in pages(api, backend="flash_attn"))
    assert {i["pod"] for i in pages(api, q="p00")} == {f"p00{i}" for i in range(10)}
    by_node = pages(api, q="n3")
    assert by_node and all(i["node"] == "n3" for i in by_node)
    assert pages(api, cluster="nowhere") == []


def test_stage_filter_lists_the_pods_of_a_rollouts_stage(api: httpx.Client) -> None:
    r = api.put(
        "/v1/overrides/west",
        json={"deny": ["CUDNN"], "note": "stage", "rollout": {"percent": 30}},
    )
    assert r.status_code == 200, r.text
    staged = pages(api, stage="west")
    assert 0 < len(staged) < 40
    assert all(i["cluster"] == "west" and i["in_stage"] == ["west"] for i in staged)
    outside = [i for i in pages(api, cluster="west") if not i["in_stage"]]
    assert len(staged) + len(outside) == 40
    assert pages(api, stage="east") == []  # no rollout there
    api.delete("/v1/overrides/west")


def test_a_scoped_token_lists_its_clusters_only(api: httpx.Client) -> None:
    r = api.post("/v1/tokens", json={"name": "dev-viewer", "role": "viewer", "clusters": ["dev-*"]})
    token = r.json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    seen = {
        i["cluster"]
        for i in api.get("/v1/pods", params={"limit": 500}, headers=headers).json()["items"]
    }
    assert seen == {"dev-a"}
    r = api.get("/v1/pods", params={"cluster": "east"}, headers=headers)
    assert r.status_code == 200 and r.json()["items"] == []


def facets(api: httpx.Client, **params: Any) -> dict[str, Any]:
    r = api.get("/v1/pods/facets", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_facets_list_each_filters_values_and_count_what_a_filter_keeps(api: httpx.Client) -> None:
    f = facets(api)
    assert f["pods"] == 120
    assert f["clusters"] == [
        {"name": "dev-a", "pods": 40},
        {"name": "east", "pods": 40},
        {"name": "west", "pods": 40},
    ]
    assert {g["name"]: g["pods"] for g in f["gpus"]} == {"NVIDIA B200": 30, "NVIDIA H200": 90}
    assert {e["name"]: e["pods"] for e in f["engines"]} == {"switchboard": 96, "vllm": 24}
    assert sum(b["pods"] for b in f["backends"]) == sum(s["pods"] for s in f["sources"]) == 120
    # ``pods`` is what the same filters of GET /v1/pods keep, read from the counts
    for params in (
        {"cluster": "east"},
        {"gpu": "NVIDIA B200", "engine": "vllm"},
        {"cluster": "west", "backend": "FLASH_ATTN"},
        {"source": "priority", "gpu": "NVIDIA H200"},
        {"cluster": "nowhere"},
    ):
        assert facets(api, **params)["pods"] == len(pages(api, **params, limit=500)), params
    r = api.put(
        "/v1/overrides/east", json={"deny": ["CUDNN"], "note": "f", "rollout": {"percent": 40}}
    )
    assert r.status_code == 200, r.text
    try:
        staged = len(pages(api, stage="east", limit=500))
        assert 0 < staged < 40
        assert facets(api, stage="east")["pods"] == staged
        assert facets(api, stage="west")["pods"] == 0  # no rollout there
    finally:
        api.delete("/v1/overrides/east")


FACETS = {"clusters": "cluster", "backends": "backend", "sources": "source",
          "engines": "engine", "gpus": "gpu"}  # fmt: skip


@pytest.mark.parametrize(
    "given",
    [
        {"cluster": "east"},
        {"engine": "vllm"},
        {"cluster": "west", "gpu": "NVIDIA B200"},
        {"backend": "FLASH_ATTN", "source": "priority", "engine": "switchboard"},
        {"cluster": "nowhere"},
    ],
)
def test_each_facet_counts_under_the_other_filters(
    api: httpx.Client, given: dict[str, str]
) -> None:
    """A value's count is what picking it would list, the other filters kept: "vllm (24)"
    beside "1-8 of 8" told the reader the wrong thing. A facet's own filter is left out
    of its counts, so the other values stay pickable."""
    f = facets(api, **given)
    assert f["pods"] == len(pages(api, **given, limit=500))
    for facet, param in FACETS.items():
        assert f[facet], facet  # every value of the visible fleet is listed, 0 or not
        for value in f[facet]:
            picked = {**given, param: value["name"]}
            assert value["pods"] == len(pages(api, **picked, limit=500)), (facet, value)


def test_facets_answer_304_while_nothing_changed(api: httpx.Client) -> None:
    r = api.get("/v1/pods/facets", params={"cluster": "east"})
    etag = r.headers["ETag"]
    again = api.get("/v1/pods/facets", params={"cluster": "east"}, headers={"If-None-Match": etag})
    assert again.status_code == 304
    other = api.get("/v1/pods/facets", params={"cluster": "west"}, headers={"If-None-Match": etag})
    assert other.status_code == 200


def test_a_page_answers_304_until_its_pods_change(api: httpx.Client) -> None:
    """The console polls the page it shows; an unchanged page costs a 304, no body."""
    first = api.get("/v1/pods", params={"cluster": "west", "limit": 5})
    etag = first.headers["etag"]
    again = api.get(
        "/v1/pods", params={"cluster": "west", "limit": 5}, headers={"If-None-Match": etag}
    )
    assert again.status_code == 304 and again.content == b""
    payload = body(cluster="west", pod="p000-new", node="n0", packages=ALL)  # first in order
    assert api.post("/v1/select", json=payload).status_code == 200
    moved = api.get(
        "/v1/pods", params={"cluster": "west", "limit": 5}, headers={"If-None-Match": etag}
    )
    assert moved.status_code == 200 and moved.headers["etag"] != etag
    assert "p000-new" in [i["pod"] for i in moved.json()["items"]]


def test_a_scoped_token_sees_facets_of_its_clusters_only(api: httpx.Client) -> None:
    r = api.post("/v1/tokens", json={"name": "dev-facets", "role": "viewer", "clusters": ["dev-*"]})
    headers = {"Authorization": f"Bearer {r.json()['token']}"}
    f = api.get("/v1/pods/facets", headers=headers).json()
    assert f["clusters"] == [{"name": "dev-a", "pods": 40}] and f["pods"] == 40
    assert (
        api.get("/v1/pods/facets", params={"cluster": "east"}, headers=headers).json()["pods"] == 0
    )


@pytest.mark.parametrize(
    ("param", "value"),
    [("cursor", "not!base64"), ("limit", "0"), ("engine", "trt"), ("q", ""), ("stage", "A B")],
)
def test_bad_parameters_are_422_naming_them(api: httpx.Client, param: str, value: str) -> None:
    r = api.get("/v1/pods", params={param: value})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", param]


def test_any_cursor_is_a_position(api: httpx.Client) -> None:
    r = api.get("/v1/pods", params={"cursor": "ZWFzdA", "limit": 5})  # "east": after it
    assert r.status_code == 200 and {i["cluster"] for i in r.json()["items"]} == {"east"}


def test_pods_not_seen_within_the_ttl_leave_the_live_fleet(sqlite_url: str) -> None:
    with make_inprocess_client(sqlite_url) as c:  # type: ignore[attr-defined]
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        for i in range(5):
            assert c.post("/v1/select", json=body(cluster="old", pod=f"o{i}")).status_code == 200
        runtime = c.app.state.runtime  # type: ignore[attr-defined]
        runtime.recorder.flush()
        later = datetime.now(UTC) + timedelta(days=8)
        assert runtime.pod_expiry.sweep(now=later) == 5
        assert c.get("/v1/pods").json()["items"] == []
        assert "old" not in c.get("/v1/selections/summary").json()["clusters"]
        # history stays: the decision log still lists them
        assert len(c.get("/v1/selections", params={"cluster": "old"}).json()["items"]) == 5
        # a pod that boots again is live again
        assert c.post("/v1/select", json=body(cluster="old", pod="o1")).status_code == 200
        assert [i["pod"] for i in c.get("/v1/pods").json()["items"]] == ["o1"]
