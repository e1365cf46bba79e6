"""The workload-token verifier on its own (service/identity/workload.py, workload_keys.py),
against a test issuer serving OIDC discovery and a JWKS over real HTTP: what each
kind of bad token is answered, key rotation, the JWKS-file variant, the cache, and
what a bad ``SWITCHBOARD_WORKLOAD_ISSUERS`` says at start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from mla_switchboard.service.config import Settings, WorkloadIssuer
from mla_switchboard.service.identity.issuer_keys import IssuerKeys, KeyProblem
from mla_switchboard.service.identity.workload import (
    PodIdentity,
    Rejected,
    WorkloadVerifier,
    account_matches,
)
from pydantic import ValidationError

from tests.service.workload_issuer import AUDIENCE, TestIssuer


@pytest.fixture(scope="module")
def issuer() -> Iterator[TestIssuer]:
    yield from TestIssuer.serving()


def verifier_of(entry: dict[str, Any], refetch_s: float = 30.0) -> WorkloadVerifier:
    return WorkloadVerifier(
        [WorkloadIssuer.model_validate(entry)],
        leeway_s=30,
        keys_for=lambda e: IssuerKeys(e, refetch_s=refetch_s),
    )


def entry_of(issuer: TestIssuer, **more: Any) -> dict[str, Any]:
    return {"clusters": ["prod-*"], "issuer": issuer.url, "audience": AUDIENCE, **more}


def test_a_projected_token_names_its_pod(issuer: TestIssuer) -> None:
    verifier = verifier_of(entry_of(issuer))  # keys through OIDC discovery
    got = verifier.verify(issuer.token("serve-7", pod_uid="uid-7", namespace="llm"))
    assert isinstance(got, PodIdentity), got
    assert (got.pod, got.pod_uid, got.namespace, got.service_account) == (
        "serve-7",
        "uid-7",
        "llm",
        "switchboard-agent",
    )
    assert got.clusters == ("prod-*",) and got.issuer == issuer.url
    assert issuer.hits["/.well-known/openid-configuration"] >= 1


def _hs256(issuer: TestIssuer) -> str:
    claims = jwt.decode(issuer.token(), options={"verify_signature": False})
    return jwt.encode(claims, "a-shared-secret-long-enough-for-hs256!", algorithm="HS256")


def _unsigned(issuer: TestIssuer) -> str:
    claims = jwt.decode(issuer.token(), options={"verify_signature": False})
    return jwt.encode(claims, None, algorithm="none")


def _forged(issuer: TestIssuer) -> str:
    """Signed by a key the issuer never published, under a published kid."""
    other = TestIssuer()
    other.add_key("k1")
    token = other.token(issuer=issuer.url)
    other.close()
    return token


def _no_pod(issuer: TestIssuer) -> str:
    return issuer.token(claims={"kubernetes.io": {"namespace": "x"}})


CASES = [
    ("expired", lambda i: i.token(expires_in=-120), "token expired"),
    ("expired within leeway", lambda i: i.token(expires_in=-20), None),
    ("not yet valid beyond leeway", lambda i: i.token(not_before_in=90), "token not yet valid"),
    ("clock skew within leeway", lambda i: i.token(not_before_in=20), None),
    ("wrong audience", lambda i: i.token(audience="vault"), "wrong audience"),
    ("unknown issuer", lambda i: i.token(issuer="https://evil.example"), "unknown issuer"),
    ("HS256", _hs256, "unsupported algorithm"),
    ("alg none", _unsigned, "unsupported algorithm"),
    ("forged signature", _forged, "bad signature"),
    ("no pod claims", _no_pod, "not bound to a pod"),
    ("not a JWT", lambda i: "a.b.c", "malformed token"),
    ("no exp", lambda i: i.token(claims={"exp": None}), "lacks the exp claim"),
]


@pytest.mark.parametrize(("make", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_bad_token_says_why(issuer: TestIssuer, make: Any, reason: str | None) -> None:
    got = verifier_of(entry_of(issuer)).verify(make(issuer))
    if reason is None:
        assert isinstance(got, PodIdentity), got
    else:
        assert isinstance(got, Rejected) and got.status == 401, got
        assert reason in got.reason
        assert "BEGIN" not in got.reason and "-----" not in got.reason


def test_unknown_kid_then_rotation_is_followed_rate_limited(issuer: TestIssuer) -> None:
    # the keys' own clock, moved by the test: 20 verifications on a busy machine may
    # take longer than any refetch interval a test could wait for
    now = [1_000.0]
    verifier = WorkloadVerifier(
        [WorkloadIssuer.model_validate(entry_of(issuer, jwks_uri=issuer.url + "/openid/v1/jwks"))],
        leeway_s=30,
        keys_for=lambda e: IssuerKeys(e, refetch_s=0.3, clock=lambda: now[0]),
    )
    keys = verifier.keys(issuer.url)
    assert isinstance(verifier.verify(issuer.token(kid="k1")), PodIdentity)
    issuer.add_key("k2", publish=False)  # the API server's new key, not yet published
    first = verifier.verify(issuer.token(kid="k2"))
    assert first == Rejected("unknown kid")
    fetched = keys.fetches
    for _ in range(20):  # made-up kids cannot make it hammer the issuer
        assert verifier.verify(issuer.token(kid="k2")) == Rejected("unknown kid")
    assert keys.fetches == fetched
    issuer.publish("k2")
    now[0] += 0.35
    got = verifier.verify(issuer.token(kid="k2"))
    assert isinstance(got, PodIdentity), got
    assert keys.fetches == fetched + 1


def test_discovery_naming_another_issuer_is_unavailable(issuer: TestIssuer) -> None:
    """An issuer whose discovery document names another issuer gets no keys (503)."""
    entry = {**entry_of(issuer), "issuer": issuer.url + "/"}  # its document says url
    token = issuer.token(issuer=issuer.url + "/")
    got = verifier_of(entry).verify(token)
    assert got == Rejected("issuer keys unavailable", 503)


def test_jwks_file_is_read_again_when_it_changes(issuer: TestIssuer, tmp_path: Path) -> None:
    path = issuer.write_jwks(tmp_path / "jwks.json")
    verifier = verifier_of(entry_of(issuer, jwks_file=str(path)))
    hits = sum(issuer.hits.values())
    assert isinstance(verifier.verify(issuer.token(kid="k1")), PodIdentity)
    issuer.add_key("k3")
    assert verifier.verify(issuer.token(kid="k3")) == Rejected("unknown kid")
    issuer.write_jwks(path)
    later = time.time() + 5
    os.utime(path, (later, later))
    assert isinstance(verifier.verify(issuer.token(kid="k3")), PodIdentity)
    assert sum(issuer.hits.values()) == hits  # air-gapped: never asked the issuer


def test_a_verified_token_is_kept_until_it_expires(issuer: TestIssuer) -> None:
    now = [time.time()]
    verifier = WorkloadVerifier(
        [WorkloadIssuer.model_validate(entry_of(issuer))], leeway_s=30, clock=lambda: now[0]
    )
    token = issuer.token(expires_in=600)
    first = verifier.verify(token)
    assert isinstance(first, PodIdentity)
    assert verifier.cached(token) is first and not verifier.needs_verifying(token)
    now[0] += 600 + 31
    assert verifier.cached(token) is None and verifier.needs_verifying(token)


def test_which_clusters_require_identity(issuer: TestIssuer) -> None:
    verifier = verifier_of(entry_of(issuer))
    assert verifier.requires_identity("prod-east")
    assert not verifier.requires_identity("dev-1")
    assert not WorkloadVerifier([]).requires_identity("prod-east")


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"clusters": ["prod-*"], "issuer": "k8s", "audience": "sb"}, "workload_issuers.0.issuer"),
        ({"clusters": [], "issuer": "https://k", "audience": "sb"}, "workload_issuers.0.clusters"),
        ({"clusters": ["a"], "issuer": "https://k", "audience": ""}, "workload_issuers.0.audience"),
        (
            {
                "clusters": ["a"],
                "issuer": "https://k",
                "audience": "sb",
                "jwks_file": "/x",
                "jwks_uri": "https://k/jwks",
            },
            "jwks_file, jwks_uri: give one of them",
        ),
        ({"clusters": ["a"], "issuer": "https://k", "audience": "sb", "aud": "x"}, "aud"),
    ],
)
def test_bad_issuer_config_names_the_field(entry: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(workload_issuers=[entry])
    assert says in str(caught.value)


def test_an_issuer_configured_twice_is_refused() -> None:
    entry = {"clusters": ["a"], "issuer": "https://k", "audience": "sb"}
    with pytest.raises(ValidationError, match="configured twice"):
        Settings(workload_issuers=[entry, {**entry, "clusters": ["b"]}])


def test_issuers_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "SWITCHBOARD_WORKLOAD_ISSUERS",
        '[{"clusters": ["prod-*"], "issuer": "https://k8s.example", "audience": "sb"}]',
    )
    (entry,) = Settings().workload_issuers
    assert entry.discovery_url == "https://k8s.example/.well-known/openid-configuration"


def test_a_bad_issuer_stops_the_start_naming_the_field(tmp_path: Path) -> None:
    """``switchboard serve`` with a bad entry: exit 2, one line per field at fault, and
    no value echoed (an entry may sit beside a secret)."""
    env = {
        **os.environ,
        "SWITCHBOARD_DATABASE_URL": f"sqlite:///{tmp_path / 'sb.db'}",
        "SWITCHBOARD_WORKLOAD_ISSUERS": json.dumps(
            [{"clusters": ["prod-*"], "issuer": "https://k8s.example", "audience": ""}]
        ),
    }
    done = subprocess.run(
        [sys.executable, "-m", "mla_switchboard.service.cli", "serve", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "bad setting workload_issuers.0.audience: String should have at least 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_issuers_are_read_from_a_file_beside_the_variable(tmp_path: Path) -> None:
    """A mounted ConfigMap: its entries join the variable's, and an issuer in both is
    refused as configured twice."""
    listed = tmp_path / "issuers.json"
    listed.write_text(
        json.dumps([{"clusters": ["lab-1"], "issuer": "https://lab.example", "audience": "sb"}])
    )
    entry = {"clusters": ["prod-*"], "issuer": "https://k8s.example", "audience": "sb"}
    both = Settings(workload_issuers=[entry], workload_issuers_file=listed)
    assert [e.issuer for e in both.workload_issuers] == [
        "https://k8s.example",
        "https://lab.example",
    ]
    with pytest.raises(ValidationError, match="configured twice"):
        Settings(
            workload_issuers=[{**entry, "issuer": "https://lab.example"}],
            workload_issuers_file=listed,
        )


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read"),
        ("[{", "is not JSON (line 1"),
        ('{"issuer": "https://k"}', "must hold a JSON list"),
        ('[{"clusters": ["a"], "issuer": "https://k", "audience": ""}]', "[0.audience]"),
    ],
)
def test_a_bad_issuers_file_names_the_file_and_entry(
    tmp_path: Path, content: str | None, says: str
) -> None:
    listed = tmp_path / "issuers.json"
    if content is not None:
        listed.write_text(content)
    with pytest.raises(ValidationError) as caught:
        Settings(workload_issuers_file=listed)
    assert "workload_issuers_file" in str(caught.value)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("bound", "namespace", "accepted"),
    [
        (None, "anything", True),  # unset: any pod holding a token for the audience
        (["inference/switchboard-agent"], "inference", True),
        (["inference/switchboard-agent"], "batch", False),
        (["infer*/switchboard-*"], "inference-eu", True),
        (["*/other-agent"], "inference", False),
    ],
)
def test_only_bound_service_accounts_act_as_agents(
    issuer: TestIssuer, bound: list[str] | None, namespace: str, accepted: bool
) -> None:
    """As Vault's Kubernetes auth binds a role to service account names and namespaces:
    a genuine token of another service account is refused (403: the pod is who it says,
    it is just not an agent), naming the account and the binding."""
    verifier = verifier_of(entry_of(issuer, service_accounts=bound))
    got = verifier.verify(issuer.token("serve-1", namespace=namespace))
    if accepted:
        assert isinstance(got, PodIdentity), got
    else:
        assert isinstance(got, Rejected) and got.status == 403, got
        assert f"service account {namespace}/switchboard-agent may not act" in got.reason


@pytest.mark.parametrize(
    ("namespace", "name", "glob", "matches"),
    [
        ("inference", "agent", "inference/agent", True),
        ("inference", "agent", "infer*/agent", True),
        ("inference", "agent", "*/agent", True),
        ("inference", "agent", "*/*", True),
        ("inference", "agent-2", "*/agent", False),
        # a * never spans the slash: the parts are matched on their own
        ("prod", "x/agent", "prod*/agent", False),
        ("prod/x", "agent", "prod*/agent", False),
        ("prod", "agent", "prod/*agent*", True),
    ],
)
def test_a_service_account_glob_matches_each_part_on_its_own(
    namespace: str, name: str, glob: str, matches: bool
) -> None:
    assert account_matches(namespace, name, glob) is matches


def test_a_token_naming_a_namespace_with_a_slash_is_refused(issuer: TestIssuer) -> None:
    verifier = verifier_of(entry_of(issuer, service_accounts=["prod*/switchboard-agent"]))
    got = verifier.verify(issuer.token("serve-1", namespace="prod/x"))
    assert isinstance(got, Rejected) and got.status == 401, got


@pytest.mark.parametrize("glob", ["no-slash", "a/", "/b", "Upper/x", "a/b/c"])
def test_a_bad_service_account_binding_names_the_field(glob: str) -> None:
    entry = {"clusters": ["a"], "issuer": "https://k", "audience": "sb", "service_accounts": [glob]}
    with pytest.raises(ValidationError, match=r"workload_issuers\.0\.service_accounts\.0"):
        Settings(workload_issuers=[entry])


def _in_thread(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a thread, its result; a hang fails the test instead of the run."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result(timeout=30)


def test_a_hung_issuer_never_holds_up_a_token_whose_key_is_known() -> None:
    """While a fetch for an unknown kid hangs at the issuer, a token whose key is held
    is verified at once: no lock is held across the fetch."""
    served = TestIssuer()
    try:
        served.add_key("k1")
        verifier = verifier_of(entry_of(served, jwks_uri=served.url + "/openid/v1/jwks"), 0.0)
        assert isinstance(verifier.verify(served.token(kid="k1")), PodIdentity)
        served.add_key("k2", publish=False)
        served.jwks_gate.clear()  # the issuer hangs from now on
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(verifier.verify, served.token(kid="k2"))
            while served.hits["/openid/v1/jwks"] < 2:  # the unknown kid's fetch began
                time.sleep(0.01)
            known = _in_thread(verifier.verify, served.token("another-pod", kid="k1"))
            assert isinstance(known, PodIdentity), known
            assert not served.jwks_gate.is_set() and not stuck.done()
            served.jwks_gate.set()
            assert stuck.result(timeout=30) == Rejected("unknown kid")
    finally:
        served.close()


def test_a_flood_of_unknown_kids_makes_one_fetch_and_few_waiters() -> None:
    served = TestIssuer()
    try:
        served.add_key("k1")
        entry = WorkloadIssuer.model_validate(
            entry_of(served, jwks_uri=served.url + "/openid/v1/jwks")
        )
        keys = IssuerKeys(entry, refetch_s=30.0)
        assert not isinstance(keys.key("k1"), KeyProblem)
        fetched = served.hits["/openid/v1/jwks"]
        keys._next_fetch_at = 0.0  # as if refetch_s had passed
        served.jwks_gate.clear()
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(40) as pool:
            futures = [pool.submit(keys.key, f"made-up-{i}") for i in range(40)]
            while served.hits["/openid/v1/jwks"] == fetched:
                time.sleep(0.01)
            # beyond the few that may wait, the flood is answered at once
            refused = [f.result(timeout=30) for f in futures if f.done()]
            assert refused and all(
                isinstance(r, KeyProblem) and r.status == 503 for r in refused
            ), refused
            served.jwks_gate.set()
            got = [f.result(timeout=30) for f in futures]
        assert all(isinstance(r, KeyProblem) for r in got)
        assert served.hits["/openid/v1/jwks"] == fetched + 1, "one fetch for the flood"
        assert keys.key("made-up-0") == KeyProblem("unknown kid")  # rate-limited now
        assert served.hits["/openid/v1/jwks"] == fetched + 1
    finally:
        served.close()


def test_a_failed_refresh_serves_the_held_keys_and_says_so() -> None:
    served = TestIssuer()
    try:
        served.add_key("k1")
        clock = [1000.0]
        entry = WorkloadIssuer.model_validate(
            entry_of(served, jwks_uri=served.url + "/openid/v1/jwks")
        )
        keys = IssuerKeys(entry, refetch_s=10.0, max_age_s=60.0, clock=lambda: clock[0])
        held = keys.key("k1")
        assert not isinstance(held, KeyProblem)
        assert keys.status()["refresh_failing"] is False
        served.jwks_status = 500
        clock[0] += 61  # the keys are old: refreshed in the background
        assert keys.key("k1") is held
        _wait_until(lambda: keys.status()["refresh_failing"])
        status = keys.status()
        assert status["keys"] == 1 and status["refresh_error"] == "ValueError"
        # backoff: the next attempt waits longer after each failure
        clock[0] += 10
        assert keys.key("k1") is held
        _wait_until(lambda: keys._failures == 2)
        clock[0] += 10  # 20 s are due after two failures
        keys.key("k1")
        assert keys._failures == 2 and keys._inflight is None
        served.jwks_status = 200
        clock[0] += 10
        keys.key("k1")
        _wait_until(lambda: not keys.status()["refresh_failing"])
        assert keys.status()["refresh_error"] is None
    finally:
        served.close()


def _wait_until(check: Any) -> None:
    for _ in range(3000):
        if check():
            return
        time.sleep(0.01)
    raise AssertionError("never happened")


def test_readyz_and_metrics_say_when_an_issuers_keys_cannot_be_refreshed(
    tmp_path: Path,
) -> None:
    """A refresh that fails keeps the keys in service and says so: ``/readyz``'s
    ``issuer_keys`` section and a gauge per issuer, until a fetch succeeds."""
    from tests.conftest import make_inprocess_client

    served = TestIssuer()
    try:
        served.add_key("k1")
        entry = entry_of(served, jwks_uri=served.url + "/openid/v1/jwks")
        with make_inprocess_client(  # type: ignore[attr-defined]
            f"sqlite:///{tmp_path / 'sb.db'}", workload_issuers=[entry]
        ) as client:
            runtime = client.app.state.runtime
            keys = runtime.workload.keys(served.url)
            assert not isinstance(keys.key("k1"), KeyProblem)
            ready = client.get("/readyz").json()["issuer_keys"][served.url]
            assert ready["keys"] == 1 and ready["refresh_failing"] is False
            served.jwks_status = 503
            keys._next_fetch_at = 0.0
            assert keys.key("made-up") == KeyProblem("unknown kid")
            ready = client.get("/readyz").json()["issuer_keys"][served.url]
            assert ready["refresh_failing"] is True and ready["refresh_error"] == "ValueError"
            scraped = client.get("/metrics").text
            assert f'switchboard_issuer_keys_refresh_failing{{issuer="{served.url}"}} 1.0' in (
                scraped
            )
            assert isinstance(client.get("/v1/whoami").json(), dict)
    finally:
        served.close()
