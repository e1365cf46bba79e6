"""Selects refused for their token are counted per claimed cluster and reason, in
metrics and in ``GET /v1/refusals``, bounded like every cluster label: a fleet with a
mistyped secret is visible on the service, not only in its pods' logs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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


def refused(c: httpx.Client) -> dict[tuple[str, str], int]:
    """``GET /v1/refusals`` as {(cluster, reason): count}; reading it also stores what was
    counted (the periodic flush) and reads the known clusters again if a name was new."""
    items = c.get("/v1/refusals", headers=ADMIN_AUTH).json()["items"]
    return {(i["cluster"], i["reason"]): i["count"] for i in items}


def metric(c: httpx.Client, cluster: str, reason: str) -> float:
    line = f'switchboard_refused_selects_total{{cluster="{cluster}",reason="{reason}"}} '
    text = c.get("/metrics", headers=ADMIN_AUTH).text
    return next((float(ln[len(line) :]) for ln in text.splitlines() if ln.startswith(line)), 0.0)


def test_refusals_are_counted_per_claimed_cluster_and_reason(sqlite_url: str) -> None:
    with make_inprocess_client(sqlite_url, metrics_max_clusters=3) as c:  # type: ignore[attr-defined]
        viewer = token(c, "v", "viewer")
        for cluster in ("prod-east", "prod-west"):  # clusters the service knows: pods
            r = c.post("/v1/select", json=body(cluster=cluster), headers=ADMIN_AUTH)
            assert r.status_code == 200, r.text
        assert len(c.get("/v1/pods").json()["items"]) == 2  # stored (the writer's batch)
        assert select_as(c, "prod-east", "") == 401
        refused(c)  # the flush a few seconds later: prod-east is known from now on
        assert [select_as(c, "prod-east", "") for _ in range(6)] == [401] * 6
        assert [select_as(c, "prod-east", "Bearer x") for _ in range(2)] == [401] * 2
        assert select_as(c, "prod-west", f"Bearer {viewer}") == 403
        for i in range(5):  # more unknown names than the hour's budget (3 here)
            assert select_as(c, f"made-up-{i}", "") == 401
        got = refused(c)
        assert got[("prod-east", "missing bearer token")] == 7
        assert got[("prod-east", "unknown or revoked token")] == 2
        assert got[("prod-west", "token lacks the agent role")] == 1
        assert [got.get((f"made-up-{i}", "missing bearer token")) for i in range(5)] == [
            1, 1, 1, None, None,
        ]  # fmt: skip
        assert got[("(unknown cluster)", "missing bearer token")] == 2
        # metrics name known clusters only (their count since they were known)
        assert metric(c, "prod-east", "missing bearer token") == 6
        assert metric(c, "(unknown cluster)", "missing bearer token") == 1 + 5
        assert "made-up" not in c.get("/metrics", headers=ADMIN_AUTH).text
        scoped = token(c, "w", "viewer", ["prod-west"])
        mine = c.get("/v1/refusals", headers={"Authorization": f"Bearer {scoped}"}).json()
        assert {i["cluster"] for i in mine["items"]} == {"prod-west"}
        assert c.get("/v1/refusals", params={"hours": 0}, headers=ADMIN_AUTH).status_code == 422
        assert c.get("/v1/refusals", headers={"Authorization": ""}).status_code == 401


def test_junk_cluster_names_cannot_crowd_out_real_clusters(sqlite_url: str) -> None:
    """An unauthenticated client claims 200 invented cluster names first; the clusters
    the service knows are still counted by name, in the store and in metrics, and the
    junk takes a small budget of names, then (unknown cluster)."""
    with make_inprocess_client(sqlite_url) as c:  # type: ignore[attr-defined]
        real = ["prod-east", "prod-west", "staging"]
        for cluster in real[:2]:
            assert c.post("/v1/select", json=body(cluster=cluster)).status_code == 200
        assert len(c.get("/v1/pods").json()["items"]) == 2  # stored (the writer's batch)
        r = c.put("/v1/overrides/staging", json={"deny": ["CUDNN"], "note": "known by it"})
        assert r.status_code == 200, r.text
        for i in range(200):
            assert select_as(c, f"junk-{i:03d}", "Bearer sb_guess") == 401
        refused(c)  # the periodic flush
        for cluster in real:
            assert [select_as(c, cluster, "") for _ in range(3)] == [401] * 3
        got = refused(c)
        for cluster in real:
            assert got[(cluster, "missing bearer token")] == 3, got
            assert metric(c, cluster, "missing bearer token") == 3
        junk = {k: n for k, n in got.items() if k[0].startswith("junk-")}
        assert len(junk) == 20 and set(junk.values()) == {1}  # the hour's budget of names
        assert got[("(unknown cluster)", "unknown or revoked token")] == 180
        assert metric(c, "(unknown cluster)", "unknown or revoked token") == 200
        assert "junk-" not in c.get("/metrics", headers=ADMIN_AUTH).text


def test_the_name_budgets_start_again_each_hour(sqlite_url: str) -> None:
    """Straight on the counter, with the hour it reads moved by hand: a burst of junk
    names fills one hour's budget and no more; the next hour counts names again."""
    from mla_switchboard.service.metrics import Metrics
    from mla_switchboard.service.refused import RefusedSelects
    from mla_switchboard.service.store import Store
    from mla_switchboard.service.store.db import make_engine, migrate
    from starlette.exceptions import HTTPException

    engine = make_engine(sqlite_url)
    migrate(engine)
    now = [datetime(2026, 12, 1, 9, 59, tzinfo=UTC)]
    counter = RefusedSelects(
        Store(engine), Metrics(), max_clusters=2, known=lambda: {"east", "west", "north"},
        clock=lambda: now[0],
    )  # fmt: skip
    counter.refresh_known()
    missing = HTTPException(401, {"message": "missing bearer token"})
    for name in ["east", "west", "north", "junk-1", "junk-2", "junk-3"]:
        counter.count(name, missing)
    now[0] += timedelta(minutes=2)  # 10:01: a new hour
    for name in ["north", "junk-3"]:
        counter.count(name, missing)
    got = {r.cluster: r.refused for r in counter.recent(now[0] - timedelta(hours=2))}
    assert got == {"east": 1, "west": 1, "(other)": 1, "north": 1, "junk-1": 1, "junk-2": 1,
                   "(unknown cluster)": 1, "junk-3": 1}  # fmt: skip
    engine.dispose()


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


def test_the_refusals_card_answers_304_until_a_refusal_arrives(sqlite_url: str) -> None:
    """The dashboard polls the refused-selects card; while no pod is refused the answer
    is the same and a matching If-None-Match costs a 304."""
    with make_inprocess_client(sqlite_url) as c:  # type: ignore[attr-defined]
        assert select_as(c, "prod-east", "") == 401
        first = c.get("/v1/refusals", headers=ADMIN_AUTH)
        etag = first.headers["etag"]
        again = c.get("/v1/refusals", headers={**ADMIN_AUTH, "If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
        assert select_as(c, "prod-east", "") == 401
        moved = c.get("/v1/refusals", headers={**ADMIN_AUTH, "If-None-Match": etag})
        assert moved.status_code == 200 and moved.headers["etag"] != etag
        assert moved.json()["items"][0]["count"] == 2
