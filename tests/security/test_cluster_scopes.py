"""Issue 13, item 6 (finding 6): cluster limits hold for every role.

A viewer limited to ``prod-*`` sees only those clusters everywhere it can read:
decisions (list, filter, detail), the summary and regret, the audit log, overrides,
the rules' cluster rule sets, previews, and the dashboard's data (the same JSON API)
and the metrics' cluster labels. A restricted admin lists only tokens within its
scope. ``clusters: []`` is refused (it used to create a token limited to nothing,
while the CLI's empty ``--clusters`` made an unrestricted one).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import InProcessService

R1 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
PROD, DEV = "prod-east", "dev-victim"


def select_body(cluster: str, pod: str) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "node": "n1",
        "pod": pod,
        "device": {"name": "NVIDIA H200", "capability": [9, 0]},
        "model": R1,
        "dtype": "bfloat16",
    }


def token(c: httpx.Client, role: str, clusters: list[str] | None) -> str:
    name = f"{role}-{uuid.uuid4().hex[:6]}"
    r = c.post("/v1/tokens", json={"name": name, "role": role, "clusters": clusters})
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    d = tmp_path_factory.mktemp("scopes")
    s = InProcessService(f"sqlite:///{d / 'sb.db'}").start()
    with s.client() as c:
        for cluster in (PROD, "prod-west", DEV):
            for i in range(3):
                r = c.post("/v1/select", json=select_body(cluster, f"{cluster}-p{i}"))
                assert r.status_code == 200, r.text
            r = c.put(f"/v1/overrides/{cluster}", json={"deny": ["CUDNN"], "note": cluster})
            assert r.status_code == 200, r.text
        for cluster in (PROD, "dev-staged"):  # staged overrides: summary's rollouts
            r = c.put(
                f"/v1/overrides/{cluster}",
                json={"deny": ["FLASHINFER"], "note": "staged", "rollout": {"percent": 50}},
            )
            assert r.status_code == 200, r.text
        rules = c.get("/v1/rules").json()
        rules["clusters"] = {PROD: {"default": ["FLASHINFER"]}, DEV: {"default": ["CUDNN"]}}
        assert c.put("/v1/rules", json=rules).status_code == 200
    yield s
    s.stop()


@pytest.fixture(scope="module")
def viewer(fleet: InProcessService) -> Iterator[httpx.Client]:
    with fleet.client() as admin:
        tok = token(admin, "viewer", ["prod-*"])
    with fleet.client(tok) as v:
        yield v


def test_decisions(viewer: httpx.Client, fleet: InProcessService) -> None:
    items = viewer.get("/v1/selections").json()["items"]
    assert {i["cluster"] for i in items} == {PROD, "prod-west"}
    assert viewer.get("/v1/selections", params={"cluster": DEV}).json()["items"] == []
    assert len(viewer.get("/v1/selections", params={"cluster": PROD}).json()["items"]) == 3
    # paging through a scoped listing ends, and sees each visible decision once
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = viewer.get("/v1/selections", params=params).json()
        seen += [i["decision_id"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 6
    with fleet.client() as admin:
        dev = admin.get("/v1/selections", params={"cluster": DEV}).json()["items"][0]
        prod = admin.get("/v1/selections", params={"cluster": PROD}).json()["items"][0]
    assert viewer.get(f"/v1/selections/{dev['decision_id']}").status_code == 404
    assert viewer.get(f"/v1/selections/{prod['decision_id']}").status_code == 200


def test_summary_and_regret(viewer: httpx.Client) -> None:
    summary = viewer.get("/v1/selections/summary").json()
    assert set(summary["clusters"]) == {PROD, "prod-west"}
    assert set(summary["regret"]) <= {PROD, "prod-west"}
    assert [r["cluster"] for r in summary["rollouts"]] == [PROD]
    assert set(summary["excluded"]) <= {PROD, "prod-west"}


def test_overrides_and_rules(viewer: httpx.Client) -> None:
    listed = {o["cluster"] for o in viewer.get("/v1/overrides").json()["items"]}
    assert listed == {PROD, "prod-west"}
    assert viewer.get(f"/v1/overrides/{DEV}").status_code == 404
    assert viewer.get("/v1/overrides/dev-staged").status_code == 404
    assert viewer.get(f"/v1/overrides/{PROD}").status_code == 200
    assert set(viewer.get("/v1/rules").json()["clusters"]) == {PROD}


def test_audit(viewer: httpx.Client) -> None:
    items = viewer.get("/v1/audit", params={"limit": 500}).json()["items"]
    assert items, "the scoped viewer sees its clusters' entries"
    text = str(items)
    assert DEV not in text and "dev-staged" not in text
    assert not any(i["action"].startswith("token.") for i in items)
    assert {i["target"] for i in items if i["action"].startswith("override.")} == {
        PROD,
        "prod-west",
    }
    rules = [i for i in items if i["action"] == "rules.replace"]
    assert rules and set(rules[0]["after"]["clusters"]) == {PROD}
    assert viewer.get("/v1/audit", params={"target": DEV}).json()["items"] == []


def test_preview(viewer: httpx.Client) -> None:
    r = viewer.post(
        "/v1/preview",
        json={"override": {"cluster": "*", "force": "TORCH_SDPA", "note": "everything"}},
    )
    assert r.status_code == 200, r.text
    preview = r.json()
    assert preview["pods_total"] == 6
    assert set(preview["clusters_affected"]) == {PROD, "prod-west"}
    assert DEV not in str(preview)


def test_metrics_labels(viewer: httpx.Client, fleet: InProcessService) -> None:
    scoped = viewer.get("/metrics").text
    assert 'cluster="prod-east"' in scoped and DEV not in scoped
    with fleet.client() as admin:
        assert DEV in admin.get("/metrics").text
    with fleet.client(None) as anon:
        anonymous = anon.get("/metrics").text
    assert "switchboard_decisions_total" in anonymous
    assert PROD not in anonymous and DEV not in anonymous


def test_restricted_admin_lists_tokens_in_scope(fleet: InProcessService) -> None:
    with fleet.client() as admin:
        inside = token(admin, "agent", ["prod-east"])
        token(admin, "agent", ["prod-*"])
        token(admin, "agent", ["dev-*"])
        token(admin, "viewer", None)
        token(admin, "agent", ["prod-east", "dev-victim"])
        scoped = token(admin, "admin", ["prod-*"])
        every = admin.get("/v1/tokens").json()["items"]
    with fleet.client(scoped) as s:
        listed = s.get("/v1/tokens").json()["items"]
    assert len(listed) < len(every)
    for t in listed:
        assert t["clusters"] is not None
        assert all(g.startswith("prod-") for g in t["clusters"]), t
    assert inside.split("_")[1] in {t["id"] for t in listed}


def test_empty_cluster_list_is_refused(fleet: InProcessService) -> None:
    with fleet.client() as admin:
        r = admin.post("/v1/tokens", json={"name": "nothing", "role": "admin", "clusters": []})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"][:2] == ["body", "clusters"]
        # the CLI's rule (core/names.py), the same at the API: a glob must mean something
        for bad in (["-"], ["?."], ["Prod-*"], ["prod east"], ["prod-*", ""]):
            r = admin.post("/v1/tokens", json={"name": "bad", "role": "viewer", "clusters": bad})
            assert r.status_code == 422, (bad, r.text)
        ok = {"name": "ok", "role": "viewer", "clusters": ["prod-*", "eu-west-1", "a?.b_c"]}
        assert admin.post("/v1/tokens", json=ok).status_code == 201
