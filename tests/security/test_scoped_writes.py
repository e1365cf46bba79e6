"""Issue 13, item 4 (finding 4): admin writes are checked against the database, not a
replica's memory.

Two replicas (apps with their own runtimes) on one PostgreSQL schema; replica B polls
for others' changes only every 60 s, so it is stale for the whole test (the finding's
"replica that has not yet seen another admin's change"). An unrestricted admin changes
the fleet rules through A; a token limited to ``prod-*`` then reads the rules from B
and writes its cluster's rule set back through B. Before: B checked the scope against
its stale copy and wrote the whole document, reverting the fleet change (5 times out
of 5). Now the write is a 412 (the document's revision is stale), or, read fresh,
changes only ``prod-*`` rule sets; the fleet change is never reverted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import httpx
import pytest

from tests.conftest import InProcessService

pytestmark = pytest.mark.postgres


@pytest.fixture
def replicas(
    pg_url_factory: Callable[[], str], inprocess_factory: type[InProcessService]
) -> tuple[InProcessService, InProcessService]:
    """Two apps on one schema, each with its own runtime (its own copy of the config)."""
    url = pg_url_factory()
    a = inprocess_factory(url).start()
    b = inprocess_factory(url, env={"SWITCHBOARD_CONFIG_POLL_S": "60"}).start()
    return a, b


def token(c: httpx.Client, role: str, clusters: list[str] | None) -> str:
    name = f"{role}-{uuid.uuid4().hex[:6]}"
    r = c.post("/v1/tokens", json={"name": name, "role": role, "clusters": clusters})
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


def test_scoped_rules_write_through_a_stale_replica_never_reverts(
    replicas: tuple[InProcessService, InProcessService],
) -> None:
    a, b = replicas
    with a.client() as admin_a:
        scoped = token(admin_a, "admin", ["prod-*"])
        doc = admin_a.get("/v1/rules").json()
        doc["clusters"] = {"dev-other": {"default": ["FLASHINFER", "FLASH_ATTN"]}}
        assert admin_a.put("/v1/rules", json=doc).status_code == 200
    with b.client() as admin_b:
        admin_b.get("/v1/tokens")  # B learns the new token (its own read is from memory)
    # B must know the scoped token: a write on B reloads B; make one that changes nothing
    with b.client() as admin_b:
        r = admin_b.put("/v1/overrides/warmup-b", json={"deny": ["CUDNN"], "note": "reload"})
        assert r.status_code == 200, r.text
    for attempt in range(5):
        fleet = ["CUDNN", "FLASH_ATTN"] if attempt % 2 == 0 else ["FLASHINFER", "FLASH_ATTN"]
        with a.client() as admin_a:  # the other admin's fleet-wide change, through A
            doc = admin_a.get("/v1/rules").json()
            doc["default"] = fleet
            r = admin_a.put("/v1/rules", json=doc)
            assert r.status_code == 200, r.text
        with b.client(scoped) as s:
            stale = s.get("/v1/rules").json()
            assert stale["default"] != fleet, "B must still be stale for this test"
            stale["clusters"]["prod-east"] = {"default": ["FLASH_ATTN"]}
            r = s.put("/v1/rules", json=stale)
            assert r.status_code == 412, r.text
            # without the revision it read, the stale fleet lists are refused: never applied
            del stale["revision"]
            assert s.put("/v1/rules", json=stale).status_code in (403, 412)
            # with If-Match from the stale read: 412 as well
            etag = s.get("/v1/rules").headers["etag"]
            r = s.put("/v1/rules", json=stale, headers={"If-Match": etag})
            assert r.status_code == 412, r.text
        with a.client() as admin_a:
            now = admin_a.get("/v1/rules").json()
            assert now["default"] == fleet, f"attempt {attempt}: fleet change reverted"
            assert "dev-other" in now["clusters"]
    # read fresh (from A), written through stale B: only prod-east changes
    with a.client(scoped) as s:
        fresh = s.get("/v1/rules").json()
    assert set(fresh["clusters"]) <= {"prod-east"}  # dev-other is not shown to prod-*
    fresh["clusters"]["prod-east"] = {"default": ["FLASH_ATTN"]}
    with b.client(scoped) as s:
        r = s.put("/v1/rules", json=fresh)
        assert r.status_code == 200, r.text
    with a.client() as admin_a:
        deadline = time.monotonic() + 10  # A sees B's write within its poll interval
        while "prod-east" not in (now := admin_a.get("/v1/rules").json())["clusters"]:
            assert time.monotonic() < deadline, now
            time.sleep(0.1)
        assert now["default"] == fleet
        assert now["clusters"]["prod-east"] == {"default": ["FLASH_ATTN"], "by_capability": {}}
        assert now["clusters"]["dev-other"]["default"] == ["FLASHINFER", "FLASH_ATTN"]
        audit = admin_a.get("/v1/audit", params={"action": "rules.replace", "limit": 1})
        entry = audit.json()["items"][0]
        assert entry["before"]["default"] == entry["after"]["default"] == fleet


def test_scoped_admin_cannot_touch_other_clusters_or_the_fleet(
    replicas: tuple[InProcessService, InProcessService],
) -> None:
    a, _ = replicas
    with a.client() as admin_a:
        scoped = token(admin_a, "admin", ["prod-*"])
    with a.client(scoped) as s:
        doc = s.get("/v1/rules").json()
        doc["clusters"]["dev-x"] = {"default": ["CUDNN"]}
        r = s.put("/v1/rules", json=doc)
        assert r.status_code == 403 and "dev-x" in r.text
        doc = s.get("/v1/rules").json()
        doc["default"] = ["TORCH_SDPA"]
        assert s.put("/v1/rules", json=doc).status_code == 403


def test_override_write_through_a_stale_replica_is_412(
    replicas: tuple[InProcessService, InProcessService],
) -> None:
    a, b = replicas
    with a.client() as admin_a:
        scoped = token(admin_a, "admin", ["prod-*"])
        first = admin_a.put("/v1/overrides/prod-east", json={"deny": ["CUDNN"], "note": "one"})
        assert first.status_code == 200
    with b.client() as admin_b:  # B reloads on its own write: it knows the token now
        assert admin_b.put("/v1/overrides/b-warm", json={"deny": ["CUDNN"], "note": "w"}).is_success
    with a.client() as admin_a:
        second = admin_a.put(
            "/v1/overrides/prod-east", json={"deny": ["FLASHINFER"], "note": "two"}
        )
        assert second.status_code == 200
    with b.client(scoped) as s:
        stale = s.get("/v1/overrides/prod-east")
        assert stale.json()["note"] == "one", "B must still be stale for this test"
        r = s.put(
            "/v1/overrides/prod-east",
            json={"deny": ["CUDNN"], "note": "three"},
            headers={"If-Match": stale.headers["etag"]},
        )
        assert r.status_code == 412, r.text
        r = s.delete("/v1/overrides/prod-east", headers={"If-Match": stale.headers["etag"]})
        assert r.status_code == 412, r.text
    with a.client() as admin_a:
        assert admin_a.get("/v1/overrides/prod-east").json()["note"] == "two"
