"""Through the HTTP API: override precedence, expiry, globs, tokens and
roles, optimistic concurrency, audit, and preview against a seeded fleet."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.conftest import InProcessService
from tests.service.test_select_decisions import ALL, ODD, body


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    d = tmp_path_factory.mktemp("controls")
    service = InProcessService(f"sqlite:///{d / 'sb.db'}").start()
    yield service
    service.stop()


@pytest.fixture
def admin(server: InProcessService) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def fresh() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def later(minutes: float = 60) -> str:
    return (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()


def put(c: httpx.Client, scope: str, **spec: Any) -> httpx.Response:
    spec.setdefault("note", "test")
    return c.put(f"/v1/overrides/{scope}", json=spec)


def pick(c: httpx.Client, cluster: str, **kw: Any) -> dict[str, Any]:
    r = c.post("/v1/select", json=body(cluster=cluster, **kw))
    assert r.status_code == 200, r.text
    return r.json()


def token(c: httpx.Client, role: str, clusters: list[str] | None = None) -> str:
    r = c.post("/v1/tokens", json={"name": f"{role}-{fresh()}", "role": role, "clusters": clusters})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def as_(server: InProcessService, tok: str) -> httpx.Client:
    return server.client(tok)


class TestPrecedence:
    def test_force_wins_over_priority_and_request(self, admin: httpx.Client) -> None:
        c = fresh()
        assert put(admin, c, force="CUDNN", note="cudnn is faster here").status_code == 200
        a = pick(admin, c, cap=[9, 0], requested_backend="FLASHINFER")
        assert (a["backend"], a["source"]) == ("CUDNN", "override")
        revision = admin.get(f"/v1/overrides/{c}").json()["revision"]
        assert a["overrides"] == [
            {
                "cluster": c,
                "effect": "force CUDNN",
                "note": "cudnn is faster here",
                "revision": revision,
                "rollout": None,
            }
        ]
        assert any("overridden" in m for m in a["messages"])

    def test_invalid_force_is_skipped_with_reasons(self, admin: httpx.Client) -> None:
        c = fresh()
        put(admin, c, force="TRTLLM_RAGGED")
        a = pick(admin, c, cap=[9, 0], requested_backend="FLASHINFER")
        assert (a["backend"], a["source"]) == ("FLASHINFER", "requested")
        assert any("TRTLLM_RAGGED" in m and "not valid" in m and "9.0" in m for m in a["messages"])

    def test_deny_beats_force_request_and_priority(self, admin: httpx.Client) -> None:
        c = fresh()
        put(admin, c, deny=["FLASH_ATTN"], note="NaNs on this cluster")
        a = pick(admin, c, cap=[9, 0], requested_backend="FLASH_ATTN")
        assert a["backend"] == "TORCH_SDPA"  # Hopper list is [FLASH_ATTN]; then fallback
        (fa,) = [x for x in a["candidates"] if x["backend"] == "FLASH_ATTN"]
        assert not fa["valid"]
        assert any(c in r and "NaNs on this cluster" in r for r in fa["reasons"])

    def test_deny_then_strict_request_is_409(self, admin: httpx.Client) -> None:
        c = fresh()
        put(admin, c, deny=["CUDNN"])
        r = admin.post(
            "/v1/select", json=body(cluster=c, cap=[10, 0], requested_backend="CUDNN", strict=True)
        )
        assert r.status_code == 409
        assert "denied by override" in r.text

    def test_fleet_and_cluster_both_apply(self, admin: httpx.Client) -> None:
        c = fresh()
        try:
            put(admin, "*", deny=["TRTLLM_RAGGED"], model="fleet-test/*", note="fleet deny")
            put(admin, c, deny=["FLASHINFER"], model="fleet-test/*", note="cluster deny")
            payload = body(cluster=c, cap=[10, 0], packages=ALL)
            payload["model"]["name"] = "fleet-test/R1"
            a = admin.post("/v1/select", json=payload).json()
            assert (a["backend"], a["source"]) == ("CUDNN", "priority")  # both denies add up
            assert [o["cluster"] for o in a["overrides"]] == ["*", c]
            # another cluster only sees the fleet's deny
            payload["cluster"] = fresh()
            assert admin.post("/v1/select", json=payload).json()["backend"] == "FLASHINFER"
            # cluster force beats fleet force
            put(admin, "*", force="FLASH_ATTN", model="fleet-test/*", note="fleet force")
            put(admin, c, force="CUDNN", model="fleet-test/*", note="cluster force")
            payload["cluster"] = c
            assert admin.post("/v1/select", json=payload).json()["backend"] == "CUDNN"
        finally:
            admin.delete("/v1/overrides/*")

    def test_model_glob_narrows(self, admin: httpx.Client) -> None:
        c = fresh()
        put(admin, c, force="TORCH_SDPA", model="moonshotai/Kimi-*")
        kimi = body(cluster=c)
        kimi["model"]["name"] = "moonshotai/Kimi-K2.5"
        assert admin.post("/v1/select", json=kimi).json()["source"] == "override"
        r1 = pick(admin, c)
        assert (r1["backend"], r1["source"], r1["overrides"]) == ("FLASH_ATTN", "priority", [])

    def test_deterministic(self, admin: httpx.Client) -> None:
        c = fresh()
        put(admin, c, deny=["FLASHINFER"], force="CUDNN")
        answers = [pick(admin, c, cap=[10, 0]) for _ in range(5)]
        for a in answers:
            a.pop("decision_id")
        assert all(a == answers[0] for a in answers)


def test_expiry(admin: httpx.Client) -> None:
    c = fresh()
    expires = datetime.now(UTC) + timedelta(seconds=1.5)
    assert put(admin, c, force="TORCH_SDPA", expires_at=expires.isoformat()).status_code == 200
    assert pick(admin, c)["source"] == "override"
    deadline = time.monotonic() + 10
    while datetime.now(UTC) < expires and time.monotonic() < deadline:
        time.sleep(0.1)
    a = pick(admin, c)
    assert (a["backend"], a["source"], a["overrides"]) == ("FLASH_ATTN", "priority", [])
    shown = admin.get(f"/v1/overrides/{c}").json()
    assert shown["expired"] is True
    listed = {o["cluster"]: o for o in admin.get("/v1/overrides").json()["items"]}
    assert listed[c]["expired"] is True


class TestOverrideValidation:
    @pytest.mark.parametrize(
        ("spec", "field"),
        [
            ({"force": "FA9"}, "force"),
            ({"deny": ["TORCH_SDPA"]}, "deny"),
            ({"deny": ["CUDNN", "cudnn"]}, "deny"),
            ({"force": "CUDNN", "deny": ["CUDNN"]}, ""),
            ({}, ""),
            ({"force": "CUDNN", "note": ""}, "note"),
            ({"force": "CUDNN", "expires_at": "tomorrow"}, "expires_at"),
            ({"force": "CUDNN", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
            ({"force": "CUDNN", "colour": "red"}, "colour"),
        ],
    )
    def test_bad_override(self, admin: httpx.Client, spec: dict[str, Any], field: str) -> None:
        spec.setdefault("note", "x")
        r = admin.put(f"/v1/overrides/{fresh()}", json=spec)
        assert r.status_code == 422, r.text
        assert any(field in ".".join(map(str, e["loc"])) for e in r.json()["detail"])

    def test_bad_scope(self, admin: httpx.Client) -> None:
        assert put(admin, "Prod_East", force="CUDNN").status_code == 422
        assert admin.get("/v1/overrides/nope-" + fresh()).status_code == 404
        assert admin.delete("/v1/overrides/nope-" + fresh()).status_code == 404


class TestAuth:
    def test_roles(self, server: InProcessService, admin: httpx.Client) -> None:
        viewer, agent = token(admin, "viewer"), token(admin, "agent")
        with as_(server, viewer) as v, as_(server, agent) as a, server.client(None) as anon:
            assert anon.get("/v1/overrides").status_code == 401
            assert anon.get("/v1/selections").status_code == 401
            assert anon.get("/healthz").status_code == 200
            assert v.get("/v1/overrides").status_code == 200
            assert v.get("/v1/audit").status_code == 200
            assert put(v, fresh(), force="CUDNN").status_code == 403
            assert v.post("/v1/select", json=body()).status_code == 403
            assert a.post("/v1/select", json=body()).status_code == 200
            assert a.get("/v1/selections").status_code == 403
            assert put(a, fresh(), force="CUDNN").status_code == 403

    def test_cluster_scoped_admin(self, server: InProcessService, admin: httpx.Client) -> None:
        scoped = token(admin, "admin", ["prod-*"])
        with as_(server, scoped) as s:
            assert put(s, "prod-west", force="CUDNN").status_code == 200
            assert put(s, "staging-1", force="CUDNN").status_code == 403
            assert put(s, "*", force="CUDNN").status_code == 403
            assert s.post("/v1/tokens", json={"name": "x", "role": "admin"}).status_code == 403
            rules = s.get("/v1/rules").json()
            rules["default"] = ["CUDNN", "FLASH_ATTN"]
            assert s.put("/v1/rules", json=rules).status_code == 403
        admin.delete("/v1/overrides/prod-west")

    def test_revoked_token(self, server: InProcessService, admin: httpx.Client) -> None:
        r = admin.post("/v1/tokens", json={"name": "short-lived", "role": "viewer"})
        tok, tid = r.json()["token"], r.json()["id"]
        assert tok not in admin.get("/v1/tokens").text
        with as_(server, tok) as v:
            assert v.get("/v1/rules").status_code == 200
            assert admin.delete(f"/v1/tokens/{tid}").status_code == 204
            assert v.get("/v1/rules").status_code == 401
        assert admin.delete(f"/v1/tokens/{tid}").status_code == 404

    def test_tampered_token(self, server: InProcessService, admin: httpx.Client) -> None:
        tok = token(admin, "viewer")
        with as_(server, tok[:-2] + ("aa" if not tok.endswith("aa") else "bb")) as bad:
            assert bad.get("/v1/rules").status_code == 401


class TestConcurrency:
    def test_rules_round_trip_and_if_match(self, admin: httpx.Client) -> None:
        got = admin.get("/v1/rules")
        etag, doc = got.headers["etag"], got.json()
        doc["by_capability"]["9.0"] = ["FLASHINFER", "CUDNN", "FLASH_ATTN"]
        r = admin.put("/v1/rules", json=doc, headers={"If-Match": etag}, params={"note": "H200"})
        assert r.status_code == 200, r.text
        new = r.json()["rules"]
        assert new["revision"] == doc["revision"] + 1
        assert pick(admin, fresh(), cap=[9, 0])["backend"] == "FLASHINFER"
        assert pick(admin, fresh(), cap=[9, 0])["rules_revision"] == new["revision"]
        assert pick(admin, fresh(), cap=[8, 0])["backend"] == "FLASH_ATTN"
        # the stale ETag is refused and changes nothing
        doc["default"] = ["TORCH_SDPA"]
        stale = admin.put("/v1/rules", json=doc, headers={"If-Match": etag})
        assert stale.status_code == 412
        assert admin.get("/v1/rules").json()["revision"] == new["revision"]
        assert (
            admin.get("/v1/rules", headers={"If-None-Match": r.headers["etag"]}).status_code == 304
        )
        # restore the seed lists for the other tests
        doc = admin.get("/v1/rules").json()
        del doc["by_capability"]["9.0"]
        assert admin.put("/v1/rules", json=doc).status_code == 200

    def test_rules_refuse_unknown_backends_and_bad_keys(self, admin: httpx.Client) -> None:
        doc = admin.get("/v1/rules").json()
        for patch in (
            {"default": ["FA4"]},
            {"by_capability": {"hopper": ["CUDNN"]}},
            {"by_capability": {"9": ["CUDNN", "CUDNN"]}},
            {"clusters": {"BAD": {}}},
        ):
            r = admin.put("/v1/rules", json={**doc, **patch})
            assert r.status_code == 422, (patch, r.text)

    def test_cluster_rules(self, admin: httpx.Client) -> None:
        c = fresh()
        doc = admin.get("/v1/rules").json()
        doc["clusters"] = {c: {"by_capability": {"9": ["CUDNN", "FLASH_ATTN"]}}}
        assert admin.put("/v1/rules", json=doc).status_code == 200
        assert pick(admin, c, cap=[9, 0])["backend"] == "CUDNN"
        assert pick(admin, fresh(), cap=[9, 0])["backend"] == "FLASH_ATTN"
        doc = admin.get("/v1/rules").json()
        doc["clusters"] = {}
        assert admin.put("/v1/rules", json=doc).status_code == 200

    def test_override_if_match(self, admin: httpx.Client) -> None:
        c = fresh()
        first = put(admin, c, force="CUDNN")
        etag = first.headers["etag"]
        assert admin.get(f"/v1/overrides/{c}", headers={"If-None-Match": etag}).status_code == 304
        second = admin.put(
            f"/v1/overrides/{c}",
            json={"force": "FLASH_ATTN", "note": "b"},
            headers={"If-Match": etag},
        )
        assert second.status_code == 200
        third = admin.put(
            f"/v1/overrides/{c}",
            json={"force": "TORCH_SDPA", "note": "c"},
            headers={"If-Match": etag},
        )
        assert third.status_code == 412
        assert admin.get(f"/v1/overrides/{c}").json()["force"] == "FLASH_ATTN"
        assert admin.delete(f"/v1/overrides/{c}", headers={"If-Match": etag}).status_code == 412
        assert (
            admin.delete(
                f"/v1/overrides/{c}", headers={"If-Match": second.headers["etag"]}
            ).status_code
            == 200
        )


def test_audit_log(server: InProcessService, admin: httpx.Client) -> None:
    c = fresh()
    scoped = token(admin, "admin", [c])
    with as_(server, scoped) as s:
        put(s, c, deny=["FLASHINFER"], note="crash on (256, 256)")
        put(s, c, force="CUDNN", note="second thoughts")
        s.delete(f"/v1/overrides/{c}", params={"note": "fixed upstream"})
    items = admin.get("/v1/audit", params={"target": c}).json()["items"]
    assert [i["action"] for i in items] == ["override.delete", "override.put", "override.put"]
    delete, second, first = items
    assert first["before"] is None and first["after"]["deny"] == ["FLASHINFER"]
    assert first["note"] == "crash on (256, 256)"
    assert second["before"]["deny"] == ["FLASHINFER"] and second["after"]["force"] == "CUDNN"
    assert delete["after"] is None and delete["note"] == "fixed upstream"
    assert all(i["actor"].startswith("admin-") for i in items)
    assert isinstance(first["preview"]["pods_total"], int)
    page = admin.get("/v1/audit", params={"target": c, "limit": 2}).json()
    rest = admin.get("/v1/audit", params={"target": c, "cursor": page["next_cursor"]}).json()
    assert [i["id"] for i in page["items"] + rest["items"]] == [i["id"] for i in items]


class TestPreview:
    """Against its own fleet of 1,200 recorded pods (the counts are exact)."""

    # A classmethod: a class-scoped fixture runs once, on an instance no test sees, so
    # pytest 9 deprecates instance-method ones (PytestRemovedIn10Warning); this one
    # keeps no state on the class at all, it yields the service.
    @pytest.fixture(scope="class")
    @classmethod
    def fleet(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
        d = tmp_path_factory.mktemp("fleet")
        service = InProcessService(f"sqlite:///{d / 'fleet.db'}").start()
        with service.client() as c:
            # east: 600 Hopper pods (FLASH_ATTN); west: 400 Blackwell R1 pods
            # (TRTLLM_RAGGED) and 200 Blackwell pods with dims (128, 64, 256) (FLASH_ATTN).
            for i in range(600):
                c.post("/v1/select", json=body(cluster="east", pod=f"e{i}", packages=ALL))
            for i in range(400):
                c.post(
                    "/v1/select", json=body(cap=[10, 0], cluster="west", pod=f"w{i}", packages=ALL)
                )
            for i in range(200):
                c.post(
                    "/v1/select",
                    json=body(cap=[10, 0], dims=ODD, cluster="west", pod=f"g{i}", packages=ALL),
                )
            # a pod that booted twice counts once
            c.post("/v1/select", json=body(cluster="east", pod="e0", packages=ALL))
        # every answer stored before the previews read: a read waits only while the
        # store keeps up (on a busy machine a slow write makes it read what is stored)
        assert service.runtime.recorder.flush(60), "the seeded decisions were not stored"
        yield service
        service.stop()

    def test_seeded(self, fleet: InProcessService) -> None:
        with fleet.client() as c:
            assert c.get("/v1/selections/summary").json()["clusters"] == {
                "east": {"FLASH_ATTN": 600},
                "west": {"FLASH_ATTN": 200, "TRTLLM_RAGGED": 400},
            }

    def test_fleet_deny_preview(self, fleet: InProcessService) -> None:
        with fleet.client() as c:
            p = c.post(
                "/v1/preview",
                json={"override": {"cluster": "*", "deny": ["TRTLLM_RAGGED"], "note": "what if"}},
            ).json()
            assert p["pods_total"] == 1200
            assert p["pods_changed"] == 400
            why = [
                "TRTLLM_RAGGED: denied by fleet override (*): what if",
                "Using FLASHINFER: first valid backend in the priority list (fleet rule for "
                "capability 10: TRTLLM_RAGGED, FLASHINFER, CUDNN, FLASH_ATTN).",
            ]
            assert p["changes"] == [
                {"cluster": "west", "from": "TRTLLM_RAGGED", "to": "FLASHINFER", "pods": 400,
                 "reasons": [{"pods": 400, "why": why, "exclusions": {}}]}
            ]  # fmt: skip
            assert p["clusters_affected"] == ["west"]

    def test_rules_preview_and_dry_run_change_nothing(self, fleet: InProcessService) -> None:
        with fleet.client() as c:
            doc = c.get("/v1/rules").json()
            doc["by_capability"]["9"] = ["CUDNN", "FLASH_ATTN"]
            r = c.put("/v1/rules", json=doc, params={"dry_run": "true"})
            assert r.status_code == 200
            p = r.json()["preview"]
            assert p["pods_changed"] == 600
            why = [
                "Using CUDNN: first valid backend in the priority list (fleet rule for "
                "capability 9: CUDNN, FLASH_ATTN)."
            ]
            assert p["changes"] == [
                {"cluster": "east", "from": "FLASH_ATTN", "to": "CUDNN", "pods": 600,
                 "reasons": [{"pods": 600, "why": why, "exclusions": {}}]}
            ]  # fmt: skip
            assert c.get("/v1/rules").json()["revision"] == doc["revision"]
            assert c.get("/v1/audit", params={"action": "rules.replace"}).json()["items"] == []

    def test_override_dry_run_and_invalid(self, fleet: InProcessService) -> None:
        with fleet.client() as c:
            r = c.put(
                "/v1/overrides/west",
                params={"dry_run": "true"},
                json={"force": "CUDNN", "note": "try cudnn"},
            )
            p = r.json()["preview"]
            # R1 pods move to CUDNN; small-dims pods cannot run it (dims) and keep FLASH_ATTN
            assert p["pods_changed"] == 400 and p["pods_invalid"] == 0
            assert c.get("/v1/overrides/west").status_code == 404
            for i in range(3):  # three strict pods that insist on TRTLLM_RAGGED
                c.post(
                    "/v1/select",
                    json=body(
                        cap=[10, 0],
                        cluster="west",
                        pod=f"s{i}",
                        requested_backend="TRTLLM_RAGGED",
                        strict=True,
                    ),
                )
            assert fleet.runtime.recorder.flush(60), "the strict pods' decisions were not stored"
            p = c.post(
                "/v1/preview",
                json={"override": {"cluster": "west", "deny": ["TRTLLM_RAGGED"], "note": "x"}},
            ).json()
            assert p["pods_invalid"] == 3
            assert p["invalid"][0]["from"] == "TRTLLM_RAGGED"
            assert "denied by override west" in p["invalid"][0]["reason"]

    def test_a_staged_override_previews_as_its_dry_run(self, fleet: InProcessService) -> None:
        """A proposal with a rollout answered 500: the preview built the override
        without the rollout's state (its id), which the write path adds."""
        spec = {"force": "TORCH_SDPA", "note": "canary", "rollout": {"percent": 50}}
        with fleet.client() as c:
            p = c.post("/v1/preview", json={"override": {"cluster": "east", **spec}})
            assert p.status_code == 200, p.text
            dry = c.put("/v1/overrides/east", params={"dry_run": "true"}, json=spec)
            assert p.json() == dry.json()["preview"]
            assert 0 < p.json()["pods_changed"] < 600  # half of east's pods, by name

    def test_the_openapi_document_says_why_pods_move(self, fleet: InProcessService) -> None:
        with fleet.client() as c:
            doc = c.get("/openapi.json").json()
        ok = doc["paths"]["/v1/preview"]["post"]["responses"]["200"]["content"]
        assert ok["application/json"]["schema"]["$ref"].endswith("/Preview")
        schemas = doc["components"]["schemas"]
        change = schemas["Preview"]["properties"]["changes"]["items"]["$ref"].split("/")[-1]
        props = schemas[change]["properties"]
        assert {"cluster", "from", "to", "pods", "reasons"} <= set(props)
        reason = schemas[props["reasons"]["items"]["$ref"].split("/")[-1]]
        assert reason["properties"]["why"]["items"] == {"type": "string"}

    def test_preview_needs_exactly_one_proposal(self, fleet: InProcessService) -> None:
        with fleet.client() as c:
            assert c.post("/v1/preview", json={}).status_code == 422
            doc = c.get("/v1/rules").json()
            both = {"rules": doc, "delete_override": "west"}
            assert c.post("/v1/preview", json=both).status_code == 422

    def test_applied_override_audit_has_counts(self, fleet: InProcessService) -> None:
        with fleet.client() as c:
            r = c.put("/v1/overrides/east", json={"force": "TORCH_SDPA", "note": "drill"})
            assert r.json()["preview"]["pods_changed"] == 600
            (entry,) = c.get("/v1/audit", params={"target": "east"}).json()["items"]
            assert entry["preview"]["pods_changed"] == 600
            # The next change is judged against the config in force, not against what
            # the 600 east pods still run (they have not rebooted): a west-only change
            # moves no east pod, and the east pods show as pending.
            p = c.post(
                "/v1/preview",
                json={"override": {"cluster": "west", "deny": ["TRTLLM_RAGGED"], "note": "x"}},
            ).json()
            assert {ch["cluster"] for ch in p["changes"]} == {"west"}
            assert p["pods_pending"] == 600
            # removing the drill returns east to what its pods run
            p = c.delete("/v1/overrides/east", params={"dry_run": "true"}).json()["preview"]
            why = [
                "Override east no longer applies.",
                "Using FLASH_ATTN: first valid backend in the priority list (fleet rule "
                "default: FLASH_ATTN).",
            ]
            assert p["changes"] == [
                {"cluster": "east", "from": "TORCH_SDPA", "to": "FLASH_ATTN", "pods": 600,
                 "reasons": [{"pods": 600, "why": why, "exclusions": {}}]}
            ]  # fmt: skip
            c.delete("/v1/overrides/east")


def test_metrics_count_override_writes(admin: httpx.Client) -> None:
    before = admin.get("/metrics").text
    put(admin, fresh(), force="CUDNN")
    after = admin.get("/metrics").text

    def value(text: str) -> float:
        for line in text.splitlines():
            if line.startswith('switchboard_override_writes_total{action="put"}'):
                return float(line.split()[-1])
        return 0.0

    assert value(after) == value(before) + 1
