"""API answers are never cached, the docs carry the dashboard's security headers, and
wrong tokens are throttled per client address without ever throttling a valid one.

Found by a security test of the landed code: no ``Cache-Control`` on any API answer
(``POST /v1/tokens`` answers a secret), no CSP, frame or nosniff header on ``/docs``, and
6,000 wrong tokens in a row answered 401 with no throttling.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest
from mla_switchboard.service.identity.throttle import FailureThrottle
from mla_switchboard.service.metrics import Metrics

from tests.conftest import ADMIN, ServiceProcess, make_inprocess_client

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

SELECT: dict[str, Any] = {
    "cluster": "nostore-east",
    "node": "gpu-1",
    "pod": "p-0",
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
WRONG = {"Authorization": "Bearer sb_000000000000_not-the-secret"}


def _failures(metrics_text: str) -> dict[str, float]:
    found = re.findall(
        r'^switchboard_auth_failures_total\{outcome="(\w+)"\} (\S+)$', metrics_text, re.M
    )
    return {outcome: float(value) for outcome, value in found}


def _refused_for_wrong_tokens(metrics_text: str) -> float:
    found = re.findall(
        r'^switchboard_refused_selects_total\{[^}]*reason="unknown or revoked token"[^}]*\} (\S+)$',
        metrics_text,
        re.M,
    )
    return sum(float(v) for v in found)


# ------------------------------------------------------------------ Cache-Control


def test_every_api_answer_says_no_store(api: httpx.Client) -> None:
    """Representative answers of each kind, through the in-process app and a real
    server: the lean select's 200 and 304, FastAPI's 200, 201 with a secret, 401, 404,
    405, 413, 422, and the unauthenticated probes and metrics."""
    answers: dict[str, httpx.Response] = {}
    first = api.post("/v1/select", json=SELECT)
    answers["select 200"] = first
    answers["select 304"] = api.post(
        "/v1/select", json=SELECT, headers={"If-None-Match": first.headers["etag"]}
    )
    answers["select 401"] = api.post("/v1/select", json=SELECT, headers={"Authorization": ""})
    answers["select 413"] = api.post(
        "/v1/select", content=json.dumps({**SELECT, "pad": "x" * 70_000}).encode()
    )
    answers["select 422"] = api.post("/v1/select", json={"cluster": "x"})
    answers["tokens 201"] = created = api.post(
        "/v1/tokens", json={"name": "nostore-viewer", "role": "viewer"}
    )
    answers["rules 200"] = api.get("/v1/rules")
    answers["rules 401"] = api.get("/v1/rules", headers=WRONG)
    answers["404"] = api.get("/v1/selections/no-such-decision")
    answers["unknown path 404"] = api.get("/v1/no/such/path")
    answers["405"] = api.delete("/v1/select")
    answers["metrics"] = api.get("/metrics")
    answers["readyz"] = api.get("/readyz")
    statuses = {name: r.status_code for name, r in answers.items()}
    assert statuses == {
        "select 200": 200,
        "select 304": 304,
        "select 401": 401,
        "select 413": 413,
        "select 422": 422,
        "tokens 201": 201,
        "rules 200": 200,
        "rules 401": 401,
        "404": 404,
        "unknown path 404": 404,
        "405": 405,
        "metrics": 200,
        "readyz": 200,
    }
    assert created.json()["token"].startswith("sb_")  # the secret this must not cache
    for name, r in answers.items():
        assert r.headers.get_list("cache-control") == ["no-store"], name


def test_dashboard_and_docs_assets_keep_their_own_caching(api: httpx.Client) -> None:
    assert api.get("/").headers["cache-control"] == "no-cache"
    assert api.get("/static/dashboard.js").headers["cache-control"] == "no-cache"
    asset = api.get("/docs-assets/swagger-ui.css")
    assert asset.headers["cache-control"] == "public, max-age=86400"


# ------------------------------------------------------------------ docs headers


def _directives(policy: str) -> dict[str, list[str]]:
    return {
        name: values
        for name, *values in (part.split() for part in policy.split(";") if part.strip())
    }


def test_docs_carry_the_dashboards_security_headers(api: httpx.Client) -> None:
    dashboard = api.get("/")
    docs = api.get("/docs")
    assert docs.status_code == 200
    for header in ("X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy"):
        assert docs.headers[header] == dashboard.headers[header], header
    assert docs.headers["X-Frame-Options"] == "DENY"
    assert docs.headers["X-Content-Type-Options"] == "nosniff"

    policy = _directives(docs.headers["Content-Security-Policy"])
    ours = _directives(dashboard.headers["Content-Security-Policy"])
    # the dashboard's policy, changed only where Swagger UI needs it
    assert {k: v for k, v in policy.items() if k not in ("script-src", "img-src")} == {
        k: v for k, v in ours.items() if k not in ("script-src", "img-src")
    }
    assert policy["frame-ancestors"] == ["'none'"] and policy["style-src"] == ["'self'"]
    assert policy["img-src"] == ["'self'", "data:"]
    # the page's one inline script is allowed by its hash, nothing else inline
    inline = re.findall(r"<script>(.*?)</script>", docs.text, re.S)
    assert len(inline) == 1
    digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
    assert policy["script-src"] == ["'self'", f"'sha256-{digest}'"]
    assert "'unsafe-inline'" not in docs.headers["Content-Security-Policy"]

    for path in ("/openapi.json", "/docs-assets/swagger-ui-bundle.js"):
        r = api.get(path)
        assert r.status_code == 200, path
        assert r.headers["X-Content-Type-Options"] == "nosniff", path
        assert r.headers["Content-Security-Policy"] == docs.headers["Content-Security-Policy"]


# ------------------------------------------------------------------ the throttle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_throttle_window_ends_and_frees_the_address() -> None:
    clock = Clock()
    metrics = Metrics()
    throttle = FailureThrottle(3, metrics, window_s=60, clock=clock)
    assert [throttle.wrong_token("10.0.0.1") for _ in range(3)] == [None, None, None]
    assert throttle.wrong_token("10.0.0.1") == 60
    assert throttle.wrong_token("10.0.0.2") is None  # another address: its own count
    clock.now += 20.5
    assert throttle.wrong_token("10.0.0.1") == 40  # seconds left in the window, rounded up
    clock.now += 39.4
    assert throttle.wrong_token("10.0.0.1") == 1
    clock.now += 0.1  # the window is over: a fresh one, and throttled tries did not count
    assert [throttle.wrong_token("10.0.0.1") for _ in range(3)] == [None, None, None]
    assert throttle.wrong_token("10.0.0.1") == 60
    assert _failures(metrics.render(None).decode()) == {"rejected": 7.0, "throttled": 4.0}


def test_throttle_holds_a_bounded_number_of_addresses() -> None:
    clock = Clock()
    throttle = FailureThrottle(1, Metrics(), max_addresses=100, clock=clock)
    assert throttle.wrong_token("attacker") is None
    for i in range(10_000):  # an attack from many addresses
        throttle.wrong_token(f"10.1.{i // 256}.{i % 256}")
        if i % 50 == 0:
            assert throttle.wrong_token("attacker") == 60  # failing often keeps it held
    assert len(throttle) == 100
    # an address that has not failed for a while was dropped for newer ones
    assert throttle.wrong_token("10.1.0.1") is None


def test_throttle_off() -> None:
    throttle = FailureThrottle(0, Metrics())
    assert all(throttle.wrong_token("a") is None for _ in range(1000))


def test_wrong_tokens_throttled_in_process_valid_tokens_never(tmp_path: Path) -> None:
    """Both token paths (the lean select and FastAPI's routes) share one count per
    address. The TestClient's address is "testclient"."""
    with make_inprocess_client(  # type: ignore[attr-defined]
        f"sqlite:///{tmp_path / 's.db'}", auth_failures_per_minute=4
    ) as c:
        agent = c.post("/v1/tokens", json={"name": "agent", "role": "agent"}).json()["token"]
        answers = [c.post("/v1/select", json=SELECT, headers=WRONG).status_code for _ in range(2)]
        answers += [c.get("/v1/rules", headers=WRONG).status_code for _ in range(2)]
        assert answers == [401] * 4
        for throttled in (
            c.post("/v1/select", json=SELECT, headers=WRONG),
            c.get("/v1/rules", headers=WRONG),
            c.get("/metrics", headers=WRONG),
        ):
            assert throttled.status_code == 429
            assert 1 <= int(throttled.headers["retry-after"]) <= 60
            assert throttled.headers["cache-control"] == "no-store"
            assert throttled.json()["detail"]["message"].startswith("too many wrong tokens")
        # a valid token from the same address is answered as usual
        assert c.post("/v1/select", json=SELECT, headers={"Authorization": f"Bearer {agent}"})
        assert c.get("/v1/rules").status_code == 200
        # no token at all: 401 as before (it guesses nothing, and is not counted)
        assert c.get("/v1/rules", headers={"Authorization": ""}).status_code == 401
        assert _failures(c.get("/metrics").text) == {"rejected": 4.0, "throttled": 3.0}
        # the refused selects count the throttled one as a wrong token too
        assert _refused_for_wrong_tokens(c.get("/metrics").text) == 3
        doc = c.get("/openapi.json").json()
        assert "429" in doc["paths"]["/v1/select"]["post"]["responses"]


def test_an_unexpected_500_says_no_store_too(tmp_path: Path) -> None:
    """The headers are set outside Starlette's error middleware: its 500 has them."""
    app = make_inprocess_client(f"sqlite:///{tmp_path / 's.db'}").app  # type: ignore[attr-defined]

    async def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/v1/broken", broken)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/v1/broken")
    assert r.status_code == 500
    assert r.headers["cache-control"] == "no-store"


def test_throttled_address_spares_others_on_a_real_server(
    service_factory: type[ServiceProcess],
    sqlite_url: str,
) -> None:
    """Through a real server: an address past the limit gets 429 for wrong tokens and
    200 for a valid one; a second address (127.0.0.2, another loopback source) is
    answered 401 for its own wrong token, as if nothing had happened."""
    service = service_factory(
        sqlite_url, env={"SWITCHBOARD_AUTH_FAILURES_PER_MINUTE": "20"}
    ).start()
    first = httpx.Client(base_url=service.url, timeout=10)
    second = httpx.Client(
        base_url=service.url,
        timeout=10,
        transport=httpx.HTTPTransport(local_address="127.0.0.2"),
    )
    with first, second:
        answers = [first.post("/v1/select", json=SELECT, headers=WRONG) for _ in range(21)]
        assert [r.status_code for r in answers] == [401] * 20 + [429]
        assert 1 <= int(answers[-1].headers["retry-after"]) <= 60
        ok = first.post("/v1/select", json=SELECT, headers={"Authorization": f"Bearer {ADMIN}"})
        assert ok.status_code == 200
        assert first.get("/v1/rules", headers={"Authorization": f"Bearer {ADMIN}"}).is_success
        assert second.post("/v1/select", json=SELECT, headers=WRONG).status_code == 401
        assert first.post("/v1/select", json=SELECT, headers=WRONG).status_code == 429
        metrics = first.get("/metrics").text
    assert _failures(metrics) == {"rejected": 21.0, "throttled": 2.0}


def test_a_negative_limit_is_refused() -> None:
    from mla_switchboard.service.config import Settings
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="auth_failures_per_minute"):
        Settings(auth_failures_per_minute=-1)
