"""Bad input: 422 naming the field and the problem, 413 for huge bodies, never 5xx."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.service.test_select_decisions import body


def problems(r: httpx.Response) -> list[tuple[str, str]]:
    assert r.status_code == 422, r.text
    return [(".".join(str(p) for p in e["loc"]), e["msg"]) for e in r.json()["detail"]]


BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("cluster-upper", {"cluster": "Prod"}, "body.cluster", "pattern"),
    ("cluster-long", {"cluster": "a" * 64}, "body.cluster", "at most 63"),
    ("cluster-empty", {"cluster": ""}, "body.cluster", "pattern"),
    ("cluster-sql", {"cluster": "x'; DROP TABLE decisions;--"}, "body.cluster", "pattern"),
    ("node-long", {"node": "n" * 254}, "body.node", "at most 253"),
    ("dtype", {"dtype": "int8"}, "body.dtype", "accepted: bf16"),
    ("backend", {"requested_backend": "FA4"}, "body.requested_backend", "valid backends:"),
    ("capability-1", {"device": {"capability": [9]}}, "body.device.capability", ""),
    ("capability-str", {"device": {"capability": "9.0"}}, "body.device.capability", ""),
    ("unknown-field", {"requested_backnd": "CUDNN"}, "body.requested_backnd", "Extra inputs"),
    ("strict-type", {"strict": "maybe"}, "body.strict", "boolean"),
    ("packages-type", {"packages": ["torch"]}, "body.packages", "object"),
]


@pytest.mark.parametrize(("patch", "field", "text"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_fields(api: httpx.Client, patch: dict[str, Any], field: str, text: str) -> None:
    found = problems(api.post("/v1/select", json={**body(), **patch}))
    assert any(loc.startswith(field) and text in msg for loc, msg in found), found


@pytest.mark.parametrize(
    ("dim", "value"),
    [
        ("qk_nope_head_dim", 0),
        ("qk_rope_head_dim", -64),
        ("v_head_dim", 1025),
        ("num_heads", 0),
        ("v_head_dim", "128"),
        ("qk_nope_head_dim", 12.5),
        ("qk_nope_head_dim", True),
    ],
)
def test_bad_dims(api: httpx.Client, dim: str, value: Any) -> None:
    payload = body()
    payload["model"][dim] = value
    found = problems(api.post("/v1/select", json=payload))
    assert any(loc == f"body.model.{dim}" for loc, _ in found), found


def test_missing_required(api: httpx.Client) -> None:
    payload = body()
    del payload["model"], payload["cluster"]
    locs = {loc for loc, _ in problems(api.post("/v1/select", json=payload))}
    assert {"body.model", "body.cluster"} <= locs


def test_malformed_json(api: httpx.Client) -> None:
    r = api.post(
        "/v1/select", content=b'{"cluster": ', headers={"content-type": "application/json"}
    )
    assert r.status_code == 422


def test_not_an_object(api: httpx.Client) -> None:
    assert api.post("/v1/select", json=[1, 2, 3]).status_code == 422


def test_body_over_64k_is_413(api: httpx.Client) -> None:
    payload = body()
    payload["model"]["name"] = "x" * 70_000
    r = api.post(
        "/v1/select",
        content=json.dumps(payload).encode(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413
    assert "64" in r.text or "65536" in r.text


def test_chunked_body_over_64k_is_413(api: httpx.Client) -> None:
    def chunks():  # no Content-Length: the limit must hold while streaming
        yield b'{"cluster": "prod-east", "model": {"name": "'
        for _ in range(80):
            yield b"y" * 1024
        yield b'"}}'

    r = api.post("/v1/select", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_deeply_nested_json(api: httpx.Client) -> None:
    deep = "[" * 5000 + "]" * 5000
    r = api.post("/v1/select", content=deep.encode(), headers={"content-type": "application/json"})
    assert r.status_code in (413, 422)


def test_unicode_names_round_trip(api: httpx.Client) -> None:
    payload = body(pod="r1-ünïcødé-☃", node="ノード-1")
    payload["model"]["name"] = "组织/模型-R1"
    r = api.post("/v1/select", json=payload)
    assert r.status_code == 200
    items = api.get("/v1/selections", params={"pod": "r1-ünïcødé-☃"}).json()["items"]
    assert items[0]["node"] == "ノード-1"
    assert items[0]["model"]["name"] == "组织/模型-R1"


def test_no_token_401_wrong_role_403(api: httpx.Client) -> None:
    r = api.post("/v1/select", json=body(), headers={"Authorization": ""})
    assert r.status_code == 401
    r = api.post("/v1/select", json=body(), headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401


@pytest.mark.parametrize("version", ["garbage", "main", "", "v0.34.0", "1!0.34.0"])
def test_an_unreadable_engine_version_is_answered_not_refused(
    api: httpx.Client, version: str
) -> None:
    """docs/engines.md: a version the profiles cannot read gets the newest rules and a
    message (v0.34.0 is 0.34.0), never a 422."""
    r = api.post("/v1/select", json={**body(), "engine": {"name": "vllm", "version": version}})
    assert r.status_code == 200, r.text
    messages = r.json()["messages"]
    if version == "v0.34.0":
        assert r.json()["engine_args"], r.json()
    else:
        assert any(f"vLLM version {version!r} cannot be read" in m for m in messages), messages
        assert r.json()["engine_args"] == []


def test_an_engine_version_the_contract_cannot_carry_is_422(api: httpx.Client) -> None:
    for version in ("0.34 0", "9" * 65):
        found = problems(
            api.post("/v1/select", json={**body(), "engine": {"name": "vllm", "version": version}})
        )
        assert any(loc.startswith("body.engine.version") for loc, _ in found), found
