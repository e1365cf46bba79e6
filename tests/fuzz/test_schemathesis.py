"""Schemathesis against the service's own OpenAPI document, on a real HTTP server (uvicorn
serving the app as ``switchboard serve`` does, from a thread of this process: the HTTP
layer's own refusals are part of what is fuzzed, the process start is not).

Every operation in ``/openapi.json`` gets generated requests (schemathesis's examples,
coverage and fuzzing phases; valid and invalid ones) with the bootstrap admin token
for the document's bearer scheme, so the authenticated paths are reached. Every
response goes through schemathesis's default checks: never 5xx; the status code is
one the operation declares; the body matches the declared schema; invalid input is
refused; valid input is accepted; no token or a wrong one gives 401; a 405 lists
every allowed method.

The server has a database of its own: fuzzing replaces rules, overrides and tokens,
which would disturb the tests that share ``shared_service``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
import schemathesis
from mla_switchboard.core.hardware import peak_bf16_tflops
from pydantic import TypeAdapter, ValidationError

from tests.conftest import ADMIN
from tests.served import ThreadServer, serving

# Bounded: deterministic, at most this many generated cases per operation and phase
# (the coverage phase's boundary cases come on top). The whole module takes about 25 s
# on a 2-core machine.
MAX_EXAMPLES = 12

_DATETIME = TypeAdapter(datetime)


@pytest.fixture(scope="module")
def fuzz_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    d = tmp_path_factory.mktemp("fuzz")
    # The fuzzer sends a wrong token with many of its cases (over 300 a minute from one
    # address) and its check wants the 401 itself: the wrong-token throttle (429, tested
    # in tests/security/test_headers_and_throttling.py) is off here.
    with serving(f"sqlite:///{d / 'switchboard.db'}", auth_failures_per_minute=0) as service:
        _decide_a_few(service)
        yield service


def _decide_a_few(service: ThreadServer) -> None:
    """A few real decisions, so that listings, the summary and previews have rows."""
    with service.client() as c:
        for i, cap in enumerate(([9, 0], [10, 0], None)):
            r = c.post(
                "/v1/select",
                json={
                    "cluster": "fuzz",
                    "node": f"n{i}",
                    "pod": f"p{i}",
                    "device": {"name": "GPU", "capability": cap},
                    "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
                    "dtype": "bf16",
                },
            )
            assert r.status_code == 200, r.text


def _in_the_past(value: Any) -> bool:
    try:
        when = _DATETIME.validate_python(value)
    except ValidationError:
        return False  # not a date: an invalid case, left for the server to refuse
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when <= datetime.now(UTC) + timedelta(minutes=5)


def _keep_override_rules(spec: dict[str, Any]) -> None:
    """The two rules of an override that JSON Schema cannot state (the rest is in the
    OpenAPI): ``expires_at`` lies in the future, ``force`` is not also denied. A
    generated override breaking them is moved into the future / has the forced
    backend taken off its deny list; the server's refusal of both is checked in
    tests/fuzz/test_hostile_inputs.py and tests/service."""
    if _in_the_past(spec.get("expires_at")):
        spec["expires_at"] = "2999-01-01T00:00:00Z"
    force, deny = spec.get("force"), spec.get("deny")
    if isinstance(force, str) and isinstance(deny, list):
        spec["deny"] = [b for b in deny if not (isinstance(b, str) and b.upper() == force.upper())]
    _keep_rollout_rules(spec.get("rollout"))


def _keep_rollout_rules(rollout: Any) -> None:
    """A staged override's rules JSON Schema cannot state: ``steps`` and ``step_every``
    go together, steps increase strictly and end at ``percent`` or above (the server's
    422s for each are checked in tests/service/test_rollouts.py)."""
    if not isinstance(rollout, dict):
        return
    steps, every = rollout.get("steps"), rollout.get("step_every")
    if (steps is None) != (every is None):
        rollout["steps"] = rollout["step_every"] = None
    elif isinstance(steps, list) and all(_whole(x) for x in steps):
        percent = rollout.get("percent")
        top = [int(percent)] if _whole(percent) and 1 <= percent <= 100 else []
        rollout["steps"] = sorted({int(x) for x in steps} | set(top))


def _whole(value: Any) -> bool:
    """JSON's integers: 47 and 47.0 alike (the server reads both as 47)."""
    return type(value) is int or (type(value) is float and value.is_integer())


def _keep_figures_physical(report: dict[str, Any]) -> None:
    """The schema bounds ``tflops`` by the fastest GPU; the server also by the named
    GPU's own peak (core/hardware.py), which JSON Schema cannot state: a generated
    figure above it is lowered to it (the refusal is tests/security/test_evidence.py's)."""
    device = report.get("device")
    name = device.get("name") if isinstance(device, dict) else None
    peak, _ = peak_bf16_tflops(name if isinstance(name, str) else None)
    for result in report.get("results") or []:
        if isinstance(result, dict) and isinstance(result.get("tflops"), int | float):
            result["tflops"] = min(result["tflops"], peak)


@pytest.fixture(scope="module")
def api_schema(fuzz_service: ThreadServer) -> schemathesis.BaseSchema:
    config = schemathesis.Config.from_dict(
        {
            "base-url": fuzz_service.url,
            # The token for the document's security scheme (not a bare header):
            # schemathesis knows the credentials are real, sends them, and also probes
            # each operation without them and with a wrong one, expecting 401.
            "auth": {"openapi": {"HTTPBearer": {"bearer": ADMIN}}},
            "request-timeout": 10,
            # deterministic: Hypothesis derandomized and no example database, so every
            # run sends the same requests.
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True},
            "checks": {
                # Schema-valid requests must be accepted (2xx) or refused for a reason
                # of state (schemathesis's defaults: 401, 403, 404, 409, 429). Added:
                # 412, the answer HTTP prescribes for a stale If-Match: any ETag the
                # generator invents is stale, however well formed.
                "positive_data_acceptance": {
                    "expected-statuses": ["2xx", "3xx", "401", "403", "404", "409", "412", "429"]
                },
            },
        }
    )
    schema = schemathesis.openapi.from_url(f"{fuzz_service.url}/openapi.json", config=config)

    @schema.hook
    def map_case(ctx: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
        # map_case, not map_body: it sees the coverage and examples phases' cases too.
        # Only cases meant to be valid are touched: an invalid one stays as generated.
        body = case.body
        if case.headers:
            # A made-up Content-Length makes the message itself malformed: the HTTP
            # server answers 400 before any route sees it, which says nothing about the
            # API's contract (the client computes the real one).
            case.headers = {k: v for k, v in case.headers.items() if k.lower() != "content-length"}
        if case.meta is None or not case.meta.generation.mode.is_positive:
            return case
        if case.headers and "idempotency-key" in {k.lower() for k in case.headers}:
            # a key reused for another request is a (correct) 422; each case its own key
            case.headers = {
                k: (uuid.uuid4().hex if k.lower() == "idempotency-key" else v)
                for k, v in case.headers.items()
            }
        if not isinstance(body, dict):
            return case
        if case.method.upper() == "PUT" and case.path.startswith("/v1/overrides/"):
            _keep_override_rules(body)
        elif case.path == "/v1/preview" and isinstance(body.get("override"), dict):
            _keep_override_rules(body["override"])
        elif case.path in ("/v1/plan", "/v1/apply") and isinstance(body.get("file"), dict):
            for spec in (body["file"].get("overrides") or {}).values():
                if isinstance(spec, dict):
                    _keep_override_rules(spec)
        elif case.method.upper() == "POST" and case.path == "/v1/measurements":
            _keep_figures_physical(body)
        elif case.path.endswith("/rollout") and body.get("action") != "promote":
            body.pop("percent", None)  # percent goes with promote only (the schema's if/then)
        return case

    return schema


# The change stream never ends by itself (tests/service/test_events.py reads it). The
# lazy schema's own filter: the one the pytest plugin applies to the fixture's operations.
schema = schemathesis.pytest.from_fixture("api_schema").exclude(path="/v1/events")


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    """One HTTP session for every case: its connections are kept alive (a connection
    per request cost 5,000 connects a run), and the environment's proxy settings are
    not read for each request (the server is local; reading them was 3 s a run)."""
    with requests.Session() as session:
        session.trust_env = False
        yield session


@schema.parametrize()
def test_openapi_conformance(case: schemathesis.Case, http: requests.Session) -> None:
    case.call_and_validate(session=http)


def test_service_sound_after_fuzzing(fuzz_service: ThreadServer) -> None:
    """Runs after the fuzzing above (pytest keeps file order): the server is up,
    ready, still decides, and the decisions made before fuzzing are still listed."""
    with fuzz_service.client() as c:
        assert fuzz_service.serving, "the server stopped while fuzzed"
        assert c.get("/readyz").json()["status"] == "ready"
        assert c.get("/healthz").status_code == 200
        # fuzzing may have denied or forced backends: deciding at all is what counts
        r = c.post(
            "/v1/select",
            json={
                "cluster": "after-fuzz",
                "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
                "dtype": "bf16",
            },
        )
        assert r.status_code in (200, 409), r.text
        listed = c.get("/v1/selections", params={"cluster": "fuzz"}).json()["items"]
        pods = {item["pod"] for item in listed}
        assert {"p0", "p1", "p2"} <= pods
