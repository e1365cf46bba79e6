"""Rollout guards count distinct stage pods, of the clusters allowed to halt the rollout,
decided (or measured) in the current stage: a low-privilege agent cannot halt a
fleet-wide rollout by repeating one pod's report, by reporting from a sandbox cluster the
rollout does not trust, or by replaying a decision or samples from before the last
resume or step; and what a guard reads per report does not grow with the history."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from mla_switchboard.core.evidence import Observation, situation_of
from mla_switchboard.core.schemas import MeasurementReport, SelectRequest
from mla_switchboard.core.stages import stage_bucket, stage_buckets
from mla_switchboard.service.runtime import Runtime

from tests.conftest import ADMIN, make_inprocess_client
from tests.reliability.conftest import wait_until
from tests.service.test_select_decisions import ALL, body

FORCE = {"force": "FLASHINFER", "note": "INC-1 try flashinfer"}
Pod = tuple[str, dict[str, Any]]  # "cluster/pod" and the answer it got


@pytest.fixture
def api(sqlite_url: str) -> Iterator[httpx.Client]:
    """The app with its rollout checker left to the tests (``restart_stage`` runs it):
    a step due 1 s after its stage began must not come while a loaded machine is still
    setting up the stage before it."""
    app = make_inprocess_client(sqlite_url, rollout_check_s=3600)
    with app as client:  # type: ignore[attr-defined]
        client.headers["Authorization"] = f"Bearer {ADMIN}"
        yield client


def agent(api: httpx.Client, clusters: list[str]) -> httpx.Client:
    """A client of the same in-process app with an agent token limited to ``clusters``."""
    r = api.post("/v1/tokens", json={"name": "dev-agent", "role": "agent", "clusters": clusters})
    assert r.status_code == 201, r.text
    return httpx.Client(
        transport=api._transport,
        base_url=str(api.base_url),
        headers={"Authorization": f"Bearer {r.json()['token']}"},
    )


def own_source(
    api: httpx.Client, where: str, measured: bool = False
) -> tuple[httpx.Client, dict[str, Any]]:
    """A stage pod ("cluster/pod") asking again under a token of its own, and the answer:
    one token is one evidence source for the guards, however many pods it names."""
    cluster, pod = where.split("/", 1)
    c = agent(api, [cluster])
    if measured:
        return c, measured_pod(c, cluster, pod)
    r = c.post("/v1/select", json=body(cluster=cluster, pod=pod))
    assert r.status_code == 200, r.text
    return c, r.json()


def stage_pods(c: httpx.Client, cluster: str, n: int, start: int = 0) -> list[Pod]:
    """``n`` pods of ``cluster`` that the rollout's stage holds, with their answers."""
    found: list[Pod] = []
    for i in range(start, start + 400):
        name = f"{cluster}-{i}"
        r = c.post("/v1/select", json=body(cluster=cluster, pod=name))
        assert r.status_code == 200, r.text
        answer = r.json()
        if any((o.get("rollout") or {}).get("in_stage") for o in answer["overrides"]):
            found.append((f"{cluster}/{name}", answer))
            if len(found) == n:
                return found
    raise AssertionError(f"fewer than {n} of 400 pods in the stage")


def fail(c: httpx.Client, answer: dict[str, Any]) -> None:
    r = c.post(
        f"/v1/selections/{answer['decision_id']}/failure",
        json={"backend": answer["backend"], "error": "RuntimeError: illegal memory access"},
    )
    assert r.status_code == 202, r.text


def rollout(api: httpx.Client) -> dict[str, Any]:
    r = api.get("/v1/overrides/*")
    assert r.status_code == 200, r.text
    return r.json()["rollout"]


def test_one_pods_repeated_reports_count_once(api: httpx.Client) -> None:
    r = api.put("/v1/overrides/*", json={**FORCE, "rollout": {"percent": 20, "max_failures": 3}})
    assert r.status_code == 200, r.text
    [(where, _)] = stage_pods(api, "dev-a", 1)
    dev, answer = own_source(api, where)
    for _ in range(5):
        fail(dev, answer)
    state = rollout(api)
    assert (state["state"], state["failures"], state["failed_pods"]) == ("active", 1, [where])
    # two more distinct stage pods (each its own source) reach max_failures 3: halted,
    # and the reason (also in the audit entry) names every pod and its cluster
    others = stage_pods(api, "dev-b", 2)
    for other, _ in others:
        fail(*own_source(api, other))
    state = rollout(api)
    assert state["state"] == "halted" and state["failures"] == 3
    assert state["evidence"] == {"verified_pods": 0, "static_sources": 3}
    assert "3 evidence source(s) (0 verified pod(s), 3 static source(s))" in state["halted_reason"]
    assert "(clusters dev-a, dev-b)" in state["halted_reason"]
    assert all(w in state["halted_reason"] for w in [where, *(w for w, _ in others)])
    (entry,) = api.get("/v1/audit", params={"action": "rollout.failure", "limit": 1}).json()[
        "items"
    ]
    assert entry["after"]["rollout"]["halted_reason"] == state["halted_reason"]


def test_guard_clusters_keep_a_sandbox_from_halting_the_fleet(api: httpx.Client) -> None:
    spec = {**FORCE, "rollout": {"percent": 20, "max_failures": 1, "guard_clusters": ["prod-*"]}}
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    dev = agent(api, ["dev-*"])
    for _, answer in stage_pods(dev, "dev-a", 3):
        fail(dev, answer)
    assert rollout(api)["state"] == "active"  # dev pods cannot halt it
    [(_, prod)] = stage_pods(api, "prod-east", 1)
    fail(api, prod)
    assert rollout(api)["state"] == "halted"


def test_a_decision_from_before_the_resume_does_not_count(api: httpx.Client) -> None:
    spec = {**FORCE, "rollout": {"percent": 20, "max_failures": 1}}
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    [(_, old)] = stage_pods(api, "prod-east", 1)
    fail(api, old)
    assert rollout(api)["state"] == "halted"
    assert api.put("/v1/overrides/*", json=spec).status_code == 200  # resume: a new stage
    assert rollout(api)["state"] == "active"
    fail(api, old)  # the same pre-resume decision, reported again
    state = rollout(api)
    assert state["state"] == "active" and state["failures"] == 0
    [(_, new)] = stage_pods(api, "prod-east", 1, start=400)  # a decision of this stage
    fail(api, new)
    assert rollout(api)["state"] == "halted"


def test_guard_clusters_are_checked_like_every_cluster_glob(api: httpx.Client) -> None:
    bad = {**FORCE, "rollout": {"percent": 20, "guard_clusters": []}}
    r = api.put("/v1/overrides/*", json=bad)
    assert r.status_code == 422 and "guard_clusters" in str(r.json()["detail"][0]["loc"])
    bad["rollout"]["guard_clusters"] = ["Prod East"]  # type: ignore[index]
    assert api.put("/v1/overrides/*", json=bad).status_code == 422


def test_halt_resume_and_promote_by_hand(api: httpx.Client) -> None:
    spec = {**FORCE, "rollout": {"percent": 10, "steps": [10, 50, 100], "step_every": "1h"}}
    r = api.put("/v1/overrides/*", json=spec)
    etag = r.headers["ETag"]
    stage_pods(api, "prod-east", 3)

    def act(body: dict[str, Any], **params: Any) -> httpx.Response:
        return api.post("/v1/overrides/*/rollout", json=body, params=params)

    # the confirmation's dry run: what would change, nothing changed
    dry = act({"action": "halt", "note": "INC-2 looks wrong"}, dry_run="true")
    assert dry.status_code == 200 and dry.json()["rollout"]["state"] == "halted"
    assert dry.json()["preview"]["pods_changed"] >= 3  # the stage pods go back
    assert rollout(api)["state"] == "active"
    # If-Match: a stale view is refused
    r = api.post(
        "/v1/overrides/*/rollout",
        json={"action": "halt", "note": "INC-2"},
        headers={"If-Match": '"override-*-999"'},
    )
    assert r.status_code == 412 and r.json()["detail"]["current_etag"] == etag
    r = api.post(
        "/v1/overrides/*/rollout", json={"action": "halt", "note": "x"}, headers={"If-Match": etag}
    )
    assert r.status_code == 200 and rollout(api)["state"] == "halted"
    assert "halted by bootstrap-admin: x" in rollout(api)["halted_reason"]
    # impossible actions say why
    r = act({"action": "halt", "note": "again"})
    assert r.status_code == 409 and "only an active rollout" in r.json()["detail"]["message"]
    r = act({"action": "promote", "note": "go"})
    assert r.status_code == 409 and "resume it" in r.json()["detail"]["message"]
    assert act({"action": "resume", "note": "fixed"}).status_code == 200
    r = act({"action": "promote", "note": "go"})  # to the next step
    assert r.status_code == 200 and r.json()["override"]["rollout"]["percent"] == 50
    r = act({"action": "promote", "note": "all", "percent": 100})
    assert r.json()["override"]["rollout"]["state"] == "complete"
    actions = [e["action"] for e in api.get("/v1/audit", params={"limit": 5}).json()["items"]]
    assert actions[:4] == ["rollout.promote", "rollout.promote", "rollout.resume", "rollout.halt"]
    r = act({"action": "halt", "note": "x", "percent": 20})
    assert r.status_code == 422
    assert (
        api.post("/v1/overrides/nowhere/rollout", json={"action": "halt", "note": "x"}).status_code
        == 404
    )


# ------------------------------------------------------- the stage clock of every guard

SLOW = {"force": "CUDNN", "note": "INC-3 try cudnn"}
DEVICE = {"name": "NVIDIA H200", "capability": [9, 0]}
RESTARTS = ["put", "resume", "step"]


def measured_pod(c: httpx.Client, cluster: str, pod: str) -> dict[str, Any]:
    payload = body(cluster=cluster, pod=pod, packages=ALL)
    payload["device"] = DEVICE
    r = c.post("/v1/select", json=payload)
    assert r.status_code == 200, r.text
    return r.json()


def measured_stage_pods(c: httpx.Client, cluster: str, n: int) -> list[tuple[str, dict[str, Any]]]:
    """``n`` stage pods decided for a situation their benchmarks count in."""
    found = []
    for i in range(400):
        answer = measured_pod(c, cluster, f"{cluster}-{i}")
        if any((o.get("rollout") or {}).get("in_stage") for o in answer["overrides"]):
            found.append((f"{cluster}-{i}", answer))
            if len(found) == n:
                return found
    raise AssertionError(f"fewer than {n} of 400 pods in the stage")


def report(c: httpx.Client, cluster: str, pod: str, **extra: Any) -> httpx.Response:
    """Two samples each: CUDNN (what the override gives) a third slower than FLASH_ATTN."""
    r = c.post(
        "/v1/measurements",
        json={
            "cluster": cluster,
            "pod": pod,
            "device": DEVICE,
            "model": body()["model"],
            "dtype": "bfloat16",
            "packages": ALL,
            "results": [
                {"backend": b, "shape": {"seqlens": [4096], "num_heads": 128},
                 "median_ms": 1.0, "tflops": t + k, "correct": True}
                for b, t in (("CUDNN", 400.0), ("FLASH_ATTN", 600.0)) for k in range(2)
            ],
            **extra,
        },
    )  # fmt: skip
    assert r.status_code in (200, 201), r.text
    return r


def restart_stage(api: httpx.Client, how: str, spec: dict[str, Any]) -> None:
    """A new stage: the admin writes the rollout again, resumes it, or a step passes."""
    if how == "put":
        assert api.put("/v1/overrides/*", json=spec).status_code == 200
    elif how == "resume":
        r = api.post("/v1/overrides/*/rollout", json={"action": "resume", "note": "fixed"})
        assert r.status_code == 200, r.text
    else:  # due 1 s after the stage began: the checker's round promotes it then
        rollouts = api.app.state.runtime.rollouts  # type: ignore[attr-defined]

        def stepped() -> bool:
            rollouts.check()
            return bool(rollout(api)["percent"] == 50)

        wait_until(stepped, 10, what="the automatic step")
    assert rollout(api)["state"] == "active"


def staged_spec(how: str, **guard: Any) -> dict[str, Any]:
    steps = {"steps": [20, 50], "step_every": "1s"} if how == "step" else {}
    return {**SLOW, "rollout": {"percent": 20, **guard, **steps}}


@pytest.mark.parametrize("how", RESTARTS)
def test_samples_from_before_the_stage_do_not_count(api: httpx.Client, how: str) -> None:
    spec = staged_spec(how, max_slowdown_pct=5)
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    pods = [pod for pod, _ in measured_stage_pods(api, "prod-east", 4)]
    own = {pod: own_source(api, f"prod-east/{pod}", measured=True)[0] for pod in pods}
    if how == "step":
        report(own[pods[0]], "prod-east", pods[0])  # one pod: not enough, and the step comes
    else:
        report(own[pods[0]], "prod-east", pods[0])
        report(own[pods[1]], "prod-east", pods[1])  # two pods a third slower: halted
        assert rollout(api)["state"] == "halted"
    restart_stage(api, how, spec)
    # a stage pod reports the same slowdown again: with what was measured before the
    # stage began that would be enough at once; alone it is one pod of this stage
    answer = report(own[pods[2]], "prod-east", pods[2])
    assert rollout(api)["state"] == "active"
    assert answer.json()["guard"] == "checked"
    report(own[pods[3]], "prod-east", pods[3])  # a second pod of this stage: halted
    state = rollout(api)
    assert state["state"] == "halted", state
    assert f"prod-east/{pods[2]}" in state["halted_reason"]
    assert f"prod-east/{pods[0]}" not in state["halted_reason"]
    assert "(4 samples from 2 pods" in state["halted_reason"]


@pytest.mark.parametrize("how", ["resume", "step"])
def test_a_failure_decided_before_the_stage_does_not_count(api: httpx.Client, how: str) -> None:
    spec = staged_spec(how, max_failures=2 if how == "step" else 1)
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    (_, old), (_, older) = stage_pods(api, "prod-east", 2)
    fail(api, old)
    if how == "resume":
        assert rollout(api)["state"] == "halted"
    restart_stage(api, how, spec)
    fail(api, old)  # the same decision's failure again, and another old decision's
    fail(api, older)
    state = rollout(api)
    assert state["state"] == "active" and state["failures"] == 0, state
    fresh = stage_pods(api, "prod-east", 2, start=400)  # decisions of this stage
    for where, _ in fresh[: spec["rollout"]["max_failures"]]:
        fail(*own_source(api, where))
    assert rollout(api)["state"] == "halted"


def test_a_slowdown_halt_names_its_pods_and_clusters_in_the_audit_log(api: httpx.Client) -> None:
    spec = {**SLOW, "rollout": {"percent": 20, "max_slowdown_pct": 5}}
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    east = measured_stage_pods(api, "prod-east", 1)[0][0]
    west = measured_stage_pods(api, "prod-west", 1)[0][0]
    report(own_source(api, f"prod-east/{east}", measured=True)[0], "prod-east", east)
    report(own_source(api, f"prod-west/{west}", measured=True)[0], "prod-west", west)
    state = rollout(api)
    assert state["state"] == "halted"
    reason = state["halted_reason"]
    assert f"prod-east/{east}" in reason and f"prod-west/{west}" in reason
    assert "clusters prod-east, prod-west" in reason
    (entry,) = api.get("/v1/audit", params={"action": "rollout.slowdown"}).json()["items"]
    assert entry["actor"] == "switchboard" and entry["note"] == reason
    assert entry["after"]["rollout"]["halted_reason"] == reason


def test_a_halt_another_replica_stored_first_shows_in_this_replicas_reads_at_once(
    sqlite_url: str,
) -> None:
    """Two replicas' guards call for the same halt (one runs a report the other noted
    and left): the one that finds the halt already stored must show it in its own
    reads from then on, not only after its next poll of the configuration (an hour
    away here). The evaluation runs as a retried report's does once it has read the
    stored reports: the other replica's halt is stored in between."""
    from mla_switchboard.core.schemas import Rollout
    from mla_switchboard.service.store.config import ConfigStore
    from sqlalchemy import create_engine

    spec = {**SLOW, "rollout": {"percent": 20, "max_slowdown_pct": 5}}
    settings = {"rollout_check_s": 3600, "config_poll_s": 3600}
    with make_inprocess_client(sqlite_url, **settings) as api:  # type: ignore[attr-defined]
        api.headers["Authorization"] = f"Bearer {ADMIN}"
        assert api.put("/v1/overrides/*", json=spec).status_code == 200
        east = measured_stage_pods(api, "prod-east", 1)[0][0]
        west = measured_stage_pods(api, "prod-west", 1)[0][0]
        report(own_source(api, f"prod-east/{east}", measured=True)[0], "prod-east", east)
        assert rollout(api)["state"] == "active"  # one pod's figures do not halt it
        runtime: Runtime = api.app.state.runtime
        payload = {**body(cluster="prod-west", pod=west, packages=ALL), "device": DEVICE}
        situation = situation_of(SelectRequest.model_validate(payload))
        assert situation is not None
        now = datetime.now(UTC)
        runtime.evidence_sync.apply_local(
            [
                Observation(situation, b, west, t + k, ok=True, cluster="prod-west", at=now)
                for b, t in (("CUDNN", 400.0), ("FLASH_ATTN", 600.0))
                for k in range(2)
            ]
        )

        def halted(current: Rollout) -> Rollout:
            return current.model_copy(update={"state": "halted", "halted_reason": "elsewhere"})

        other = create_engine(sqlite_url)  # the other replica's writer, on the same store
        try:
            stored = ConfigStore(other).update_rollout(
                "*", rollout(api)["id"], halted, actor="switchboard", action="rollout.slowdown",
                note="halted by the other replica",
            )  # fmt: skip
        finally:
            other.dispose()
        assert stored is not None and rollout(api)["state"] == "active"  # not polled yet
        west_report = MeasurementReport.model_validate(
            {
                **{k: payload[k] for k in ("cluster", "pod", "device", "model", "dtype")},
                "packages": ALL,
                "results": [
                    {"backend": "CUDNN", "shape": {"seqlens": [4096], "num_heads": 128},
                     "median_ms": 1.0, "tflops": 400.0, "correct": True}
                ],
            }
        )  # fmt: skip
        runtime.rollouts.on_measurements(west_report)  # calls for the halt: already stored
        state = rollout(api)
        assert (state["state"], state["halted_reason"]) == ("halted", "elsewhere")


# ------------------------------------------------------------------ growth


def _guard_with_history(c: httpx.Client, history: int) -> Callable[[], None]:
    """A 20 % rollout of ``*``; ``history`` samples in the stage pods' situation from
    before the stage and from pods outside it (in prod-east and 9 other clusters);
    2 stage pods' 8 samples since the stage began, at every size. Gives one report's
    guard evaluation (what ``POST /v1/measurements`` runs)."""
    spec = {**SLOW, "rollout": {"percent": 20, "max_slowdown_pct": 5}}
    r = c.put("/v1/overrides/*", json=spec)
    assert r.status_code == 200, r.text
    state = r.json()["override"]["rollout"]
    runtime: Runtime = c.app.state.runtime  # type: ignore[attr-defined]
    (o,) = runtime.publisher.current().overrides
    assert o.rollout is not None
    buckets = stage_buckets(o.rollout)
    started = datetime.fromisoformat(state["stage_started_at"])
    payload = body(cluster="prod-east", pod="x", packages=ALL)
    payload["device"] = DEVICE
    situation = situation_of(SelectRequest.model_validate(payload))
    assert situation is not None
    batch: list[Observation] = []
    for i in range(history):
        cluster, pod = f"prod-{i % 10}" if i % 10 else "prod-east", f"old-{i // 8}"
        inside = stage_bucket(cluster, pod) in buckets
        at = started - timedelta(hours=1) if inside else started + timedelta(seconds=1)
        backend = "CUDNN" if i % 2 else "FLASH_ATTN"
        batch.append(Observation(situation, backend, pod, 500.0, ok=True, cluster=cluster, at=at))
        if len(batch) == 1024:
            runtime.evidence_sync.apply_local(batch)
            batch = []
    runtime.evidence_sync.apply_local(batch)
    stage = [pod for pod, _ in measured_stage_pods(c, "prod-east", 2)]
    now = datetime.now(UTC)
    runtime.evidence_sync.apply_local(
        [
            Observation(situation, b, pod, 500.0 + k, ok=True, cluster="prod-east", at=now)
            for pod in stage
            for b in ("CUDNN", "FLASH_ATTN")
            for k in range(2)
        ]
    )
    measured = MeasurementReport.model_validate(
        {
            **{k: payload[k] for k in ("cluster", "device", "model", "dtype", "packages")},
            "pod": stage[0],
            "results": [
                {"backend": "CUDNN", "shape": {"seqlens": [4096], "num_heads": 128},
                 "median_ms": 1.0, "tflops": 500.0, "correct": True}
            ],
        }
    )  # fmt: skip

    def evaluate() -> None:
        runtime.rollouts.on_measurements(measured)
        assert runtime.publisher.current().overrides[0].rollout.state == "active"  # type: ignore[union-attr]

    return evaluate


@pytest.mark.serial
def test_a_guard_costs_the_same_at_10x_the_evidence(tmp_path: Any) -> None:
    """6,400 and 64,000 samples of history in the situation: a report's guard costs the
    same (thread CPU time of 10 evaluations, median of 9 runs, the sizes alternating).
    Walking and hashing every sample of the situation, as the guard did, costs 10x."""
    small = make_inprocess_client(f"sqlite:///{tmp_path / 'small.db'}")
    large = make_inprocess_client(f"sqlite:///{tmp_path / 'large.db'}")
    with small as cs, large as cl:  # type: ignore[attr-defined]
        for c in (cs, cl):
            c.headers["Authorization"] = f"Bearer {ADMIN}"
        operations = {
            "small": _guard_with_history(cs, 6_400),
            "large": _guard_with_history(cl, 64_000),
        }
        runs: dict[str, list[float]] = {"small": [], "large": []}
        for _ in range(9):
            for size, evaluate in operations.items():
                began = time.thread_time()
                for _ in range(10):
                    evaluate()
                runs[size].append(time.thread_time() - began)
    small_s, large_s = statistics.median(runs["small"]), statistics.median(runs["large"])
    print(
        f"10 guard evaluations: {small_s * 1e3:.1f} ms at 6,400, {large_s * 1e3:.1f} ms at 64,000"
    )
    assert large_s < 2 * small_s, (small_s, large_s)


def test_progress_splits_each_clusters_own_samples_by_stage(api: httpx.Client) -> None:
    """The rollout progress reads each cluster's own samples and splits them by the
    stage buckets stored with them: another cluster's figures never mix in."""
    spec = {**SLOW, "rollout": {"percent": 20, "max_slowdown_pct": 99}}
    assert api.put("/v1/overrides/prod-east", json=spec).status_code == 200
    (inside, _), *_ = measured_stage_pods(api, "prod-east", 1)
    outside = next(
        f"prod-east-out-{i}"
        for i in range(400)
        if not any(
            (o.get("rollout") or {}).get("in_stage")
            for o in measured_pod(api, "prod-east", f"prod-east-out-{i}")["overrides"]
        )
    )
    measured_pod(api, "prod-west", "w-0")

    def measure(cluster: str, pod: str, backend: str, *tflops: float) -> None:
        r = api.post(
            "/v1/measurements",
            json={
                "cluster": cluster, "pod": pod, "device": DEVICE, "model": body()["model"],
                "dtype": "bfloat16", "packages": ALL,
                "results": [{"backend": backend, "median_ms": 1.0, "tflops": t,
                             "shape": {"seqlens": [4096], "num_heads": 128}, "correct": True}
                            for t in tflops],
            },
        )  # fmt: skip
        assert r.status_code == 201 and r.json()["counted"], r.text

    measure("prod-east", inside, "CUDNN", 400.0, 401.0)  # what the stage runs
    measure("prod-east", outside, "FLASH_ATTN", 610.0)  # what the rest runs
    measure("prod-west", "w-0", "CUDNN", 900.0)  # another cluster, outside the scope
    measure("prod-west", "w-0", "FLASH_ATTN", 100.0)
    (entry,) = api.get("/v1/selections/summary").json()["rollouts"]
    assert entry["cluster"] == "prod-east"
    assert (entry["stage_median_tflops"], entry["rest_median_tflops"]) == (400.5, 610.0), entry


def test_a_deferred_guard_waits_for_the_database_and_a_broken_one_is_dropped(
    api: httpx.Client,
) -> None:
    """A guard deferred by a lost connection stays queued, and promotions wait for it;
    one that fails for another reason is dropped, so it cannot hold every later
    promotion back."""
    from sqlalchemy.exc import IntegrityError, OperationalError

    guards = api.app.state.runtime.rollouts  # type: ignore[attr-defined]
    database_away = [True]
    runs: list[str] = []

    def flaky() -> None:
        runs.append("flaky")
        if database_away[0]:
            raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    def broken() -> None:
        runs.append("broken")
        raise IntegrityError("INSERT", {}, Exception("duplicate key"))

    assert guards._evaluate(("broken",), broken) == "pending"
    assert guards._evaluate(("flaky",), flaky) == "pending"
    assert guards.retry_pending() is False  # broken dropped, flaky still waits
    assert runs == ["broken", "flaky", "broken", "flaky"]
    assert list(guards._pending) == [("flaky",)]
    database_away[0] = False
    assert guards.retry_pending() is True
    assert not guards._pending and runs[-1] == "flaky"
