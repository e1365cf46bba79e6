"""``POST /v1/select``'s lean ASGI handler answers exactly as the FastAPI route does.

The app hands ``POST /v1/select`` to ``SelectHandler`` (service/api/select_asgi.py)
before FastAPI sees it. The FastAPI route is still registered, and reached here by
calling FastAPI's own ``__call__`` on the same app (same runtime, same tokens): it is
the reference. For a table of good and bad requests, the lean handler must give the
same status, the same headers in the same order and the same body bytes (decision ids
aside, which differ per answer), in process and through a real ``switchboard serve``
process; and every answer must be counted under route ``/v1/select``.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from tests.conftest import ADMIN, ServiceProcess, make_inprocess_client

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

GOOD: dict[str, Any] = {
    "cluster": "prod-east",
    "node": "gpu-17",
    "pod": "r1-0",
    "device": {"name": "GPU", "capability": [9, 0]},
    "model": {
        "name": "deepseek-ai/DeepSeek-R1",
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "num_heads": 128,
    },
    "dtype": "bfloat16",
}
RAW = json.dumps(GOOD).encode()
JSON = {"content-type": "application/json"}
HUGE = json.dumps({**GOOD, "padding": "x" * 70_000}).encode()  # over the 64 KiB limit


def _dim(value: bytes) -> bytes:
    return RAW.replace(b'"qk_nope_head_dim": 128', b'"qk_nope_head_dim": ' + value)


def _chunks(raw: bytes, size: int = 8192) -> Callable[[], Iterator[bytes]]:
    """A body sent without Content-Length (chunked), ``size`` bytes at a time."""

    def gen() -> Iterator[bytes]:
        for i in range(0, len(raw), size):
            yield raw[i : i + size]

    return gen


@dataclass(frozen=True)
class Case:
    name: str
    status: int
    body: bytes | Callable[[], Iterator[bytes]] = RAW
    headers: dict[str, str] | None = None  # None: JSON with the admin token
    token: str | None = None  # a token of the ``tokens`` fixture, by name
    query: str = ""  # the request's query string, "?dry_run=true"

    def request_headers(self, tokens: dict[str, str]) -> dict[str, str]:
        headers = dict(JSON if self.headers is None else self.headers)
        if self.token is not None:
            headers["authorization"] = f"Bearer {tokens[self.token]}"
        return headers

    def content(self) -> bytes | Iterator[bytes]:
        return self.body if isinstance(self.body, bytes) else self.body()


CASES = [
    Case("ok", 200),
    Case("ok-charset", 200, headers={"content-type": "application/json; charset=utf-8"}),
    Case("ok-plus-json", 200, headers={"content-type": "application/vnd.sb+json"}),
    Case("ok-chunked", 200, _chunks(RAW, 100)),
    Case("agent-token", 200, token="agent"),
    Case("scoped-in-scope", 200, RAW.replace(b"prod-east", b"lab-1"), token="scoped"),
    Case("text-plain", 422, headers={"content-type": "text/plain"}),
    Case("form", 422, headers={"content-type": "application/x-www-form-urlencoded"}),
    Case("no-content-type", 422, headers={}),
    Case("truncated-json", 422, b'{"cluster": '),
    Case("empty", 422, b""),
    Case("null", 422, b"null"),
    Case("list", 422, b"[1, 2, 3]"),
    Case("not-utf8", 422, b'{"a": "\xff\xfe"}'),
    Case("not-utf8-in-field", 422, RAW.replace(b'"r1-0"', b'"r1-\xff"')),
    Case("lone-surrogate", 422, RAW.replace(b'"r1-0"', b'"\\ud800"')),
    Case("deep", 422, b'{"x": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"),
    Case("missing-fields", 422, b"{}"),
    Case("unknown-field", 422, json.dumps({**GOOD, "requested_backnd": "CUDNN"}).encode()),
    Case("bad-cluster", 422, json.dumps({**GOOD, "cluster": "Prod"}).encode()),
    Case("nan", 422, _dim(b"NaN")),
    Case("infinity", 422, _dim(b"Infinity")),
    Case("minus-infinity", 422, RAW.replace(b"[9, 0]", b"[-Infinity, 0]")),
    Case("fraction", 422, _dim(b"12.5")),
    Case("oversized", 413, HUGE),
    Case("oversized-chunked", 413, _chunks(HUGE)),
    Case("no-token", 401, headers={**JSON, "authorization": ""}),
    Case("not-bearer", 401, headers={**JSON, "authorization": "Basic YTpi"}),
    Case("wrong-token", 401, headers={**JSON, "authorization": "Bearer nope"}),
    Case("unknown-token", 401, headers={**JSON, "authorization": "Bearer sb_abcdef_xyz"}),
    Case("bad-body-before-token", 422, b"{}", headers={**JSON, "authorization": ""}),
    Case("viewer-role", 403, token="viewer"),
    Case("out-of-scope", 403, token="scoped"),
    Case(
        "strict-refusal",
        409,
        json.dumps(
            {**GOOD, "requested_backend": "cudnn", "packages": {"torch": "2"}, "strict": True}
        ).encode(),
    ),
    Case("if-none-match-other", 200, headers={**JSON, "if-none-match": '"nope"'}),
    Case("dry-run", 200, query="?dry_run=true"),
    Case("dry-run-false", 200, query="?dry_run=false"),
    Case("dry-run-one", 200, query="?dry_run=1"),
    Case("dry-run-not-a-boolean", 422, query="?dry_run=maybe"),
    Case("dry-run-bad-body-first", 422, b"{}", query="?dry_run=maybe"),
    Case("dry-run-no-token", 401, headers={**JSON, "authorization": ""}, query="?dry_run=1"),
]
DRY = {"dry-run", "dry-run-one"}

# Headers a server adds by itself, whichever answered.
SERVER_HEADERS = {b"date", b"server"}


def normalised(r: httpx.Response) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers in order and body, with the decision id (new per answer) masked."""
    decision_id = r.headers.get("x-decision-id")
    body = r.content
    headers = [(k.lower(), v) for k, v in r.headers.raw if k.lower() not in SERVER_HEADERS]
    if decision_id is not None:
        assert re.fullmatch(r"[0-9a-f]{26}", decision_id), decision_id
        body = body.replace(decision_id.encode(), b"<id>")
        headers = [(k, b"<id>" if k == b"x-decision-id" else v) for k, v in headers]
    return r.status_code, headers, body


@dataclass
class Apps:
    lean: httpx.Client  # the app as served: the lean handler answers /v1/select
    reference: httpx.Client  # the same app through FastAPI only
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apps]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fast-path') / 'sb.db'}"
    with make_inprocess_client(url) as lean:  # type: ignore[attr-defined]
        app = lean.app

        async def fastapi_only(scope: Scope, receive: Receive, send: Send) -> None:
            # as the app serves every other request: FastAPI, with the headers its
            # edge sets on every API answer (Cache-Control: no-store)
            await FastAPI.__call__(app, scope, receive, app.edge.wrap(scope, send))

        # not entered: the runtime is the one the lean client's lifespan started
        reference = TestClient(fastapi_only, headers={"Authorization": f"Bearer {ADMIN}"})
        yield Apps(lean, reference, make_tokens(lean))


def make_tokens(admin: httpx.Client) -> dict[str, str]:
    """The same token names on every server, so that 403 messages match."""
    made = {}
    for name, role, clusters in [
        ("viewer", "viewer", None),
        ("agent", "agent", None),
        ("scoped", "agent", ["lab-*"]),
    ]:
        r = admin.post("/v1/tokens", json={"name": name, "role": role, "clusters": clusters})
        assert r.status_code == 201, r.text
        made[name] = r.json()["token"]
    return made


def send(client: httpx.Client, case: Case, tokens: dict[str, str]) -> httpx.Response:
    return client.post(
        "/v1/select" + case.query, content=case.content(), headers=case.request_headers(tokens)
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_same_answer_as_fastapi(apps: Apps, case: Case) -> None:
    lean = send(apps.lean, case, apps.tokens)
    reference = send(apps.reference, case, apps.tokens)
    assert lean.status_code == case.status, lean.text[:500]
    assert normalised(lean) == normalised(reference)


def test_error_bodies(apps: Apps) -> None:
    """What the table above compares is the contract, not only an agreement."""
    by_name = {c.name: c for c in CASES}

    def answer(name: str) -> httpx.Response:
        return send(apps.lean, by_name[name], apps.tokens)

    r = answer("no-token")
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {
        "detail": {"message": "missing bearer token (Authorization: Bearer <token>)"}
    }
    r = answer("wrong-token")
    assert r.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert answer("out-of-scope").json()["detail"]["message"] == (
        "token 'scoped' is limited to clusters lab-*; not 'prod-east'"
    )
    assert answer("viewer-role").json()["detail"]["message"] == (
        "token 'viewer' has role viewer; this needs agent"
    )
    r = answer("oversized-chunked")
    assert r.headers["connection"] == "close"
    assert r.json() == {"detail": {"message": "request body over 65536 bytes"}}
    (problem,) = answer("nan").json()["detail"]
    assert problem["loc"] == ["body", "model", "qk_nope_head_dim"] and problem["input"] == "NaN"
    (problem,) = answer("not-utf8").json()["detail"]
    assert problem["type"] == "json_invalid" and "input" not in problem
    (problem,) = answer("no-content-type").json()["detail"]
    assert problem == {
        "type": "content_type",
        "loc": ["body"],
        "input": None,
        "msg": "expected Content-Type: application/json",
    }
    assert answer("strict-refusal").json()["detail"]["kind"] == "requested_invalid"


def test_if_none_match(apps: Apps) -> None:
    first = apps.lean.post("/v1/select", content=RAW, headers=JSON)
    etag = first.headers["etag"]
    for header in (etag, f'"a", {etag}', f' {etag} ,"b"'):
        lean = apps.lean.post("/v1/select", content=RAW, headers={**JSON, "if-none-match": header})
        ref = apps.reference.post(
            "/v1/select", content=RAW, headers={**JSON, "if-none-match": header}
        )
        assert lean.status_code == 304 and lean.content == b""
        assert [k for k, _ in lean.headers.raw] == [b"etag", b"x-decision-id", b"cache-control"]
        assert normalised(lean) == normalised(ref)
        assert lean.headers["x-decision-id"] != first.headers["x-decision-id"]


def test_other_methods_are_fastapis(apps: Apps) -> None:
    for method in ("GET", "HEAD", "PUT", "DELETE"):
        r = apps.lean.request(method, "/v1/select")
        assert r.status_code == 405 and r.headers["allow"] == "POST", (method, r.text)
    # a path the lean handler does not claim is routed as before (a redirect here)
    r = apps.lean.post("/v1/select/", content=RAW, headers=JSON, follow_redirects=False)
    assert r.status_code == 307


def test_openapi_still_documents_the_route(apps: Apps) -> None:
    doc = apps.lean.get("/openapi.json").json()
    operation = doc["paths"]["/v1/select"]["post"]
    assert set(doc["paths"]["/v1/select"]) == {"post"}
    statuses = {"200", "304", "401", "403", "409", "413", "422", "429"}  # 429: wrong tokens
    assert set(operation["responses"]) == statuses
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SelectRequest"
    }
    assert operation["security"] == [{"HTTPBearer": []}]
    assert operation["parameters"][0]["name"] == "If-None-Match"


def _counts(client: httpx.Client) -> dict[tuple[str, str], float]:
    """switchboard_request_seconds_count by (route, status), POST only."""
    counts = {}
    pattern = re.compile(
        r'switchboard_request_seconds_count\{method="POST",route="([^"]*)",status="(\d+)"\} (\S+)'
    )
    for line in client.get("/metrics").text.splitlines():
        m = pattern.fullmatch(line)
        if m:
            counts[(m[1], m[2])] = float(m[3])
    return counts


def _decisions(client: httpx.Client, cluster: str) -> float:
    text = client.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("switchboard_decisions_total{") and f'cluster="{cluster}"' in line
    )


def test_metrics_count_the_route(apps: Apps) -> None:
    before = _counts(apps.lean)
    decisions_before = _decisions(apps.lean, "prod-east")
    expected: dict[str, int] = {}
    for case in CASES:
        assert send(apps.lean, case, apps.tokens).status_code == case.status
        expected[str(case.status)] = expected.get(str(case.status), 0) + 1
    after = _counts(apps.lean)
    for status, n in expected.items():
        key = ("/v1/select", status)
        assert after.get(key, 0) - before.get(key, 0) == n, (status, before, after)
    assert ("unmatched", "413") not in after or after[("unmatched", "413")] == before.get(
        ("unmatched", "413")
    )
    answered = sum(
        1 for c in CASES if c.status == 200 and c.token != "scoped" and c.name not in DRY
    )
    assert _decisions(apps.lean, "prod-east") - decisions_before == answered
    refusals = apps.lean.get("/metrics").text
    assert 'switchboard_refusals_total{kind="requested_invalid"}' in refusals


def test_a_dry_run_records_nothing(apps: Apps) -> None:
    r = apps.lean.post(
        "/v1/select?dry_run=true", content=RAW.replace(b"r1-0", b"dry-1"), headers=JSON
    )
    assert r.status_code == 200 and r.json()["decision_id"] is None
    assert "x-decision-id" not in r.headers and r.headers["etag"]
    assert r.json()["backend"] and r.json()["candidates"]
    apps.lean.app.state.runtime.recorder.flush()  # type: ignore[attr-defined]
    assert apps.lean.get("/v1/selections", params={"pod": "dry-1"}).json()["items"] == []
    assert apps.lean.get("/v1/pods", params={"q": "dry-1"}).json()["items"] == []


def test_decisions_are_stored(apps: Apps) -> None:
    r = apps.lean.post("/v1/select", content=RAW.replace(b"r1-0", b"stored-1"), headers=JSON)
    assert r.status_code == 200
    (item,) = apps.lean.get("/v1/selections", params={"pod": "stored-1"}).json()["items"]
    assert item["decision_id"] == r.headers["x-decision-id"] == r.json()["decision_id"]
    assert item["backend"] == r.json()["backend"]


def test_repeated_headers_read_the_first(apps: Apps) -> None:
    """Starlette's ``headers.get`` reads the first of repeated headers; so does the
    lean handler (a second Authorization cannot override the first)."""
    headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer nope"),
        ("authorization", f"Bearer {ADMIN}"),
    ]
    lean = apps.lean.post("/v1/select", content=RAW, headers=headers)
    reference = apps.reference.post("/v1/select", content=RAW, headers=headers)
    assert lean.status_code == 401
    assert normalised(lean) == normalised(reference)


# ------------------------------------------------------------ a real server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, Any]]:
    d: Path = tmp_path_factory.mktemp("fast-path-served")
    service = ServiceProcess(f"sqlite:///{d / 'sb.db'}").start(d)
    with service.client() as admin:
        tokens = make_tokens(admin)
    yield service, tokens
    service.stop()


def test_served_answers_match_the_reference(
    apps: Apps, served: tuple[ServiceProcess, dict[str, str]]
) -> None:
    """Through uvicorn on loopback, the lean handler's answers are the in-process
    FastAPI route's, header for header (uvicorn adds only date and server)."""
    service, tokens = served
    with service.client() as c:
        for case in CASES:
            got = send(c, case, tokens)
            want = send(apps.reference, case, apps.tokens)
            assert got.status_code == case.status, (case.name, got.text[:300])
            assert normalised(got) == normalised(want), case.name
            assert {k.lower() for k, _ in got.headers.raw} >= SERVER_HEADERS
        counts = _counts(c)
    for status in {str(case.status) for case in CASES}:
        assert counts.get(("/v1/select", status), 0) >= 1, (status, counts)
