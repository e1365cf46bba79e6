"""Rollout guards count evidence sources, not pod names from a body: a verified pod
once per pod UID, a static token once per pod name it recorded a decision for (or once
in all, ``SWITCHBOARD_GUARD_STATIC_SOURCES=per_token``).

The forged-pods attack, reproduced: a static token limited to ``prod-east`` invents pod
names, asks for a decision as each of them, and reports each one's failure; three
invented pods halt a ``prod-*`` rollout with ``max_failures: 3``. By default they still
do, as three *static* sources the rollout names as such (a static token cannot prove
its pods); with ``per_token`` they are one source. Under workload identity a pod
cannot invent a name at all, and three verified pods (three UIDs) halt it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from mla_switchboard.core import rollouts
from mla_switchboard.core.rollouts import EvidenceCount, count_sources, evidence_source
from mla_switchboard.core.schemas import Override

from tests.conftest import ADMIN, make_inprocess_client
from tests.service.test_rollout_guards import FORCE, agent, fail, rollout, stage_pods
from tests.service.test_select_decisions import body
from tests.service.workload_issuer import AUDIENCE, TestIssuer

# ------------------------------------------------------------------ the counting core


@pytest.mark.parametrize(
    ("principal", "verified", "pod", "source"),
    [
        ("workload:0b1c", True, "serve-0", "pod:0b1c"),  # a verified pod: its UID
        ("workload:0b1c", True, "renamed", "pod:0b1c"),  # the name does not matter
        ("3fa2c1d0e9b8", False, "serve-0", "token:3fa2c1d0e9b8/prod-east/serve-0"),
        ("3fa2c1d0e9b8", False, "invented-7", "token:3fa2c1d0e9b8/prod-east/invented-7"),
        (None, False, "serve-0", "name:prod-east/serve-0"),  # a row from before askers
        (None, False, None, "name:prod-east/?"),
    ],
)
def test_the_source_of_a_report(
    principal: str | None, verified: bool, pod: str | None, source: str
) -> None:
    assert evidence_source(principal, verified, "prod-east", pod) == source


@pytest.mark.parametrize("pod", ["serve-0", "invented-7", None])
def test_per_token_counts_a_static_token_once(pod: str | None) -> None:
    got = evidence_source("3fa2c1d0e9b8", False, "prod-east", pod, "per_token")
    assert got == "token:3fa2c1d0e9b8"
    assert evidence_source("workload:0b1c", True, "prod-east", pod, "per_token") == "pod:0b1c"


@pytest.mark.parametrize(
    ("sources", "count"),
    [
        ([], EvidenceCount(0, 0)),
        (["pod:a", "pod:b", "pod:a"], EvidenceCount(2, 0)),
        (["token:t1", "token:t1", "token:t1"], EvidenceCount(0, 1)),
        (["pod:a", "token:t1", "name:c/p"], EvidenceCount(1, 2)),
    ],
)
def test_sources_are_counted_once_each_by_kind(sources: list[str], count: EvidenceCount) -> None:
    assert count_sources(sources) == count


SLOW_OVERRIDE = Override.model_validate(
    {
        "cluster": "*",
        "force": "CUDNN",
        "note": "n",
        "revision": 1,
        "created_at": datetime.now(UTC).isoformat(),
        "created_by": "t",
        "rollout": {"id": "r", "percent": 20, "max_slowdown_pct": 5},
    }
)


@pytest.mark.parametrize(
    ("tokens", "halts"),
    [
        ({"p1": "token:t1", "p2": "token:t1", "p3": "token:t1"}, False),  # one token, 3 pods
        ({"p1": "token:t1", "p2": "token:t2", "p3": "token:t2"}, True),  # two tokens
        ({"p1": "pod:u1", "p2": "pod:u2", "p3": "pod:u2"}, True),  # two verified pods
    ],
)
def test_a_slowdown_needs_two_sources_on_each_side(tokens: dict[str, str], halts: bool) -> None:
    def samples(backend: str) -> list[tuple[str, str, float]]:
        speed = 400.0 if backend == "CUDNN" else 600.0
        return [("prod-east", p, speed + i) for i, p in enumerate(tokens)]

    found = rollouts.slowdown(SLOW_OVERRIDE, "CUDNN", "FLASH_ATTN", samples, lambda c, p: tokens[p])
    assert (found is not None) == halts
    if found is not None:
        assert found.staged_sources.total == 2
        assert "static source(s)" in found.reason(5.0)


# ------------------------------------------------------------------ over HTTP

PROD_GUARD = {**FORCE, "rollout": {"percent": 20, "max_failures": 3, "guard_clusters": ["prod-*"]}}


@pytest.fixture(params=["per_pod", "per_token"])
def api(sqlite_url: str, request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    with make_inprocess_client(sqlite_url, guard_static_sources=request.param) as client:  # type: ignore[attr-defined]
        client.headers["Authorization"] = f"Bearer {ADMIN}"
        client.static_sources = request.param  # type: ignore[attr-defined]
        yield client


def test_a_static_token_inventing_pods(api: httpx.Client) -> None:
    """By default each pod name a static token recorded a decision for is one source,
    and the halt says they are static; ``per_token`` counts the token once."""
    assert api.put("/v1/overrides/*", json=PROD_GUARD).status_code == 200
    east = agent(api, ["prod-east"])
    # the attack: three invented stage pods, a decision and a failure each
    for _, answer in stage_pods(east, "prod-east", 3):
        fail(east, answer)
    state = rollout(api)
    if api.static_sources == "per_pod":  # type: ignore[attr-defined]
        assert state["state"] == "halted" and state["failures"] == 3, state
        assert state["evidence"] == {"verified_pods": 0, "static_sources": 3}
        assert "(0 verified pod(s), 3 static source(s))" in state["halted_reason"]
        return
    assert state["state"] == "active", state
    assert state["failures"] == 1 and len(state["failed_pods"]) == 1
    assert state["evidence"] == {"verified_pods": 0, "static_sources": 1}
    # nor may it report on a decision another token asked for
    [(_, theirs)] = stage_pods(agent(api, ["prod-east"]), "prod-east", 1, start=400)
    r = east.post(
        f"/v1/selections/{theirs['decision_id']}/failure",
        json={"backend": theirs["backend"], "error": "forged"},
    )
    assert r.status_code == 403 and r.json()["detail"]["field"] == "decision_id", r.text
    # two more tokens (other deployments, say) are two more sources: halted
    for cluster in ("prod-west", "prod-north"):
        other = agent(api, [cluster])
        [(_, answer)] = stage_pods(other, cluster, 1)
        fail(other, answer)
    state = rollout(api)
    assert state["state"] == "halted" and state["failures"] == 3, state
    assert state["evidence"] == {"verified_pods": 0, "static_sources": 3}
    assert "(0 verified pod(s), 3 static source(s))" in state["halted_reason"]


@pytest.fixture(scope="module")
def issuer() -> Iterator[TestIssuer]:
    yield from TestIssuer.serving()


def test_verified_pods_count_once_per_uid(issuer: TestIssuer, sqlite_url: str) -> None:
    issuers = [{"clusters": ["prod-*"], "issuer": issuer.url, "audience": AUDIENCE}]
    with make_inprocess_client(sqlite_url, workload_issuers=issuers) as app:  # type: ignore[attr-defined]
        app.headers["Authorization"] = f"Bearer {ADMIN}"
        assert app.put("/v1/overrides/*", json=PROD_GUARD).status_code == 200
        failed: list[str] = []
        for i in range(200):
            pod = f"serve-{i}"
            token = {"Authorization": f"Bearer {issuer.token(pod, pod_uid=str(uuid.uuid4()))}"}
            r = app.post("/v1/select", json=body(cluster="prod-east", pod=pod), headers=token)
            assert r.status_code == 200, r.text
            answer: dict[str, Any] = r.json()
            if not any((o.get("rollout") or {}).get("in_stage") for o in answer["overrides"]):
                continue
            for _ in range(2):  # a pod reporting again is still one source
                r = app.post(
                    f"/v1/selections/{answer['decision_id']}/failure",
                    json={"backend": answer["backend"], "error": "RuntimeError: boom"},
                    headers=token,
                )
                assert r.status_code == 202, r.text
            failed.append(pod)
            state = rollout(app)
            if len(failed) < 3:
                assert state["state"] == "active" and state["failures"] == len(failed), state
            else:
                break
        assert state["state"] == "halted", state
        assert state["evidence"] == {"verified_pods": 3, "static_sources": 0}
        # what it counted is pods' UIDs, never a body's names
        assert all(s.startswith("pod:") for s in state["failure_sources"])


# ------------------------------------------------------------------ two replicas


def test_a_step_on_another_replica_waits_for_an_unevaluated_guard(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica A stores a failure but cannot write its guard's halt (its database
    connection fails); replica B, on the same database, must not promote past it: the
    evaluation is noted in the database, B's step waits for it, and once A's grace is
    over B runs it itself and halts the rollout."""
    from sqlalchemy.exc import OperationalError

    spec = {**FORCE, "rollout": {"percent": 20, "steps": [20, 50], "step_every": "1h"}}
    settings = {"rollout_check_s": 3600.0}  # the rounds are run by hand below
    with (
        make_inprocess_client(sqlite_url, **settings) as a,  # type: ignore[attr-defined]
        make_inprocess_client(sqlite_url, **settings) as b,  # type: ignore[attr-defined]
    ):
        assert a.put("/v1/overrides/*", json=spec).status_code == 200
        [(_, answer)] = stage_pods(a, "prod-east", 1)
        guards_a = a.app.state.runtime.rollouts  # type: ignore[attr-defined]
        guards_b = b.app.state.runtime.rollouts  # type: ignore[attr-defined]

        def away(*args: object, **kwargs: object) -> None:
            raise OperationalError("UPDATE overrides", {}, Exception("connection reset"))

        monkeypatch.setattr(guards_a.config, "update_rollout", away)
        r = a.post(
            f"/v1/selections/{answer['decision_id']}/failure",
            json={"backend": answer["backend"], "error": "RuntimeError: boom"},
        )
        assert r.status_code == 202 and r.json()["guard"] == "pending", r.text
        guards_b.live.reload()
        due = datetime.now(UTC) + timedelta(hours=2)  # the step is long due
        guards_b.check(due)
        state = rollout(b)
        assert (state["state"], state["percent"]) == ("active", 20), state  # B waited
        guards_b.notes.grace_s = 0.0  # A's grace is over (it may have died)
        guards_b.check(due)
        state = rollout(b)
        assert (state["state"], state["percent"]) == ("halted", 20), state
        assert guards_b.notes.store.count() == 0


def test_a_steady_stream_of_reports_does_not_hold_a_step_back(sqlite_url: str) -> None:
    """Guard evaluations noted after a step came due (reports of a busy fleet, always a
    few in flight) never hold the step back; one noted before it came due (a report of
    the stage that is ending) does, until it is judged."""
    spec = {**FORCE, "rollout": {"percent": 20, "steps": [20, 50, 100], "step_every": "1h"}}
    with make_inprocess_client(sqlite_url, rollout_check_s=3600.0) as app:  # type: ignore[attr-defined]
        assert app.put("/v1/overrides/*", json=spec).status_code == 200
        guards = app.app.state.runtime.rollouts  # type: ignore[attr-defined]
        started = datetime.fromisoformat(rollout(app)["stage_started_at"])
        due_at = started + timedelta(hours=1)
        # a report in flight at every moment after the step came due
        for i in range(20):
            noted = due_at + timedelta(seconds=1 + i)
            guards.notes.store.add(f"measurements:stream-{i}", "measurements", "{}", noted)
        guards.check(due_at + timedelta(seconds=30))
        assert rollout(app)["percent"] == 50, "promoted past the stream"
        for i in range(20):  # judged meanwhile
            guards.notes.done(f"measurements:stream-{i}")

        # a report noted before the next step came due holds it until judged
        due_at = datetime.fromisoformat(rollout(app)["stage_started_at"]) + timedelta(hours=1)
        guards.notes.store.add("measurements:late", "measurements", "{}", due_at)
        guards.check(due_at + timedelta(seconds=30))
        assert rollout(app)["percent"] == 50, "waits for the stage's own report"
        guards.notes.done("measurements:late")
        guards.check(due_at + timedelta(seconds=31))
        assert rollout(app)["percent"] == 100
