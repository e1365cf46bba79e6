"""``POST /v1/plan`` and ``POST /v1/apply`` in process, through the ASGI app: the
combined dry run, all-or-nothing apply with If-Match on every resource, prune, audit,
and scopes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mla_switchboard.service.gitops.document import spec_fields

from tests.conftest import make_inprocess_client
from tests.service.test_select_decisions import body

HEADER = {"apiVersion": "switchboard/v1", "kind": "Overrides"}


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """The app on a SQLite file, and on PostgreSQL (apply's row locks and one
    transaction on both)."""
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('gitops') / 'sb.db'}"
    with make_inprocess_client(url) as c:  # type: ignore[attr-defined]
        yield c


def fresh(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def boot(api: httpx.Client, cluster: str, pods: int) -> None:
    for i in range(pods):
        r = api.post("/v1/select", json=body(cluster=cluster, pod=f"p{i}"))
        assert r.status_code == 200, r.text


def file(overrides: dict[str, Any], rules: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {**HEADER, "overrides": overrides}
    if rules is not None:
        out["rules"] = rules
    return out


def plan(api: httpx.Client, doc: dict[str, Any], **kw: Any) -> dict[str, Any]:
    r = api.post("/v1/plan", json={"file": doc, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def apply(
    api: httpx.Client, doc: dict[str, Any], etags: dict[str, str], **kw: Any
) -> httpx.Response:
    return api.post("/v1/apply", json={"file": doc, "etags": etags, **kw})


def live(api: httpx.Client) -> dict[str, dict[str, Any]]:
    return {o["cluster"]: o for o in api.get("/v1/overrides").json()["items"]}


def token(api: httpx.Client, role: str, clusters: list[str] | None = None) -> dict[str, str]:
    r = api.post("/v1/tokens", json={"name": fresh(role), "role": role, "clusters": clusters})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def everything(api: httpx.Client) -> dict[str, Any]:
    """Every override in force as the file declares it (what export writes)."""
    return {c: spec_fields(o) for c, o in live(api).items()}


def test_plan_of_one_force_is_the_consoles_preview_of_it(api: httpx.Client) -> None:
    cluster = fresh("prod")
    boot(api, cluster, 3)
    spec = {"force": "FLASHINFER", "note": "try flashinfer"}
    got = plan(api, file({**everything(api), cluster: spec}))
    console = api.put(f"/v1/overrides/{cluster}?dry_run=true", json=spec).json()["preview"]
    assert got["preview"] == console
    assert got["changed"] is True
    assert got["changes"] == [
        {
            "resource": "override",
            "target": cluster,
            "action": "create",
            "etag": '"none"',
            "before": None,
            "after": spec,
        }
    ]
    assert got["etags"] == {f"override:{cluster}": '"none"'}
    (row,) = [c for c in got["preview"]["changes"] if c["cluster"] == cluster]
    assert (row["to"], row["pods"]) == ("FLASHINFER", 3)


def test_apply_writes_every_change_in_one_go_and_audits_each(api: httpx.Client) -> None:
    a, b = fresh("prod"), fresh("prod")
    doc = file({**everything(api), a: {"force": "CUDNN", "note": "a"},
                b: {"deny": ["CUDNN"], "note": "b"}})  # fmt: skip
    p = plan(api, doc)
    assert p["summary"] == {"create": 2, "update": 0, "delete": 0}
    r = apply(api, doc, p["etags"], revision="abc1234")
    assert r.status_code == 200, r.text
    assert r.json()["summary"] == p["summary"]
    now = live(api)
    assert now[a]["force"] == "CUDNN" and now[b]["deny"] == ["CUDNN"]
    assert now[a]["revision"] == now[b]["revision"]  # one transaction
    for cluster in (a, b):
        (entry,) = api.get("/v1/audit", params={"target": cluster}).json()["items"]
        assert entry["action"] == "override.put"
        assert entry["actor"] == "bootstrap-admin"
        assert entry["note"].startswith("overrides file rev abc1234: ")
        assert entry["preview"]["file_revision"] == "abc1234"
    again = plan(api, doc)
    assert (again["changed"], again["changes"], again["etags"]) == (False, [], {})


def test_a_resource_changed_since_the_plan_refuses_the_whole_apply(api: httpx.Client) -> None:
    a, b = fresh("prod"), fresh("prod")
    assert api.put(f"/v1/overrides/{a}", json={"force": "CUDNN", "note": "x"}).status_code == 200
    doc = file({**everything(api), a: {"force": "FLASH_ATTN", "note": "x"},
                b: {"force": "FLASHINFER", "note": "y"}})  # fmt: skip
    p = plan(api, doc)
    assert p["summary"] == {"create": 1, "update": 1, "delete": 0}
    # someone edits a in the console between the plan and the apply
    assert (
        api.put(f"/v1/overrides/{a}", json={"force": "FLASHINFER", "note": "z"}).status_code == 200
    )
    r = apply(api, doc, p["etags"])
    assert r.status_code == 412, r.text
    detail = r.json()["detail"]
    assert detail["target"] == f"override:{a}" and "changed since the plan" in detail["message"]
    assert b not in live(api)  # all or nothing
    assert live(api)[a]["force"] == "FLASHINFER"


def test_a_change_the_plan_did_not_show_is_refused(api: httpx.Client) -> None:
    a = fresh("prod")
    doc = file({**everything(api), a: {"force": "CUDNN", "note": "x"}})
    r = apply(api, doc, {})
    assert r.status_code == 412
    assert r.json()["detail"]["target"] == f"override:{a}"
    assert a not in live(api)


def test_prune_removes_only_what_the_file_omits(api: httpx.Client) -> None:
    keep, drop = fresh("prod"), fresh("prod")
    for c in (keep, drop):
        assert api.put(f"/v1/overrides/{c}", json={"force": "CUDNN", "note": c}).status_code == 200
    doc = file({c: s for c, s in everything(api).items() if c != drop})
    without = plan(api, doc)
    assert without["changed"] is False and without["unmanaged"] == [drop]
    p = plan(api, doc, prune=True)
    assert [(c["target"], c["action"]) for c in p["changes"]] == [(drop, "delete")]
    assert apply(api, doc, p["etags"], prune=True).status_code == 200
    assert drop not in live(api) and keep in live(api)
    (entry,) = api.get("/v1/audit", params={"target": drop, "action": "override.delete"}).json()[
        "items"
    ]
    assert "not in the file" in entry["note"]


def test_rules_in_the_file_are_planned_and_applied(api: httpx.Client) -> None:
    rules = api.get("/v1/rules").json()
    declared = {"default": ["FLASHINFER", *[b for b in rules["default"] if b != "FLASHINFER"]],
                "by_capability": rules["by_capability"], "clusters": rules["clusters"]}  # fmt: skip
    doc = file(everything(api), declared)
    p = plan(api, doc)
    (change,) = p["changes"]
    assert (change["resource"], change["action"]) == ("rules", "update")
    assert change["etag"] == f'"rules-{rules["revision"]}"'
    assert apply(api, doc, p["etags"]).status_code == 200
    assert api.get("/v1/rules").json()["default"][0] == "FLASHINFER"
    # the rules as they were: back, for the other tests
    back = file(everything(api), {k: rules[k] for k in ("default", "by_capability", "clusters")})
    assert apply(api, back, plan(api, back)["etags"]).status_code == 200


def test_a_viewer_plans_but_cannot_apply(api: httpx.Client) -> None:
    viewer = token(api, "viewer")
    doc = file({**everything(api), fresh("prod"): {"force": "CUDNN", "note": "v"}})
    r = api.post("/v1/plan", json={"file": doc}, headers=viewer)
    assert r.status_code == 200 and r.json()["changed"] is True
    r = api.post("/v1/apply", json={"file": doc, "etags": r.json()["etags"]}, headers=viewer)
    assert r.status_code == 403


def test_a_scoped_admin_plans_and_applies_only_within_its_clusters(api: httpx.Client) -> None:
    prod = token(api, "admin", ["prod-*"])
    mine = fresh("prod")
    visible = {c: s for c, s in everything(api).items() if c.startswith("prod-") or c == "*"}
    doc = file({**visible, "dev-a": {"force": "CUDNN", "note": "not mine"}})
    r = api.post("/v1/plan", json={"file": doc}, headers=prod)
    assert r.status_code == 403 and "'dev-a'" in r.json()["detail"]["message"]
    r = api.post(
        "/v1/apply", json={"file": doc, "etags": {"override:dev-a": '"none"'}}, headers=prod
    )
    assert r.status_code == 403 and "dev-a" not in live(api)
    # an ETag of another cluster's override is not checked (it would say its revision)
    assert api.put("/v1/overrides/dev-b", json={"force": "CUDNN", "note": "b"}).status_code == 200
    r = api.post(
        "/v1/apply", json={"file": file(visible), "etags": {"override:dev-b": '"x"'}}, headers=prod
    )
    assert r.status_code == 403 and "current_etag" not in r.json()["detail"]
    doc = file({**visible, mine: {"force": "CUDNN", "note": "mine"}})
    r = api.post("/v1/plan", json={"file": doc, "prune": True}, headers=prod)
    assert r.status_code == 200, r.text
    assert [c["target"] for c in r.json()["changes"]] == [mine]  # dev-* is not pruned
    r = api.post("/v1/apply", json={"file": doc, "etags": r.json()["etags"], "prune": True},
                 headers=prod)  # fmt: skip
    assert r.status_code == 200, r.text
    entry = api.get("/v1/audit", params={"target": mine}).json()["items"][0]
    assert entry["actor"].startswith("admin-")


def test_bad_input_is_a_422_naming_the_field(api: httpx.Client) -> None:
    r = api.post("/v1/plan", json={"file": file({"prod-x": {"force": "NOPE", "note": "x"}})})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][-4:] == ["file", "overrides", "prod-x", "force"]
    past = {"force": "CUDNN", "note": "x", "expires_at": "2000-01-01T00:00:00Z"}
    r = api.post("/v1/plan", json={"file": file({fresh("prod"): past})})
    assert r.status_code == 422 and "expires_at" in str(r.json())
    r = api.post("/v1/apply", json={"file": file({}), "etags": {"bogus": '"x"'}})
    assert r.status_code == 422


def test_the_plan_replays_every_change_together(api: httpx.Client) -> None:
    """The fleet's and a cluster's own override in one file: the cluster's pods move
    once, to where both together send them (not what either alone would do)."""
    cluster = fresh("prod")
    boot(api, cluster, 2)
    fleet = {"force": "TORCH_SDPA", "note": "everyone on the fallback"}
    own = {"force": "FLASHINFER", "note": "but this cluster"}
    base = everything(api)
    alone = plan(api, file({**base, "*": fleet}))["preview"]["changes"]
    assert [(c["to"], c["pods"]) for c in alone if c["cluster"] == cluster] == [("TORCH_SDPA", 2)]
    both = plan(api, file({**base, "*": fleet, cluster: own}))
    assert [c["target"] for c in both["changes"]] == ["*", cluster]
    rows = [c for c in both["preview"]["changes"] if c["cluster"] == cluster]
    assert [(c["from"], c["to"], c["pods"]) for c in rows] == [("FLASH_ATTN", "FLASHINFER", 2)]


def test_drift_names_what_changed_by_hand_since_the_last_apply(api: httpx.Client) -> None:
    a, b = fresh("prod"), fresh("prod")
    doc = file({**everything(api), a: {"force": "CUDNN", "note": "a"},
                b: {"force": "FLASH_ATTN", "note": "b"}})  # fmt: skip
    assert apply(api, doc, plan(api, doc)["etags"], revision="rev-1").status_code == 200
    clean = api.get("/v1/drift").json()
    assert (clean["managed"], clean["drifted"], clean["file_revision"]) == (True, False, "rev-1")
    assert clean["hand_changes"] == [] and clean["applied_by"] == "bootstrap-admin"
    assert "switchboard_overrides_drift 0.0" in api.get("/metrics").text
    assert (
        api.put(f"/v1/overrides/{a}", json={"force": "FLASHINFER", "note": "hand"}).status_code
        == 200
    )
    drift = api.get("/v1/drift").json()
    assert drift["drifted"] is True
    assert [(r["target"], r["action"]) for r in drift["resources"]] == [(a, "update")]
    (hand,) = drift["hand_changes"]
    assert (hand["target"], hand["action"], hand["actor"]) == (a, "override.put", "bootstrap-admin")
    assert "switchboard_overrides_drift 1.0" in api.get("/metrics").text
    # applying the file again is what drift said it would change
    p = plan(api, doc)
    assert [(c["target"], c["action"]) for c in p["changes"]] == [(a, "update")]
    assert apply(api, doc, p["etags"], revision="rev-2").status_code == 200
    assert api.get("/v1/drift").json()["drifted"] is False


def test_a_whole_file_may_be_larger_than_other_bodies(api: httpx.Client) -> None:
    """A thousand overrides are ~200 KB: over the 64 KiB of other bodies, within the
    file's own limit (SWITCHBOARD_MAX_FILE_BYTES)."""
    many = {f"big-{i:04d}": {"deny": ["CUDNN"], "note": "x" * 150} for i in range(1000)}
    r = api.post("/v1/plan", json={"file": file({**everything(api), **many})})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["summary"]["create"] == 1000
    r = api.put("/v1/overrides/big-0000", json={"deny": ["CUDNN"], "note": "x" * 70_000})
    assert r.status_code == 413  # the other bodies keep their limit


def test_a_scoped_caller_sees_only_its_clusters_rule_sets_in_a_plan(api: httpx.Client) -> None:
    rules = api.get("/v1/rules").json()
    fleet = {k: rules[k] for k in ("default", "by_capability")}
    other = {"dev-hidden": {"default": ["FLASH_ATTN"]}}
    seeded = file(everything(api), {**fleet, "clusters": {**rules["clusters"], **other}})
    assert apply(api, seeded, plan(api, seeded)["etags"]).status_code == 200
    prod = token(api, "admin", ["prod-*"])
    mine = {"prod-own": {"default": ["FLASHINFER"]}}
    visible = {c: s for c, s in everything(api).items() if c.startswith("prod-") or c == "*"}
    r = api.post("/v1/plan", json={"file": file(visible, {**fleet, "clusters": mine})},
                 headers=prod)  # fmt: skip
    assert r.status_code == 200, r.text
    (change,) = [c for c in r.json()["changes"] if c["resource"] == "rules"]
    assert "dev-hidden" not in str(change) and "prod-own" in change["after"]["clusters"]
    # and the fleet lists are the unrestricted admin's
    changed_fleet = {**fleet, "default": ["TORCH_SDPA"], "clusters": mine}
    r = api.post("/v1/plan", json={"file": file(visible, changed_fleet)}, headers=prod)
    assert r.status_code == 403 and "fleet lists" in r.json()["detail"]["message"]
