"""Every admin write takes an ``Idempotency-Key``: a retry after a lost answer gets the
first answer (``Idempotent-Replayed: true``) and never writes a second audit entry; the
same key with another request is a 422 naming the header. Keys are kept per token (its
id), never per token name: two tokens that share a name share no answers.

Each write is tried in-process and through a real ``switchboard serve`` process."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN, InProcessService, make_inprocess_client

STAGED = {"force": "FLASHINFER", "note": "INC-4 try flashinfer", "rollout": {"percent": 20}}
SITUATION = {
    "device": "NVIDIA H200",
    "capability": "9.0",
    "dims": [128, 64, 128],
    "dtype": "bfloat16",
    "note": "driver 580 fixed it",
}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def admin(request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[httpx.Client]:
    """A fresh app per test (keys are remembered per database), on either store."""
    if request.param == "sqlite":
        with make_inprocess_client(sqlite_url) as client:  # type: ignore[attr-defined]
            client.headers["Authorization"] = f"Bearer {ADMIN}"
            yield client
        return
    url = request.getfixturevalue("pg_url_factory")()
    with InProcessService(url) as service, service.client() as client:
        yield client


def audit_count(c: httpx.Client, action: str) -> int:
    r = c.get("/v1/audit", params={"action": action, "limit": 100})
    assert r.status_code == 200, r.text
    return len(r.json()["items"])


def new_token(c: httpx.Client, **body: Any) -> dict[str, Any]:
    r = c.post("/v1/tokens", json={"role": "admin", **body})
    assert r.status_code == 201, r.text
    return r.json()


# Each write: what prepares it, the write (headers given), the same key for another
# request, the audit action it writes, and the status a retry answers.
Write = tuple[
    Callable[[httpx.Client], Any],
    Callable[[httpx.Client, dict[str, str], Any], httpx.Response],
    Callable[[httpx.Client, dict[str, str], Any], httpx.Response],
    str,
    int,
]
WRITES: dict[str, Write] = {
    "token POST": (
        lambda c: None,
        lambda c, h, _: c.post("/v1/tokens", json={"name": "ci", "role": "agent"}, headers=h),
        lambda c, h, _: c.post("/v1/tokens", json={"name": "ci", "role": "viewer"}, headers=h),
        "token.create",
        409,  # the secret is never kept: the retry names the token the first one made
    ),
    "token DELETE": (
        lambda c: (new_token(c, name="a")["id"], new_token(c, name="b")["id"]),
        lambda c, h, ids: c.delete(f"/v1/tokens/{ids[0]}", headers=h),
        lambda c, h, ids: c.delete(f"/v1/tokens/{ids[1]}", headers=h),
        "token.revoke",
        204,
    ),
    "override DELETE": (
        lambda c: [c.put(f"/v1/overrides/{s}", json=STAGED) for s in ("prod-east", "prod-west")],
        lambda c, h, _: c.delete("/v1/overrides/prod-east", headers=h),
        lambda c, h, _: c.delete("/v1/overrides/prod-west", headers=h),
        "override.delete",
        200,
    ),
    "rules PUT": (
        lambda c: c.get("/v1/rules").json(),  # a retry sends the same document again
        lambda c, h, doc: c.put("/v1/rules", json=doc, params={"note": "one"}, headers=h),
        lambda c, h, doc: c.put("/v1/rules", json=doc, params={"note": "two"}, headers=h),
        "rules.replace",
        200,
    ),
    "rollout action": (
        lambda c: c.put("/v1/overrides/prod-east", json=STAGED),
        lambda c, h, _: c.post(
            "/v1/overrides/prod-east/rollout", json={"action": "halt", "note": "INC-4"}, headers=h
        ),
        lambda c, h, _: c.post(
            "/v1/overrides/prod-east/rollout", json={"action": "halt", "note": "other"}, headers=h
        ),
        "rollout.halt",
        200,
    ),
    "failure clear": (
        lambda c: None,
        lambda c, h, _: c.post("/v1/measurements/failures/clear", json=SITUATION, headers=h),
        lambda c, h, _: c.post(
            "/v1/measurements/failures/clear", json={**SITUATION, "note": "other"}, headers=h
        ),
        "evidence.clear_failures",
        200,
    ),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_retry_gets_the_first_answer_and_writes_no_second_entry(
    admin: httpx.Client, write: str
) -> None:
    prepare, send, other, action, retry_status = WRITES[write]
    prepared = prepare(admin)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    first = send(admin, key, prepared)
    assert first.status_code in (200, 201, 204), first.text
    assert audit_count(admin, action) == 1
    again = send(admin, key, prepared)
    assert again.status_code == retry_status, again.text
    if retry_status == 409:
        assert again.json()["detail"]["id"] == first.json()["id"]
    else:
        assert again.headers.get("Idempotent-Replayed") == "true"
        if first.content:
            assert again.json() == {k: v for k, v in first.json().items() if k != "message"}
    assert audit_count(admin, action) == 1
    reused = other(admin, key, prepared)
    assert reused.status_code == 422, reused.text
    assert reused.json()["detail"][0]["loc"] == ["header", "idempotency-key"]
    assert audit_count(admin, action) == 1
    # without a key (or with a new one) the same request is a request of its own
    if write == "token POST":
        assert send(admin, {"Idempotency-Key": str(uuid.uuid4())}, prepared).status_code == 201
        assert audit_count(admin, action) == 2


def test_two_tokens_with_one_name_share_no_answers(admin: httpx.Client) -> None:
    """Token names are not unique: keys kept per name handed one token the answer (and
    the preview of its scope) computed under the other's, and made no write of its own."""
    wide = new_token(admin, name="ops", clusters=["prod-*"])["token"]
    narrow = new_token(admin, name="ops", clusters=["prod-east"])["token"]
    key = {"Idempotency-Key": "deploy-2026-12-01"}
    answers = []
    for token in (wide, narrow):
        r = admin.put(
            "/v1/overrides/prod-east",
            json={"deny": ["CUDNN"], "note": "INC-5"},
            headers={**key, "Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 200, r.text
        answers.append(r)
    assert "Idempotent-Replayed" not in answers[1].headers
    revisions = [a.json()["override"]["revision"] for a in answers]
    assert revisions[1] == revisions[0] + 1  # its own write
    entries = admin.get("/v1/audit", params={"action": "override.put"}).json()["items"]
    assert [e["actor"] for e in entries] == ["ops", "ops"]


def test_the_bootstrap_tokens_keys_outlive_a_restart(tmp_path: Path) -> None:
    """The environment's admin token has an id of its own, the same at every start."""
    url = f"sqlite:///{tmp_path / 'sb.db'}"
    key = {"Idempotency-Key": "put-once", "Authorization": f"Bearer {ADMIN}"}
    answers = []
    for _ in range(2):
        with make_inprocess_client(url) as c:  # type: ignore[attr-defined]
            answers.append(c.put("/v1/overrides/prod-east", json=STAGED, headers=key))
    assert answers[1].headers.get("Idempotent-Replayed") == "true", answers[1].text
    assert answers[1].json()["override"] == answers[0].json()["override"]
