"""Issue 13, item 8 (finding 9): no input makes the service answer 5xx.

Through real server processes, on SQLite and on PostgreSQL (which cannot hold NUL or
lone surrogates in text, so a value that slips through fails in the store there):

- a lone UTF-16 surrogate (``"\\ud800"``, as a JSON escape or as raw CESU-8 bytes)
  anywhere in a JSON body is a 422 naming the field, with a body that is valid JSON;
- ``GET /v1/selections/abc%00def`` is a 4xx, not 503 "store unavailable", and counts
  no store error;
- cluster names hold a letter or a digit: ``.``, ``..``, ``...`` are refused wherever
  a cluster is named (override scopes, select, measurements, cluster rules).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ServiceProcess

R1 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
SURROGATE = "\\ud800"  # as it appears in JSON text: a lone leading surrogate escape


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    d = tmp_path_factory.mktemp("no5xx")
    if request.param == "sqlite":
        url = f"sqlite:///{d / 'sb.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    s = ServiceProcess(url).start(d)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def decision_id(service: ServiceProcess) -> str:
    with service.client() as c:
        r = c.post("/v1/select", json=select_body("no5xx", pod="p1"))
        assert r.status_code == 200, r.text
        return str(r.json()["decision_id"])


def select_body(cluster: str, **kw: Any) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "device": {"name": "NVIDIA H200", "capability": [9, 0]},
        "model": R1,
        "dtype": "bfloat16",
        **kw,
    }


def measurement(cluster: str = "no5xx", pod: str = "p1") -> dict[str, Any]:
    return {
        "cluster": cluster,
        "pod": pod,
        "device": {"name": "NVIDIA H200", "capability": [9, 0]},
        "model": R1,
        "dtype": "bfloat16",
        "packages": {"torch": "2.11.0"},
        "results": [
            {
                "backend": "FLASH_ATTN",
                "shape": {"seqlens": [4096], "num_heads": 128},
                "median_ms": 1.0,
                "tflops": 300.0,
                "correct": True,
            }
        ],
    }


# (method, path, body as JSON text with the placeholder @S@ where the surrogate goes,
#  the loc the answer must name)
def _cases(decision: str) -> list[tuple[str, str, str, list[Any]]]:
    m = json.dumps(measurement())
    return [
        ("PUT", "/v1/overrides/no5xx", '{"force": "CUDNN", "note": "x@S@y"}', ["body", "note"]),
        ("PUT", "/v1/overrides/no5xx", '{"force": "CUDNN", "note": "ok", "@S@": 1}', ["body"]),
        ("PUT", "/v1/overrides/no5xx", '{"force": "CUDNN", "model": "@S@", "note": "n"}', None),
        ("POST", "/v1/tokens", '{"name": "@S@", "role": "viewer"}', ["body", "name"]),
        ("POST", "/v1/tokens", '{"name": "n", "role": "viewer", "clusters": ["@S@"]}', None),
        ("POST", "/v1/measurements", m.replace('"pod": "p1"', '"pod": "@S@"'), ["body", "pod"]),
        ("POST", "/v1/measurements", m.replace('"torch"', '"@S@"'), None),
        (
            "POST",
            f"/v1/selections/{decision}/failure",
            '{"backend": "CUDNN", "error": "boom @S@"}',
            ["body", "error"],
        ),
        ("POST", "/v1/preview", '{"delete_override": "@S@"}', None),
        ("PUT", "/v1/rules?note=x", '{"default": ["FLASH_ATTN"], "clusters": {"@S@": {}}}', None),
        ("POST", "/v1/select", json.dumps(select_body("no5xx", pod="@S@")), None),
    ]


def _send(service: ServiceProcess, method: str, path: str, raw: bytes) -> httpx.Response:
    with service.client() as c:
        return c.request(method, path, content=raw, headers={"content-type": "application/json"})


def _check_422(r: httpx.Response, loc: list[Any] | None, what: str) -> None:
    assert r.status_code == 422, f"{what}: {r.status_code} {r.text[:300]}"
    detail = r.json()["detail"]  # the body is valid JSON: it could be encoded
    r.content.decode("utf-8")  # and valid UTF-8
    if loc is not None:
        assert any(d["loc"][: len(loc)] == loc for d in detail), (what, detail)


def test_lone_surrogate_escapes_are_422(service: ServiceProcess, decision_id: str) -> None:
    for method, path, text, loc in _cases(decision_id):
        raw = text.replace("@S@", SURROGATE).encode()
        _check_422(_send(service, method, path, raw), loc, f"{method} {path} {text}")


def test_raw_surrogate_bytes_are_422(service: ServiceProcess, decision_id: str) -> None:
    # U+D800 encoded as if it were a code point (CESU-8): json.loads(bytes) decodes it
    # with surrogatepass into the same lone surrogate
    for method, path, text, _ in _cases(decision_id):
        raw = text.encode().replace(b"@S@", b"\xed\xa0\x80")
        _check_422(_send(service, method, path, raw), None, f"{method} {path} raw")


def test_paired_surrogates_are_text(service: ServiceProcess) -> None:
    """A correct pair (an emoji as a JSON escape) is text and is accepted."""
    raw = b'{"force": "CUDNN", "note": "rocket \\ud83d\\ude80"}'
    r = _send(service, "PUT", "/v1/overrides/no5xx-emoji", raw)
    assert r.status_code == 200, r.text
    assert r.json()["override"]["note"] == "rocket \U0001f680"


def _store_errors(service: ServiceProcess) -> float:
    text = httpx.get(service.url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("switchboard_store_errors_total")
    )


def test_nul_in_path_is_4xx(service: ServiceProcess, decision_id: str) -> None:
    before = _store_errors(service)
    with service.client() as c:
        for path in (
            "/v1/selections/abc%00def",
            "/v1/selections/%00",
            f"/v1/selections/{decision_id}%00",
            "/v1/overrides/prod%00east",
        ):
            r = c.get(path)
            assert r.status_code in (404, 422), f"{path}: {r.status_code} {r.text}"
            r.json()
        r = c.post("/v1/selections/abc%00def/failure", json={"backend": "CUDNN", "error": "x"})
        assert r.status_code in (404, 422), r.text
        r = c.put("/v1/overrides/a%00b", json={"force": "CUDNN", "note": "x"})
        assert r.status_code in (404, 422), r.text
    assert _store_errors(service) == before


def _raw(service: ServiceProcess, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    """http.client sends the path as it is: httpx would resolve the dot segments."""
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    try:
        payload = None if body is None else json.dumps(body)
        headers = {"Authorization": "Bearer test-admin-token", "Content-Type": "application/json"}
        conn.request(method, path, body=payload, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


@pytest.mark.parametrize("name", [".", "..", "...", "-", "_.-"])
def test_cluster_names_need_a_letter_or_digit(service: ServiceProcess, name: str) -> None:
    spec = {"force": "CUDNN", "note": "dots"}
    for path in (f"/v1/overrides/{name}", "/v1/overrides/" + name.replace(".", "%2E")):
        status, text = _raw(service, "PUT", path, spec)
        assert 400 <= status < 500, (path, status, text)
    with service.client() as c:
        listed = [o["cluster"] for o in c.get("/v1/overrides").json()["items"]]
        assert name not in listed
        assert c.post("/v1/select", json=select_body(name)).status_code == 422
        assert c.post("/v1/measurements", json=measurement(cluster=name)).status_code == 422
        rules = c.get("/v1/rules").json()
        rules["clusters"] = {name: {"default": ["FLASH_ATTN"]}}
        assert c.put("/v1/rules", json=rules).status_code == 422
        assert c.get("/v1/selections", params={"cluster": name}).status_code == 422
        assert c.post("/v1/preview", json={"delete_override": name}).status_code == 422
    # names with a letter or digit somewhere are still fine
    with service.client() as c:
        assert c.post("/v1/select", json=select_body("_x.")).status_code == 200
