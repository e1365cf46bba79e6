"""No 5xx from numbers JSON cannot hold: NaN, Infinity, -Infinity and 1e400.

pydantic's JSON parser reads all four (1e400 as infinity). A request with one where an
integer belongs got a 500 without a token: the 422 naming it echoed the value, which
the answer could not encode, and a 2.7 KB traceback went to the log each time.

The table is driven by the service's own OpenAPI document: every POST, PUT and PATCH
with a JSON body needs a valid body here, every number and integer field the schema
declares (nested, in arrays, in every branch) must be in one of them, and each value is
put in each such field in turn, and in every numeric query parameter. The answer must
be 422 naming the field (or 401/403 to a caller without a token), a body that strict
JSON can read, and nothing logged at ERROR. In process, and against a real server.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest

from tests.conftest import ServiceProcess, make_inprocess_client

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400"]
WRITE_METHODS = ("post", "put", "patch")
R1 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_heads": 128}
DEVICE = {"name": "NVIDIA H200", "capability": [9, 0]}
ROLLOUT = {
    "percent": 10,
    "max_failures": 2,
    "max_slowdown_pct": 5.0,
    "steps": [20, 50],
    "step_every": "10m",
}
CLUSTER = "nonfinite"


class Client(Protocol):
    def request(self, method: str, url: str, **kw: Any) -> httpx.Response: ...
    def get(self, url: str, **kw: Any) -> httpx.Response: ...
    def post(self, url: str, **kw: Any) -> httpx.Response: ...


def valid_bodies(c: Client) -> dict[tuple[str, str], list[tuple[str, dict[str, Any]]]]:
    """(method, OpenAPI path) -> [(URL, a body the service accepts)]. Between them the
    bodies hold every numeric field of the operation's schema (checked below)."""
    select = {"cluster": CLUSTER, "pod": "p1", "device": DEVICE, "model": R1, "dtype": "bfloat16"}
    answer = c.post("/v1/select", json=select)
    assert answer.status_code == 200, answer.text
    decision = answer.json()["decision_id"]
    revision = c.get("/v1/rules").json()["revision"]
    rules = {"default": ["FLASH_ATTN", "TORCH_SDPA"], "revision": revision}
    override = {"force": "CUDNN", "note": "n", "rollout": ROLLOUT}
    staged = c.request("PUT", f"/v1/overrides/{CLUSTER}", json=override)  # to promote
    assert staged.status_code == 200, staged.text
    measurement = {
        "cluster": CLUSTER,
        "pod": "p1",
        "device": DEVICE,
        "model": R1,
        "dtype": "bfloat16",
        "packages": {"torch": "2.11.0"},
        "results": [
            {
                "backend": "FLASH_ATTN",
                "shape": {"seqlens": [4096, 512], "num_heads": 128},
                "median_ms": 1.0,
                "tflops": 300.0,
                "correct": True,
            }
        ],
    }
    # an overrides file (overrides as code) holding the same staged override
    overrides_file = {
        "apiVersion": "switchboard/v1",
        "kind": "Overrides",
        "overrides": {CLUSTER: override},
    }
    planned = c.post("/v1/plan", json={"file": overrides_file})
    assert planned.status_code == 200, planned.text
    etags = planned.json()["etags"]
    clear = {
        "device": "NVIDIA H200",
        "capability": "9.0",
        "dims": [128, 64, 128],
        "dtype": "bfloat16",
        "note": "fixed",
    }
    return {
        ("post", "/v1/select"): [("/v1/select", select)],
        ("put", "/v1/rules"): [("/v1/rules?dry_run=true", rules)],
        ("put", "/v1/overrides/{cluster}"): [(f"/v1/overrides/{CLUSTER}?dry_run=true", override)],
        ("post", "/v1/measurements"): [("/v1/measurements", measurement)],
        ("post", "/v1/measurements/failures/clear"): [
            ("/v1/measurements/failures/clear", clear),
            (
                "/v1/measurements/failures/clear",
                {**clear, "seen_through": {"measurement_id": 0, "failure_id": 0}},
            ),
        ],
        ("post", "/v1/tokens"): [("/v1/tokens", {"name": "nonfinite", "role": "viewer"})],
        ("post", "/v1/preview"): [
            ("/v1/preview", {"override": {"cluster": CLUSTER, **override}}),
            ("/v1/preview", {"rules": rules}),
        ],
        ("post", "/v1/overrides/{cluster}/rollout"): [
            (
                f"/v1/overrides/{CLUSTER}/rollout?dry_run=true",
                {"action": "promote", "percent": 50, "note": "n"},
            )
        ],
        ("post", "/v1/selections/{decision_id}/failure"): [
            (f"/v1/selections/{decision}/failure", {"backend": "CUDNN", "error": "boom"})
        ],
        ("post", "/v1/plan"): [("/v1/plan", {"file": overrides_file})],
        ("post", "/v1/apply"): [("/v1/apply", {"file": overrides_file, "etags": etags})],
    }


# ------------------------------------------------------------------ the schema


Path_ = tuple[Any, ...]
ANY_KEY = "*"  # a map's key, in a schema path


def numeric_fields(spec: dict[str, Any], schema: dict[str, Any]) -> dict[Path_, str]:
    """Every path in ``schema`` that may hold a number: path -> "number" or "integer"
    (an array's items are at index 0, a map's values under ``ANY_KEY``)."""
    found: dict[Path_, str] = {}
    components = spec["components"]["schemas"]

    def walk(node: dict[str, Any], path: Path_, seen: frozenset[str]) -> None:
        ref = node.get("$ref")
        if ref is not None:
            name = ref.rsplit("/", 1)[1]
            if name not in seen:
                walk(components[name], path, seen | {name})
            return
        for key in ("anyOf", "oneOf", "allOf"):
            for branch in node.get(key, []):
                walk(branch, path, seen)
        # a field that takes either is a number
        if node.get("type") in ("number", "integer") and found.get(path) != "number":
            found[path] = node["type"]
        if isinstance(node.get("items"), dict):
            walk(node["items"], (*path, 0), seen)
        for i, item in enumerate(node.get("prefixItems", [])):
            walk(item, (*path, i), seen)
        for name, sub in node.get("properties", {}).items():
            walk(sub, (*path, name), seen)
        maps = [node.get("additionalProperties"), *node.get("patternProperties", {}).values()]
        for sub in maps:
            if isinstance(sub, dict):
                walk(sub, (*path, ANY_KEY), seen)

    walk(schema, (), frozenset())
    return found


def numeric_leaves(body: Any, path: Path_ = ()) -> Iterator[Path_]:
    if isinstance(body, bool):
        return
    if isinstance(body, int | float):
        yield path
    elif isinstance(body, dict):
        for key, value in body.items():
            yield from numeric_leaves(value, (*path, key))
    elif isinstance(body, list):
        for i, value in enumerate(body):
            yield from numeric_leaves(value, (*path, i))


def _same_field(schema_path: Path_, body_path: Path_) -> bool:
    if len(schema_path) != len(body_path):
        return False
    for s, b in zip(schema_path, body_path, strict=True):
        if s == ANY_KEY or (s == 0 and isinstance(b, int)):
            continue
        if s != b:
            return False
    return True


def _kind(fields: dict[Path_, str], leaf: Path_) -> str:
    kinds = [k for p, k in fields.items() if _same_field(p, leaf)]
    assert kinds, f"{leaf} is not a numeric field of the schema"
    return kinds[0]


def _with(body: dict[str, Any], leaf: Path_, value: str) -> bytes:
    """``body`` as JSON text with ``value`` written raw at ``leaf``."""
    marked = copy.deepcopy(body)
    node: Any = marked
    for key in leaf[:-1]:
        node = node[key]
    node[leaf[-1]] = "@NUMBER@"
    return json.dumps(marked).replace('"@NUMBER@"', value).encode()


def _strict_json(text: str) -> Any:
    """JSON as the standard has it: Python's json module reads NaN and Infinity."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} in an answer: not JSON")

    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------ the checks


def check_write_endpoints(c: Client, anonymous: Client) -> int:
    """Every value in every numeric field of every write endpoint; the requests sent."""
    spec = c.get("/openapi.json").json()
    bodies = valid_bodies(c)
    sent = 0
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            if method not in WRITE_METHODS or "application/json" not in content:
                continue
            assert (method, path) in bodies, f"{method.upper()} {path}: add a valid body here"
            fields = numeric_fields(spec, content["application/json"]["schema"])
            cases = bodies[(method, path)]
            covered = [leaf for _, body in cases for leaf in numeric_leaves(body)]
            for field in fields:
                assert any(_same_field(field, leaf) for leaf in covered), (
                    f"{method.upper()} {path}: no valid body here holds {field}"
                )
            for url, body in cases:
                baseline = c.request(method, url, json=body)
                assert baseline.status_code < 400, f"{url}: {baseline.text[:300]}"
                for leaf in numeric_leaves(body):
                    for value in NON_FINITE:
                        raw = _with(body, leaf, value)
                        what = f"{method.upper()} {url} {leaf}={value}"
                        expect_field(
                            c, method, url, raw, ("body", *leaf), what, _kind(fields, leaf)
                        )
                        expect_field(anonymous, method, url, raw, ("body", *leaf), what, None)
                        sent += 2
    return sent


def check_query_parameters(c: Client, anonymous: Client) -> int:
    spec = c.get("/openapi.json").json()
    sent = 0
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                schema = json.dumps(parameter.get("schema", {}))
                if parameter["in"] != "query" or not any(
                    t in schema for t in ('"integer"', '"number"')
                ):
                    continue
                assert "{" not in path, f"{path}: give the path parameters a value here"
                for value in NON_FINITE:
                    url = f"{path}?{parameter['name']}={value}"
                    loc = ("query", parameter["name"])
                    what = f"{method.upper()} {url}"
                    expect_field(c, method, url, None, loc, what, None)
                    expect_field(anonymous, method, url, None, loc, what, None)
                    sent += 2
    assert sent, "no numeric query parameter found: the table lost its way"
    return sent


def expect_field(
    c: Client,
    method: str,
    url: str,
    raw: bytes | None,
    loc: Path_,
    what: str,
    kind: str | None,
) -> None:
    headers = {"content-type": "application/json"} if raw is not None else {}
    r = c.request(method, url, content=raw, headers=headers)
    detail = _strict_json(r.content.decode("utf-8"))["detail"]
    if r.status_code in (401, 403) and "authorization" not in {k.lower() for k in c.headers}:
        return  # no token: refused before the body is looked at, which is fine
    assert r.status_code == 422, f"{what}: {r.status_code} {r.text[:300]}"
    named = [d for d in detail if tuple(d["loc"]) == loc]
    assert named, f"{what}: {loc} not named in {detail}"
    if kind == "number":  # refused for being infinite, not by a bound's accident
        assert named[0]["type"] == "finite_number", (what, named)


def check_huge_integers(c: Client) -> None:
    """An integer of 5,000 digits: past what Python's JSON parser reads (4,300) and
    what pydantic's reads: a 422 about the body, which cannot name a field it never
    parsed."""
    huge = "9" * 5000
    for method, url, body in (
        ("post", "/v1/select", {"cluster": CLUSTER, "device": DEVICE, "model": R1, "n": 0}),
        ("put", f"/v1/overrides/{CLUSTER}?dry_run=true", {"force": "CUDNN", "note": "n", "n": 0}),
    ):
        r = c.request(
            method,
            url,
            content=_with(body, ("n",), huge),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 422, f"{url}: {r.status_code} {r.text[:300]}"
        (problem,) = _strict_json(r.text)["detail"]
        assert problem["loc"] == ["body"] and problem["type"] == "json_invalid", problem
        assert "ValueError" not in problem["msg"], problem


# ------------------------------------------------------------------ in process, served


def test_non_finite_numbers_in_process(sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with make_inprocess_client(sqlite_url) as c:  # type: ignore[attr-defined]
        anonymous = copy.copy(c)
        anonymous.headers = httpx.Headers({})
        with caplog.at_level(logging.ERROR):
            sent = check_write_endpoints(c, anonymous) + check_query_parameters(c, anonymous)
            check_huge_integers(c)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors][:3]
    assert sent > 200


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    d = tmp_path_factory.mktemp("nonfinite")
    service = ServiceProcess(f"sqlite:///{d / 'sb.db'}").start(d)
    yield service
    service.stop()


def test_non_finite_numbers_against_a_server(served: ServiceProcess) -> None:
    with served.client() as c, served.client(token=None) as anonymous:
        sent = check_write_endpoints(c, anonymous) + check_query_parameters(c, anonymous)
        check_huge_integers(c)
    assert sent > 200
    assert httpx.get(served.url + "/healthz").status_code == 200
    assert served.log_path is not None
    log = Path(served.log_path).read_text(errors="replace")
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]


def test_the_schema_walk_finds_nested_fields(sqlite_url: str) -> None:
    """The fields the finding named, nested ones included."""
    with make_inprocess_client(sqlite_url) as c:  # type: ignore[attr-defined]
        spec = c.get("/openapi.json").json()
    schema = spec["paths"]["/v1/measurements"]["post"]["requestBody"]["content"]
    fields = numeric_fields(spec, schema["application/json"]["schema"])
    assert fields[("results", 0, "tflops")] == "number"
    assert fields[("model", "num_heads")] == "integer"
    assert fields[("device", "capability", 0)] == "integer"
    schema = spec["paths"]["/v1/preview"]["post"]["requestBody"]["content"]
    fields = numeric_fields(spec, schema["application/json"]["schema"])
    assert fields[("override", "rollout", "max_slowdown_pct")] == "number"
    assert fields[("override", "rollout", "steps", 0)] == "integer"
