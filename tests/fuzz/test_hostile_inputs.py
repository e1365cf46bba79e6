"""Hand-written hostile input against every write endpoint, through a real HTTP server
(tests/served.py: uvicorn in a thread of this process, as `switchboard serve` serves it).

Huge bodies, deep JSON, unicode, NUL bytes, SQL-looking strings, very long strings,
wrong dims, wrong content types, empty bodies and duplicate keys, in bodies and in
the path and query parameters that reach the store. Every answer is a 4xx naming the
field, or a 2xx where the input is legitimately valid (then the value must come back
unchanged from the listing); never a 5xx. The server has a SQLite file of its own,
read directly at the end: the tables are all there, intact, and hold exactly what
the accepted requests wrote.

``tests/service/test_select_validation.py`` already covers ``/v1/select``'s own
fields (cluster, dims, capability shapes, dtype, unknown fields, 413, deep JSON,
unicode pod names); here are the other endpoints and what that file leaves out.
"""

from __future__ import annotations

import copy
import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.served import ThreadServer, serving

SQL = [
    "'; DROP TABLE decisions; --",
    '" OR 1=1 --',
    "x') OR ('1'='1",
    "1; DELETE FROM tokens WHERE 1=1; --",
    "%' UNION SELECT secret_hash FROM tokens --",
]
UNICODE = [
    "r1-ünïcødé-☃",
    "ノード/模型-R1",
    "مرحبا-עולם",  # right-to-left
    "e\u0301\u0323 z\u0336",  # combining marks
    "🚀🔥\U0001f9ea",  # outside the BMP
    "\u202egnp.exe",  # right-to-left override
    "tab\there\nnewline",
]
R1 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
HUGE = "x" * 70_000  # over the 64 KiB body limit on its own


# ---------------------------------------------------------------- the server


@dataclass
class Hostile:
    """The server under attack, its database file, and what was accepted."""

    service: ThreadServer
    db: Path
    client: httpx.Client
    decision_id: str
    initial: dict[str, int] = field(default_factory=dict)
    accepted: Counter[str] = field(default_factory=Counter)  # 2xx answers per endpoint

    def send(self, endpoint: str, body: Any, **kw: Any) -> httpx.Response:
        method, path = ENDPOINTS[endpoint]
        url = path.format(decision_id=self.decision_id)
        if isinstance(body, bytes):  # sent as it is, as JSON unless headers say otherwise
            kw.setdefault("headers", {"content-type": "application/json"})
            r = self.client.request(method, url, content=body, **kw)
        else:
            r = self.client.request(method, url, json=body, **kw)
        self.note(endpoint, r)
        return r

    def note(self, endpoint: str, r: httpx.Response) -> None:
        assert r.status_code < 500, f"{endpoint}: {r.status_code} {r.text[:500]}"
        if 200 <= r.status_code < 300:
            self.accepted[endpoint] += 1

    def counts(self) -> dict[str, int]:
        self.client.get("/v1/selections", params={"limit": 1})  # flushes recorded decisions
        with closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)) as con:
            query = "select name from sqlite_master where type = 'table'"
            tables = [t for (t,) in con.execute(query)]
            return {t: con.execute(f'select count(*) from "{t}"').fetchone()[0] for t in tables}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    d = tmp_path_factory.mktemp("hostile")
    db = d / "switchboard.db"
    with serving(f"sqlite:///{db}") as service, service.client() as client:
        r = client.post("/v1/select", json=select_body(pod="first"))
        assert r.status_code == 200, r.text
        h = Hostile(service, db, client, r.json()["decision_id"])
        h.accepted["select"] = 1
        h.initial = h.counts()
        yield h


# ---------------------------------------------------------------- the endpoints

ENDPOINTS: dict[str, tuple[str, str]] = {
    "select": ("POST", "/v1/select"),
    "override": ("PUT", "/v1/overrides/hostile"),
    "rules": ("PUT", "/v1/rules"),
    "tokens": ("POST", "/v1/tokens"),
    "preview": ("POST", "/v1/preview"),
    "failure": ("POST", "/v1/selections/{decision_id}/failure"),
    "measurements": ("POST", "/v1/measurements"),
}


def select_body(**kw: Any) -> dict[str, Any]:
    return {
        "cluster": "hostile",
        "node": "gpu-1",
        "pod": "r1-0",
        "device": {"name": "NVIDIA H200", "capability": [9, 0]},
        "model": {"name": "deepseek-ai/DeepSeek-R1", **R1, "num_heads": 128},
        "dtype": "bfloat16",
        "packages": {"torch": "2.11.0", "flashinfer": "0.7.2"},
        **kw,
    }


def measurement_body(**kw: Any) -> dict[str, Any]:
    return {
        "cluster": "hostile",
        "pod": "bench-0",
        "node": "gpu-1",
        "device": {"name": "NVIDIA H200", "capability": [9, 0]},
        "model": {"name": "deepseek-ai/DeepSeek-R1", **R1, "num_heads": 128},
        "dtype": "bfloat16",
        "packages": {"flashinfer": "0.7.2"},
        "results": [
            {
                "backend": "FLASHINFER",
                "impl": "flashinfer-fa3",
                "shape": {"seqlens": [1024, 2048], "num_heads": 128},
                "median_ms": 1.5,
                "tflops": 600.0,
                "correct": True,
            }
        ],
        **kw,
    }


RULES = {
    "default": ["FLASH_ATTN"],
    "by_capability": {"10": ["TRTLLM_RAGGED", "FLASHINFER", "CUDNN", "FLASH_ATTN"]},
    "clusters": {},
}

BODIES: dict[str, Callable[[], dict[str, Any]]] = {
    "select": select_body,
    "override": lambda: {"deny": ["CUDNN"], "note": "hostile input test"},
    "rules": lambda: copy.deepcopy(RULES),
    "tokens": lambda: {"name": "hostile-viewer", "role": "viewer"},
    "preview": lambda: {"override": {"cluster": "hostile", "deny": ["CUDNN"], "note": "n"}},
    "failure": lambda: {"backend": "FLASHINFER", "error": "ImportError: no flashinfer"},
    "measurements": measurement_body,
}


def with_value(endpoint: str, where: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """The endpoint's valid body with ``value`` put at ``where``."""
    body = BODIES[endpoint]()
    target: Any = body
    for step in where[:-1]:
        target = target[step]
    target[where[-1]] = value
    return body


def locs(r: httpx.Response) -> list[str]:
    """The fields a 422 names, as dotted paths."""
    assert r.status_code == 422, f"{r.status_code} {r.text[:500]}"
    return [".".join(str(p) for p in e["loc"]) for e in r.json()["detail"]]


def names(r: httpx.Response, where: str) -> None:
    found = locs(r)
    assert any(loc == where or loc.startswith(where + ".") for loc in found), (where, found)


@pytest.fixture(params=list(ENDPOINTS))
def endpoint(request: pytest.FixtureRequest, hostile: Hostile) -> str:
    if request.param == "measurements":
        paths = hostile.client.get("/openapi.json").json()["paths"]
        if "/v1/measurements" not in paths:
            pytest.skip("no /v1/measurements in this build")
    return request.param


# ------------------------------------------------------- body size and shape


def test_valid_bodies_are_accepted(hostile: Hostile, endpoint: str) -> None:
    """The baseline every other test here mutates: accepted as it is."""
    r = hostile.send(endpoint, BODIES[endpoint]())
    assert r.status_code in (200, 201, 202), r.text


def test_huge_body_is_413(hostile: Hostile, endpoint: str) -> None:
    before = hostile.counts()
    body = json.dumps({**BODIES[endpoint](), "padding": HUGE}).encode()
    r = hostile.send(endpoint, body, headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert "65536" in r.json()["detail"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
        for i in range(0, len(body), 8192):
            yield body[i : i + 8192]

    r = hostile.client.request(
        ENDPOINTS[endpoint][0],
        ENDPOINTS[endpoint][1].format(decision_id=hostile.decision_id),
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    hostile.note(endpoint, r)
    assert r.status_code == 413, r.text
    assert hostile.counts() == before


def test_deeply_nested_json(hostile: Hostile, endpoint: str) -> None:
    # Deeper than any JSON parser here takes: refused as a body that cannot be read.
    deep = "[" * 30_000 + "]" * 30_000
    r = hostile.send(endpoint, b'{"x": ' + deep.encode() + b"}")
    assert r.status_code == 422 and locs(r) == ["body"], r.text
    assert "deep" in r.text or "recursion" in r.text
    # Parseable but nested where a string or a list belongs: the field is named.
    where: tuple[str | int, ...] = {
        "select": ("pod",),
        "override": ("note",),
        "rules": ("default",),
        "tokens": ("name",),
        "preview": ("override", "note"),
        "failure": ("error",),
        "measurements": ("pod",),
    }[endpoint]
    nested: Any = "x"
    for _ in range(40):  # 80 levels: within every parser's limit
        nested = {"a": [nested]}
    names(hostile.send(endpoint, with_value(endpoint, where, nested)), "body." + _dot(where))


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b", None],
)
def test_wrong_content_type(hostile: Hostile, endpoint: str, content_type: str | None) -> None:
    before = hostile.counts()
    headers = {"content-type": content_type} if content_type else {}
    r = hostile.send(endpoint, json.dumps(BODIES[endpoint]()).encode(), headers=headers)
    assert locs(r) == ["body"], r.text
    assert hostile.counts() == before


@pytest.mark.parametrize(
    "raw",
    [b"", b"null", b"[]", b'"a string"', b"42", b'{"unterminated": ', b'{"a": "\xff\xfe"}'],
    ids=["empty", "null", "list", "string", "number", "truncated", "not-utf8"],
)
def test_empty_and_malformed_bodies(hostile: Hostile, endpoint: str, raw: bytes) -> None:
    r = hostile.send(endpoint, raw, headers={"content-type": "application/json"})
    assert locs(r)[0].startswith("body"), r.text


def test_duplicate_keys_last_one_wins(hostile: Hostile) -> None:
    """JSON leaves duplicate names to the parser; every endpoint reads the last one,
    the same rule everywhere (no field validated from one value and stored from
    another)."""
    ct = {"content-type": "application/json"}
    raw = json.dumps(select_body(pod="dup-first"))[:-1] + ', "pod": "dup-last"}'
    assert hostile.send("select", raw.encode(), headers=ct).status_code == 200
    listed = hostile.client.get("/v1/selections", params={"cluster": "hostile", "limit": 1})
    assert listed.json()["items"][0]["pod"] == "dup-last"

    raw = '{"deny": ["CUDNN"], "note": "first", "note": "last", "force": "FLASH_ATTN"}'
    assert hostile.send("override", raw.encode(), headers=ct).status_code == 200
    assert hostile.client.get("/v1/overrides/hostile").json()["note"] == "last"

    # a role repeated: the last one, never the more powerful first
    raw = '{"name": "dup-role", "role": "admin", "role": "viewer"}'
    r = hostile.send("tokens", raw.encode(), headers=ct)
    assert r.status_code == 201 and r.json()["role"] == "viewer"
    raw = '{"name": "dup-role", "role": "viewer", "role": "root"}'
    names(hostile.send("tokens", raw.encode(), headers=ct), "body.role")


# ------------------------------------------------------------- string fields

# Free text: any unicode, any SQL-looking string is a legitimate value; NUL is
# refused (PostgreSQL text cannot hold it), and so is anything over the limit.
FREE_TEXT: list[tuple[str, tuple[str | int, ...], int]] = [
    ("select", ("node",), 253),
    ("select", ("pod",), 253),
    ("select", ("device", "name"), 253),
    ("select", ("model", "name"), 253),
    ("override", ("note",), 2000),
    ("override", ("model",), 253),
    ("tokens", ("name",), 100),
    ("preview", ("override", "note"), 2000),
    ("failure", ("error",), 8000),
    ("measurements", ("pod",), 253),
    ("measurements", ("node",), 253),
    ("measurements", ("device", "name"), 253),
    ("measurements", ("model", "name"), 253),
    ("measurements", ("results", 0, "impl"), 100),
    ("measurements", ("results", 0, "error"), 8000),
]
# Names, enums, patterns, dates: a SQL-looking string, unicode or NUL is refused.
CONSTRAINED: list[tuple[str, tuple[str | int, ...]]] = [
    ("select", ("dtype",)),
    ("select", ("requested_backend",)),
    ("override", ("force",)),
    ("override", ("deny", 0)),
    ("override", ("policy",)),
    ("override", ("expires_at",)),
    ("rules", ("default", 0)),
    ("tokens", ("role",)),
    ("tokens", ("clusters",)),
    ("preview", ("override", "cluster")),
    ("failure", ("backend",)),
    ("measurements", ("cluster",)),
    ("measurements", ("dtype",)),
    ("measurements", ("results", 0, "backend")),
]


def _dot(where: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in where)


def _skip_absent(hostile: Hostile, endpoint: str) -> None:
    if endpoint == "measurements":
        paths = hostile.client.get("/openapi.json").json()["paths"]
        if "/v1/measurements" not in paths:
            pytest.skip("no /v1/measurements in this build")


@pytest.mark.parametrize(("endpoint", "where", "limit"), FREE_TEXT, ids=lambda v: str(v))
def test_free_text_fields(
    hostile: Hostile, endpoint: str, where: tuple[str | int, ...], limit: int
) -> None:
    _skip_absent(hostile, endpoint)
    for value in [*SQL, *UNICODE, "x" * limit]:
        r = hostile.send(endpoint, with_value(endpoint, where, value))
        assert r.status_code in (200, 201, 202), (value, r.text)
    for value in ["a\x00b", "\x00", "x" * (limit + 1)]:
        names(hostile.send(endpoint, with_value(endpoint, where, value)), "body." + _dot(where))


@pytest.mark.parametrize(("endpoint", "where"), CONSTRAINED, ids=lambda v: str(v))
def test_constrained_fields(hostile: Hostile, endpoint: str, where: tuple[str | int, ...]) -> None:
    _skip_absent(hostile, endpoint)
    value_of: Callable[[str], Any] = (lambda v: [v]) if where == ("clusters",) else (lambda v: v)
    for value in [*SQL, *UNICODE, "a\x00b", "x" * 300, 7, True]:
        r = hostile.send(endpoint, with_value(endpoint, where, value_of(value)))
        names(r, "body." + _dot(where))


def test_free_text_round_trips_through_the_listings(hostile: Hostile) -> None:
    c = hostile.client
    for i, value in enumerate([*SQL, *UNICODE]):
        # decisions: every name field, and the packages map, as sent
        pod = f"{value}-{i}"
        payload = select_body(node=value, pod=pod, packages={value: value, "torch": "2.11.0"})
        payload["device"]["name"] = value
        payload["model"]["name"] = value
        r = hostile.send("select", payload)
        assert r.status_code == 200, r.text
        (item,) = c.get("/v1/selections", params={"pod": pod}).json()["items"]
        assert (item["node"], item["pod"], item["device"]["name"], item["model"]["name"]) == (
            value,
            pod,
            value,
            value,
        )
        detail = c.get(f"/v1/selections/{quote(item['decision_id'])}").json()
        assert detail["request"]["packages"][value] == value

        # a failure report on that decision
        r = c.post(
            f"/v1/selections/{item['decision_id']}/failure",
            json={"backend": "FLASHINFER", "error": value},
        )
        hostile.note("failure", r)
        assert r.status_code == 202
        failures = c.get(f"/v1/selections/{item['decision_id']}").json()["failures"]
        assert [f["error"] for f in failures] == [value]

        # an override's note and model glob
        r = hostile.send("override", {"deny": ["CUDNN"], "note": value, "model": value})
        assert r.status_code == 200, r.text
        shown = c.get("/v1/overrides/hostile").json()
        assert (shown["note"], shown["model"]) == (value, value)

        # a token's name
        r = hostile.send("tokens", {"name": value, "role": "viewer"})
        assert r.status_code == 201 and r.json()["name"] == value
        listed = {t["id"]: t["name"] for t in c.get("/v1/tokens").json()["items"]}
        assert listed[r.json()["id"]] == value

        # the note of a rules edit, in the audit log
        r = c.put("/v1/rules", params={"note": value}, json=RULES)
        hostile.note("rules", r)
        assert r.status_code == 200, r.text
        entry = c.get("/v1/audit", params={"action": "rules.replace", "limit": 1}).json()
        assert entry["items"][0]["note"] == value


def test_sql_in_query_and_path_parameters(hostile: Hostile) -> None:
    c = hostile.client
    total = len(c.get("/v1/selections", params={"limit": 1000}).json()["items"])
    assert total > 3
    for value in SQL:
        # filters that take free text match it literally: no row matches
        for path, param in [
            ("/v1/selections", "pod"),
            ("/v1/audit", "actor"),
            ("/v1/audit", "target"),
            ("/v1/audit", "action"),
        ]:
            r = c.get(path, params={param: value + "-nobody"})
            assert r.status_code == 200 and r.json()["items"] == [], (path, param, r.text)
        # constrained filters and cursors refuse it, naming the parameter
        for path, param in [
            ("/v1/selections", "cluster"),
            ("/v1/selections", "backend"),
            ("/v1/selections", "cursor"),
            ("/v1/audit", "cursor"),
            ("/v1/selections", "limit"),
        ]:
            names(c.get(path, params={param: value}), f"query.{param}")
        # path parameters
        q = quote(value, safe="")
        assert c.get(f"/v1/selections/{q}").status_code == 404
        r = c.post(f"/v1/selections/{q}/failure", json={"backend": "CUDNN", "error": "e"})
        assert r.status_code == 404, r.text
        names(c.get(f"/v1/overrides/{q}"), "path.cluster")
        names(c.put(f"/v1/overrides/{q}", json=BODIES["override"]()), "path.cluster")
        names(c.delete(f"/v1/overrides/{q}"), "path.cluster")
        names(c.delete(f"/v1/tokens/{q}"), "path.token_id")
        # free-text query parameters of writes: stored as given
        r = hostile.send("rules", RULES, params={"note": value})
        assert r.status_code == 200, r.text
    assert len(c.get("/v1/selections", params={"limit": 1000}).json()["items"]) == total


def test_nul_and_long_query_parameters(hostile: Hostile) -> None:
    c = hostile.client
    for path, param in [("/v1/selections", "pod"), ("/v1/audit", "actor")]:
        names(c.get(path, params={param: "a\x00b"}), f"query.{param}")
        names(c.get(path, params={param: "x" * 254}), f"query.{param}")
    names(c.put("/v1/rules", params={"note": "a\x00"}, json=RULES), "query.note")
    names(c.put("/v1/rules", params={"note": "x" * 2001}, json=RULES), "query.note")
    names(c.delete("/v1/overrides/hostile", params={"note": "\x00"}), "query.note")


def test_names_that_must_match_a_pattern(hostile: Hostile) -> None:
    for value in [*SQL, "prod-ü", "PROD", "a" * 64, ""]:
        rules = copy.deepcopy(RULES)
        rules["clusters"] = {value: {"default": ["FLASH_ATTN"]}}
        names(hostile.send("rules", rules), "body.clusters")
        rules = copy.deepcopy(RULES)
        rules["by_capability"] = {value: ["FLASH_ATTN"]}
        names(hostile.send("rules", rules), "body.by_capability")
        r = hostile.send("tokens", {"name": "t", "role": "viewer", "clusters": [value]})
        names(r, "body.clusters")
        names(hostile.send("preview", {"delete_override": value}), "body.delete_override")


# ---------------------------------------------------------------- numbers


BAD_NUMBERS = [0, -1, -(2**63), 2**64, 10**400, 12.5, 1e308, "128", True, None, [128]]


@pytest.mark.parametrize("dim", ["qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"])
def test_measurement_dims(hostile: Hostile, dim: str) -> None:
    _skip_absent(hostile, "measurements")
    for value in [*BAD_NUMBERS, 1025]:
        if dim == "qk_rope_head_dim" and value == 0:
            continue  # a model without a rope part (GLM-5-Next's (256, 0, 256)) is valid
        body = measurement_body()
        body["model"][dim] = value
        names(hostile.send("measurements", body), f"body.model.{dim}")


def test_measurement_shapes_and_figures(hostile: Hostile) -> None:
    _skip_absent(hostile, "measurements")
    for where, bad in [
        (("results", 0, "shape", "seqlens", 0), [*BAD_NUMBERS, 2**20 + 1]),
        (("results", 0, "shape", "num_heads"), [*BAD_NUMBERS, 1025]),
        (("results", 0, "median_ms"), [0, -1.0, "1.5", True, 1e308]),
        (("results", 0, "tflops"), [-1.0, "600", True, 1e308]),
        (("results", 0, "correct"), [0, 1, "true", "yes", None]),
        (("device", "capability"), [[9], [9, 0, 0], [-1, 0], [100, 0], [9.5, 0], "9.0"]),
    ]:
        for value in bad:
            r = hostile.send("measurements", with_value("measurements", where, value))
            names(r, "body." + _dot(where))
    seqlens = ("results", 0, "shape", "seqlens")
    for value in [[], [1] * 4097, "1024", None]:
        r = hostile.send("measurements", with_value("measurements", seqlens, value))
        names(r, "body." + _dot(seqlens))


def test_integral_floats_are_integers(hostile: Hostile) -> None:
    """JSON has one number type: 128.0 is the integer 128 (JSON Schema agrees). It is
    accepted and stored as the integer; 128.5 is refused (tests/service)."""
    payload = select_body(pod="float-dims")
    payload["model"] = {"qk_nope_head_dim": 128.0, "qk_rope_head_dim": 64.0, "v_head_dim": 128.0}
    payload["device"]["capability"] = [9.0, 0.0]
    r = hostile.send("select", payload)
    assert r.status_code == 200, r.text
    (item,) = hostile.client.get("/v1/selections", params={"pod": "float-dims"}).json()["items"]
    assert item["model"] == {"name": None, **R1, "num_heads": None}
    assert all(type(v) is int for v in (*R1.values(), *item["device"]["capability"]))
    for cap in ([-1, 0], [100, 0], [9.5, 0], [2**64, 0], [True, 0], [None, 0]):
        payload["device"]["capability"] = cap
        names(hostile.send("select", payload), "body.device.capability")


# ---------------------------------------------------------------- the store


def test_store_intact(hostile: Hostile) -> None:
    """Last in the file: every table is still there, the file is sound, and the rows
    are exactly what the accepted requests wrote."""
    after, before, ok = hostile.counts(), hostile.initial, hostile.accepted
    assert set(after) == set(before)
    with closing(sqlite3.connect(f"file:{hostile.db}?mode=ro", uri=True)) as con:
        assert con.execute("pragma integrity_check").fetchone()[0] == "ok"
    assert after["decisions"] == ok["select"]
    assert after["failures"] == before["failures"] + ok["failure"]
    assert after["tokens"] == before["tokens"] + ok["tokens"]
    if "measurements" in after:  # one result per report sent here
        assert after["measurements"] == before["measurements"] + ok["measurements"]
    assert after["overrides"] == 1  # the one scope written here, "hostile"
    # every accepted admin write is in the audit log (previews are not writes)
    writes = ok["override"] + ok["rules"] + ok["tokens"]
    assert after["audit"] == before["audit"] + writes
    # and the service still answers
    assert hostile.client.get("/readyz").json()["status"] == "ready"
    r = hostile.client.post("/v1/select", json=select_body(pod="after-all"))
    assert r.status_code == 200, r.text
