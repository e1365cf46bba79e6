"""Workload identity over HTTP: a pod of a cluster with a service-account issuer
selects, reports and fails only as itself, with the token the kubelet projects.

Through the in-process app (both doors of ``/v1/select``: the lean ASGI handler and
the FastAPI route it mirrors) and, for the key behaviour, a real ``switchboard serve``
process configured by ``SWITCHBOARD_WORKLOAD_ISSUERS``. The issuer is a test server
publishing discovery and a JWKS over HTTP (tests/service/workload_issuer.py).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mla_switchboard.agent.client import ServiceRefused, ask_service
from mla_switchboard.agent.settings import TokenFile
from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.service.refused import IDENTITY, STATIC, reason_of
from starlette.exceptions import HTTPException

from tests.conftest import ADMIN, ServiceProcess, make_inprocess_client
from tests.service.workload_issuer import AUDIENCE, TestIssuer

R1 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
H200 = {"name": "NVIDIA H200", "capability": [9, 0]}
PROD = "prod-east"


def select_body(cluster: str = PROD, pod: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"cluster": cluster, "device": H200, "model": R1, "dtype": "bfloat16"}
    if pod is not None:
        body["pod"] = pod
    return body


def report_body(pod: str, cluster: str = PROD) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "pod": pod,
        "device": H200,
        "model": R1,
        "dtype": "bfloat16",
        "results": [
            {
                "backend": "TORCH_SDPA",
                "shape": {"seqlens": [8], "num_heads": 16},
                "median_ms": 1,
                "tflops": 1,
                "correct": True,
            }
        ],
    }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def issuer() -> Iterator[TestIssuer]:
    yield from TestIssuer.serving()


@pytest.fixture(scope="module")
def app(issuer: TestIssuer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    db = tmp_path_factory.mktemp("workload") / "sb.db"
    issuers = [
        {
            "clusters": ["prod-*"],
            "issuer": issuer.url,
            "audience": AUDIENCE,
            "service_accounts": ["inference/switchboard-agent"],
        }
    ]
    with make_inprocess_client(f"sqlite:///{db}", workload_issuers=issuers) as c:  # type: ignore[attr-defined]
        yield c


@pytest.fixture(scope="module")
def static_agent(app: httpx.Client) -> str:
    r = app.post("/v1/tokens", json={"name": "agents", "role": "agent"})
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


@pytest.fixture(params=["lean", "route"])
def select_door(request: pytest.FixtureRequest, app: httpx.Client) -> Iterator[httpx.Client]:
    """Both doors of /v1/select: the lean ASGI handler, and the FastAPI route it
    mirrors (what the app serves with the handler switched off)."""
    handler = app.app.select_handler  # type: ignore[attr-defined]
    assert handler is not None
    if request.param == "route":
        app.app.select_handler = None  # type: ignore[attr-defined]
    yield app
    app.app.select_handler = handler  # type: ignore[attr-defined]


def test_a_pod_selects_as_itself_and_is_recorded_so(
    select_door: httpx.Client, issuer: TestIssuer
) -> None:
    pod = f"serve-{uuid.uuid4().hex[:6]}"
    r = select_door.post("/v1/select", json=select_body(), headers=bearer(issuer.token(pod)))
    assert r.status_code == 200, r.text
    decision = select_door.get(f"/v1/selections/{r.json()['decision_id']}")
    assert decision.status_code == 200, decision.text
    assert decision.json()["pod"] == pod  # from the token: the body named no pod


def test_a_pod_claiming_another_pods_name_is_refused(
    select_door: httpx.Client, issuer: TestIssuer
) -> None:
    token = issuer.token("serve-1")
    r = select_door.post("/v1/select", json=select_body(pod="serve-2"), headers=bearer(token))
    assert r.status_code == 403, r.text
    assert r.json()["detail"]["field"] == "pod" and "serve-2" in r.json()["detail"]["message"]
    # workload-identity advice, names quoted whole (no "'serve-1''s")
    message = r.json()["detail"]["message"]
    assert "issued to pod 'serve-1'" in message and "''" not in message
    assert "SWITCHBOARD_POD" in message and "token create" not in message
    ok = select_door.post("/v1/select", json=select_body(pod="serve-1"), headers=bearer(token))
    assert ok.status_code == 200, ok.text


def test_a_pod_outside_its_issuers_clusters_is_refused(
    select_door: httpx.Client, issuer: TestIssuer
) -> None:
    r = select_door.post(
        "/v1/select", json=select_body("dev-1"), headers=bearer(issuer.token("serve-1"))
    )
    assert r.status_code == 403, r.text
    assert r.json()["detail"]["field"] == "cluster"
    message = r.json()["detail"]["message"]
    assert "not 'dev-1'" in message and "SWITCHBOARD_WORKLOAD_ISSUERS" in message
    assert "token create" not in message and "''" not in message


def test_a_pod_of_an_unbound_service_account_is_403(
    select_door: httpx.Client, issuer: TestIssuer
) -> None:
    """A genuine token, of a pod whose service account the issuer does not bind to
    agents: refused as not allowed (403), not as a wrong token (401, throttled)."""
    token = issuer.token("batch-1", namespace="batch")
    r = select_door.post("/v1/select", json=select_body(), headers=bearer(token))
    assert r.status_code == 403, r.text
    assert "service account batch/switchboard-agent may not act as an agent" in r.text


@pytest.mark.parametrize(
    ("token_of", "reason"),
    [
        (lambda i: i.token(expires_in=-120), "token expired"),
        (lambda i: i.token(audience="vault"), "wrong audience"),
        (lambda i: i.token(issuer="https://other.example"), "unknown issuer"),
        (lambda i: i.token(not_before_in=120), "not yet valid"),
    ],
    ids=["expired", "audience", "issuer", "nbf"],
)
def test_a_bad_token_is_401_with_its_reason(
    select_door: httpx.Client, issuer: TestIssuer, token_of: Any, reason: str
) -> None:
    r = select_door.post("/v1/select", json=select_body(), headers=bearer(token_of(issuer)))
    assert r.status_code == 401, r.text
    assert reason in r.json()["detail"]["message"]
    assert r.headers["www-authenticate"].startswith("Bearer")


def test_a_static_token_cannot_speak_for_a_cluster_with_an_issuer(
    select_door: httpx.Client, static_agent: str
) -> None:
    r = select_door.post("/v1/select", json=select_body(pod="p1"), headers=bearer(static_agent))
    assert r.status_code == 401, r.text
    assert "cluster 'prod-east' requires workload identity" in r.json()["detail"]["message"]
    # a dry run records nothing, so it speaks for no pod: allowed
    dry = select_door.post(
        "/v1/select?dry_run=true", json=select_body(pod="p1"), headers=bearer(static_agent)
    )
    assert dry.status_code == 200, dry.text
    # counted per cluster and reason, as other refused selects are
    assert reason_of(HTTPException(401, r.json()["detail"])) == STATIC
    assert reason_of(HTTPException(403, {"message": "pod: ...", "field": "pod"})) == IDENTITY
    # clusters without an issuer keep their static tokens
    dev = select_door.post(
        "/v1/select", json=select_body("dev-1", "p1"), headers=bearer(static_agent)
    )
    assert dev.status_code == 200, dev.text


def test_reports_only_as_itself(app: httpx.Client, issuer: TestIssuer, static_agent: str) -> None:
    pod = f"bench-{uuid.uuid4().hex[:6]}"
    token = bearer(issuer.token(pod))
    chosen = app.post("/v1/select", json=select_body(), headers=token).json()
    r = app.post("/v1/measurements", json=report_body("someone-else"), headers=token)
    assert r.status_code == 403, r.text
    assert r.json()["detail"]["field"] == "pod"
    r = app.post("/v1/measurements", json=report_body(pod), headers=token)
    assert r.status_code == 201, r.text
    r = app.post("/v1/measurements", json=report_body(pod), headers=bearer(static_agent))
    assert r.status_code == 401 and "requires workload identity" in r.text

    failure = {"backend": chosen["backend"], "error": "kernel build failed"}
    path = f"/v1/selections/{chosen['decision_id']}/failure"
    other = bearer(issuer.token("not-the-owner"))
    r = app.post(path, json=failure, headers=other)
    assert r.status_code == 403 and r.json()["detail"]["field"] == "pod", r.text
    r = app.post(path, json=failure, headers=bearer(static_agent))
    assert r.status_code == 401, r.text
    r = app.post(path, json=failure, headers=token)
    assert r.status_code == 202, r.text


def test_a_workload_token_is_no_viewer(app: httpx.Client, issuer: TestIssuer) -> None:
    r = app.get("/v1/pods", headers=bearer(issuer.token("serve-1")))
    assert r.status_code == 403, r.text


def test_a_real_server_follows_key_rotation(
    issuer: TestIssuer, service_factory: type[ServiceProcess], sqlite_url: str, tmp_path: Path
) -> None:
    """A real ``switchboard serve``: the configuration from the environment, keys from
    OIDC discovery, a token under a new key refused while the issuer does not publish
    it, then accepted once it does (the refetch of an unknown kid, at most once per
    ``SWITCHBOARD_WORKLOAD_REFETCH_S``)."""
    env = {
        "SWITCHBOARD_WORKLOAD_ISSUERS": json.dumps(
            [{"clusters": ["prod-*"], "issuer": issuer.url, "audience": AUDIENCE}]
        ),
        "SWITCHBOARD_WORKLOAD_REFETCH_S": "0.5",
    }
    service = service_factory(sqlite_url, env=env).start()
    with httpx.Client(base_url=service.url, timeout=10) as c:
        r = c.post("/v1/select", json=select_body(), headers=bearer(issuer.token("serve-9")))
        assert r.status_code == 200, r.text
        kid = issuer.add_key(f"k-{uuid.uuid4().hex[:4]}", publish=False)
        time.sleep(0.6)
        rotated = bearer(issuer.token("serve-9", kid=kid))
        r = c.post("/v1/select", json=select_body(), headers=rotated)
        assert r.status_code == 401 and "unknown kid" in r.text, r.text
        issuer.publish(kid)
        time.sleep(0.6)
        r = c.post("/v1/select", json=select_body(), headers=rotated)
        assert r.status_code == 200, r.text
        r = c.post("/v1/select", json=select_body(pod="x"), headers=bearer(issuer.token("y")))
        assert r.status_code == 403, r.text
        r = c.post("/v1/select", json=select_body(), headers=bearer(ADMIN))
        assert r.status_code == 401 and "requires workload identity" in r.text

    # the agent reads the projected token at each request: the kubelet's refresh of an
    # expired token is picked up without a restart
    token_file = tmp_path / "token"
    source = TokenFile(str(token_file))
    request = SelectRequest.model_validate(select_body())
    token_file.write_text(issuer.token("serve-5", expires_in=-120))
    with pytest.raises(ServiceRefused) as refused:
        ask_service(request, urls=[service.url], token=source, deadline_s=5)
    assert refused.value.status == 401 and "token expired" in str(refused.value)
    token_file.write_text(issuer.token("serve-5"))
    answer = ask_service(request, urls=[service.url], token=source, deadline_s=5)
    assert answer.response is not None and answer.decision_id is not None


def test_one_pod_cannot_pose_as_many_to_halt_a_rollout(
    app: httpx.Client, issuer: TestIssuer
) -> None:
    """The forged-pods attack: one token invents pod names until enough "distinct" stage
    pods report failures to halt a rollout. Under workload identity the invented
    selects are refused, and the one real pod's repeated failures count once."""
    cluster = f"prod-{uuid.uuid4().hex[:6]}"
    r = app.put(
        f"/v1/overrides/{cluster}",
        json={
            "note": "staged",
            "force": "TORCH_SDPA",
            "rollout": {"percent": 50, "max_failures": 3},
        },
    )
    assert r.status_code == 200, r.text
    # the attacker: a pod in the stage (this test's issuer signs for any name)
    for i in range(40):
        token = bearer(issuer.token(f"attacker-{i}"))
        mine = app.post("/v1/select", json=select_body(cluster), headers=token).json()
        if mine["backend"] == "TORCH_SDPA":
            break
    assert mine["backend"] == "TORCH_SDPA", mine
    for i in range(16):
        r = app.post("/v1/select", json=select_body(cluster, f"victim-{i}"), headers=token)
        assert r.status_code == 403 and r.json()["detail"]["field"] == "pod", r.text
    for _ in range(16):
        r = app.post(
            f"/v1/selections/{mine['decision_id']}/failure",
            json={"backend": "TORCH_SDPA", "error": "forged"},
            headers=token,
        )
        assert r.status_code == 202, r.text
    deadline = time.monotonic() + 5  # the guard counts the reports off the request path
    while True:
        listed = app.get("/v1/overrides").json()["items"]
        rollout = {o["cluster"]: o for o in listed}[cluster]["rollout"]
        if rollout["failed_pods"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rollout["state"] == "active", rollout
    assert len(rollout["failed_pods"]) == 1 and "attacker" in rollout["failed_pods"][0], rollout


def test_rejected_workload_tokens_are_throttled_as_wrong_tokens(
    issuer: TestIssuer, tmp_path: Path
) -> None:
    """Forged or stale workload tokens count against their address like wrong static
    tokens; a valid one from the same address still passes."""
    issuers = [{"clusters": ["prod-*"], "issuer": issuer.url, "audience": AUDIENCE}]
    url = f"sqlite:///{tmp_path / 'sb.db'}"
    with make_inprocess_client(url, workload_issuers=issuers, auth_failures_per_minute=3) as c:  # type: ignore[attr-defined]
        stale = bearer(issuer.token(expires_in=-120))
        answers = [c.post("/v1/select", json=select_body(), headers=stale) for _ in range(4)]
        assert [r.status_code for r in answers] == [401, 401, 401, 429], answers[-1].text
        ok = c.post("/v1/select", json=select_body(), headers=bearer(issuer.token("serve-1")))
        assert ok.status_code == 200, ok.text
