"""Rollout guards count distinct stage pods, of the clusters allowed to halt the rollout,
decided in the current stage: a low-privilege agent cannot halt a fleet-wide rollout by
repeating one pod's report, by reporting from a sandbox cluster the rollout does not
trust, or by replaying a decision made before the last resume."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN, make_inprocess_client
from tests.service.test_select_decisions import body

FORCE = {"force": "FLASHINFER", "note": "INC-1 try flashinfer"}
Pod = tuple[str, dict[str, Any]]  # "cluster/pod" and the answer it got


@pytest.fixture
def api(sqlite_url: str) -> Iterator[httpx.Client]:
    with make_inprocess_client(sqlite_url) as client:  # type: ignore[attr-defined]
        client.headers["Authorization"] = f"Bearer {ADMIN}"
        yield client


def agent(api: httpx.Client, clusters: list[str]) -> httpx.Client:
    """A client of the same in-process app with an agent token limited to ``clusters``."""
    r = api.post("/v1/tokens", json={"name": "dev-agent", "role": "agent", "clusters": clusters})
    assert r.status_code == 201, r.text
    return httpx.Client(
        transport=api._transport,
        base_url=str(api.base_url),
        headers={"Authorization": f"Bearer {r.json()['token']}"},
    )


def stage_pods(c: httpx.Client, cluster: str, n: int, start: int = 0) -> list[Pod]:
    """``n`` pods of ``cluster`` that the rollout's stage holds, with their answers."""
    found: list[Pod] = []
    for i in range(start, start + 400):
        name = f"{cluster}-{i}"
        r = c.post("/v1/select", json=body(cluster=cluster, pod=name))
        assert r.status_code == 200, r.text
        answer = r.json()
        if any((o.get("rollout") or {}).get("in_stage") for o in answer["overrides"]):
            found.append((f"{cluster}/{name}", answer))
            if len(found) == n:
                return found
    raise AssertionError(f"fewer than {n} of 400 pods in the stage")


def fail(c: httpx.Client, answer: dict[str, Any]) -> None:
    r = c.post(
        f"/v1/selections/{answer['decision_id']}/failure",
        json={"backend": answer["backend"], "error": "RuntimeError: illegal memory access"},
    )
    assert r.status_code == 202, r.text


def rollout(api: httpx.Client) -> dict[str, Any]:
    r = api.get("/v1/overrides/*")
    assert r.status_code == 200, r.text
    return r.json()["rollout"]


def test_one_pods_repeated_reports_count_once(api: httpx.Client) -> None:
    r = api.put("/v1/overrides/*", json={**FORCE, "rollout": {"percent": 20, "max_failures": 3}})
    assert r.status_code == 200, r.text
    dev = agent(api, ["dev-*"])
    [(where, answer)] = stage_pods(dev, "dev-a", 1)
    for _ in range(5):
        fail(dev, answer)
    state = rollout(api)
    assert (state["state"], state["failures"], state["failed_pods"]) == ("active", 1, [where])
    # two more distinct stage pods reach max_failures 3: halted, and the reason (also in
    # the audit entry) names every pod and its cluster
    others = stage_pods(dev, "dev-b", 2)
    for _, other in others:
        fail(dev, other)
    state = rollout(api)
    assert state["state"] == "halted" and state["failures"] == 3
    assert "3 stage pod(s)" in state["halted_reason"]
    assert "(clusters dev-a, dev-b)" in state["halted_reason"]
    assert all(w in state["halted_reason"] for w in [where, *(w for w, _ in others)])
    (entry,) = api.get("/v1/audit", params={"action": "rollout.failure", "limit": 1}).json()[
        "items"
    ]
    assert entry["after"]["rollout"]["halted_reason"] == state["halted_reason"]


def test_guard_clusters_keep_a_sandbox_from_halting_the_fleet(api: httpx.Client) -> None:
    spec = {**FORCE, "rollout": {"percent": 20, "max_failures": 1, "guard_clusters": ["prod-*"]}}
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    dev = agent(api, ["dev-*"])
    for _, answer in stage_pods(dev, "dev-a", 3):
        fail(dev, answer)
    assert rollout(api)["state"] == "active"  # dev pods cannot halt it
    [(_, prod)] = stage_pods(api, "prod-east", 1)
    fail(api, prod)
    assert rollout(api)["state"] == "halted"


def test_a_decision_from_before_the_resume_does_not_count(api: httpx.Client) -> None:
    spec = {**FORCE, "rollout": {"percent": 20, "max_failures": 1}}
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    [(_, old)] = stage_pods(api, "prod-east", 1)
    fail(api, old)
    assert rollout(api)["state"] == "halted"
    assert api.put("/v1/overrides/*", json=spec).status_code == 200  # resume: a new stage
    assert rollout(api)["state"] == "active"
    fail(api, old)  # the same pre-resume decision, reported again
    state = rollout(api)
    assert state["state"] == "active" and state["failures"] == 0
    [(_, new)] = stage_pods(api, "prod-east", 1, start=400)  # a decision of this stage
    fail(api, new)
    assert rollout(api)["state"] == "halted"


def test_guard_clusters_are_checked_like_every_cluster_glob(api: httpx.Client) -> None:
    bad = {**FORCE, "rollout": {"percent": 20, "guard_clusters": []}}
    r = api.put("/v1/overrides/*", json=bad)
    assert r.status_code == 422 and "guard_clusters" in str(r.json()["detail"][0]["loc"])
    bad["rollout"]["guard_clusters"] = ["Prod East"]  # type: ignore[index]
    assert api.put("/v1/overrides/*", json=bad).status_code == 422


def test_halt_resume_and_promote_by_hand(api: httpx.Client) -> None:
    spec = {**FORCE, "rollout": {"percent": 10, "steps": [10, 50, 100], "step_every": "1h"}}
    r = api.put("/v1/overrides/*", json=spec)
    etag = r.headers["ETag"]
    stage_pods(api, "prod-east", 3)

    def act(body: dict[str, Any], **params: Any) -> httpx.Response:
        return api.post("/v1/overrides/*/rollout", json=body, params=params)

    # the confirmation's dry run: what would change, nothing changed
    dry = act({"action": "halt", "note": "INC-2 looks wrong"}, dry_run="true")
    assert dry.status_code == 200 and dry.json()["rollout"]["state"] == "halted"
    assert dry.json()["preview"]["pods_changed"] >= 3  # the stage pods go back
    assert rollout(api)["state"] == "active"
    # If-Match: a stale view is refused
    r = api.post(
        "/v1/overrides/*/rollout",
        json={"action": "halt", "note": "INC-2"},
        headers={"If-Match": '"override-*-999"'},
    )
    assert r.status_code == 412 and r.json()["detail"]["current_etag"] == etag
    r = api.post(
        "/v1/overrides/*/rollout", json={"action": "halt", "note": "x"}, headers={"If-Match": etag}
    )
    assert r.status_code == 200 and rollout(api)["state"] == "halted"
    assert "halted by bootstrap-admin: x" in rollout(api)["halted_reason"]
    # impossible actions say why
    r = act({"action": "halt", "note": "again"})
    assert r.status_code == 409 and "only an active rollout" in r.json()["detail"]["message"]
    r = act({"action": "promote", "note": "go"})
    assert r.status_code == 409 and "resume it" in r.json()["detail"]["message"]
    assert act({"action": "resume", "note": "fixed"}).status_code == 200
    r = act({"action": "promote", "note": "go"})  # to the next step
    assert r.status_code == 200 and r.json()["override"]["rollout"]["percent"] == 50
    r = act({"action": "promote", "note": "all", "percent": 100})
    assert r.json()["override"]["rollout"]["state"] == "complete"
    actions = [e["action"] for e in api.get("/v1/audit", params={"limit": 5}).json()["items"]]
    assert actions[:4] == ["rollout.promote", "rollout.promote", "rollout.resume", "rollout.halt"]
    r = act({"action": "halt", "note": "x", "percent": 20})
    assert r.status_code == 422
    assert (
        api.post("/v1/overrides/nowhere/rollout", json={"action": "halt", "note": "x"}).status_code
        == 404
    )
