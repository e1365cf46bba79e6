"""Selects refused for their token are counted per claimed cluster and reason, in
metrics and in ``GET /v1/refusals``, bounded like every cluster label: a fleet with a
mistyped secret is visible on the service, not only in its pods' logs."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import ADMIN, make_inprocess_client
from tests.service.test_select_decisions import body

ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}


def token(c: httpx.Client, name: str, role: str, clusters: list[str] | None = None) -> str:
    r = c.post(
        "/v1/tokens", json={"name": name, "role": role, "clusters": clusters}, headers=ADMIN_AUTH
    )
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


def select_as(c: httpx.Client, cluster: str, auth: str) -> int:
    r = c.post("/v1/select", json=body(cluster=cluster), headers={"Authorization": auth})
    return r.status_code


def test_refusals_are_counted_per_claimed_cluster_and_reason(sqlite_url: str) -> None:
    with make_inprocess_client(sqlite_url, metrics_max_clusters=3) as c:  # type: ignore[attr-defined]
        viewer = token(c, "v", "viewer")
        assert [select_as(c, "prod-east", "") for _ in range(7)] == [401] * 7
        assert [select_as(c, "prod-east", "Bearer x") for _ in range(2)] == [401] * 2
        assert select_as(c, "prod-west", f"Bearer {viewer}") == 403
        for i in range(5):  # more claimed names than the label limit
            assert select_as(c, f"made-up-{i}", "") == 401
        items = c.get("/v1/refusals", headers=ADMIN_AUTH).json()["items"]
        got: dict[tuple[str, str], Any] = {(i["cluster"], i["reason"]): i["count"] for i in items}
        assert got[("prod-east", "missing bearer token")] == 7
        assert got[("prod-east", "unknown or revoked token")] == 2
        assert got[("prod-west", "token lacks the agent role")] == 1
        assert got[("(other)", "missing bearer token")] == 4  # the limit is 3 names
        metrics = c.get("/metrics", headers=ADMIN_AUTH).text
        line = (
            'switchboard_refused_selects_total{cluster="prod-east",reason="missing bearer token"}'
        )
        assert f"{line} 7.0" in metrics
        scoped = token(c, "w", "viewer", ["prod-west"])
        mine = c.get("/v1/refusals", headers={"Authorization": f"Bearer {scoped}"}).json()
        assert {i["cluster"] for i in mine["items"]} == {"prod-west"}
        assert c.get("/v1/refusals", params={"hours": 0}, headers=ADMIN_AUTH).status_code == 422
        assert c.get("/v1/refusals", headers={"Authorization": ""}).status_code == 401


def test_a_dry_run_leaves_the_decision_count_unchanged(sqlite_url: str) -> None:
    with make_inprocess_client(sqlite_url) as c:  # type: ignore[attr-defined]
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        assert c.post("/v1/select", json=body(pod="real")).status_code == 200
        before = c.get("/v1/selections/summary").json()["clusters"]
        for i in range(3):
            r = c.post("/v1/select", params={"dry_run": "true"}, json=body(pod=f"laptop-{i}"))
            assert r.status_code == 200 and r.json()["decision_id"] is None
        assert c.get("/v1/selections/summary").json()["clusters"] == before
        assert len(c.get("/v1/selections").json()["items"]) == 1


def test_whoami_says_what_a_token_may_do(sqlite_url: str) -> None:
    with make_inprocess_client(sqlite_url) as c:  # type: ignore[attr-defined]
        me = c.get("/v1/whoami", headers=ADMIN_AUTH).json()
        assert me == {"name": "bootstrap-admin", "role": "admin", "clusters": None,
                      "may_edit_fleet": True}  # fmt: skip
        scoped = token(c, "ops", "admin", ["prod-*"])
        me = c.get("/v1/whoami", headers={"Authorization": f"Bearer {scoped}"}).json()
        assert (me["role"], me["clusters"], me["may_edit_fleet"]) == ("admin", ["prod-*"], False)
        agent = token(c, "pod", "agent")
        assert c.get("/v1/whoami", headers={"Authorization": f"Bearer {agent}"}).json()["role"] == (
            "agent"
        )
        assert c.get("/v1/whoami", headers={"Authorization": "Bearer nope"}).status_code == 401
