"""What an agent sends (a pod's name, an error's text) can never change what a caller
limited to other clusters reads: the causes that name pods are stored as data and put
into words for each caller where they leave the service (``core/cause_words.py``,
``service/reads/scope.py``). Each test here is an attack that read another cluster's
pods or errors, or hid the caller's own, while scope was worked out from the words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN, make_inprocess_client
from tests.service.test_measured import ALL, H200, select
from tests.service.test_rollout_guards import (
    SLOW,
    agent,
    fail,
    measured_stage_pods,
    own_source,
    report,
    rollout,
    stage_pods,
)
from tests.service.test_select_decisions import R1, body

SECRET = "SECRET-DEV-ERROR"
FLEET_READS = ["/v1/overrides/*", "/v1/overrides", "/v1/audit", "/v1/selections/summary"]


@pytest.fixture
def api(sqlite_url: str) -> Iterator[httpx.Client]:
    with make_inprocess_client(sqlite_url) as client:  # type: ignore[attr-defined]
        client.headers["Authorization"] = f"Bearer {ADMIN}"
        yield client


def scoped(
    api: httpx.Client, role: str = "viewer", clusters: tuple[str, ...] = ("prod-*",)
) -> httpx.Client:
    r = api.post(
        "/v1/tokens", json={"name": f"scoped-{role}", "role": role, "clusters": list(clusters)}
    )
    assert r.status_code == 201, r.text
    return httpx.Client(
        transport=api._transport,
        base_url=str(api.base_url),
        headers={"Authorization": f"Bearer {r.json()['token']}"},
    )


def _stage_pod_named(c: httpx.Client, cluster: str, name: str) -> tuple[str, dict[str, Any]]:
    for i in range(400):
        pod = f"{name}{i}"
        r = c.post("/v1/select", json=body(cluster=cluster, pod=pod))
        assert r.status_code == 200, r.text
        answer = r.json()
        if any((o.get("rollout") or {}).get("in_stage") for o in answer["overrides"]):
            return pod, answer
    raise AssertionError("no stage pod in 400")


def test_a_pod_named_like_a_list_of_clusters_reveals_nothing(api: httpx.Client) -> None:
    """A dev pod named ``c2 (clusters prod-east, prod-z`` made the halt reason look as
    if it named only prod clusters: a prod viewer read the dev cluster, another dev
    pod and its error."""
    spec = {"force": "FLASHINFER", "note": "try", "rollout": {"percent": 20, "max_failures": 3}}
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    [(_, prod_answer)] = stage_pods(api, "prod-east", 1)
    fail(api, prod_answer)
    dev = agent(api, ["dev-*"])
    [(_, other_answer)] = stage_pods(dev, "dev-hidden", 1)
    fail(dev, other_answer)
    _, tricky = _stage_pod_named(dev, "dev-hidden", "c2 (clusters prod-east, prod-z")
    r = dev.post(
        f"/v1/selections/{tricky['decision_id']}/failure",
        json={"backend": tricky["backend"], "error": f"RuntimeError: {SECRET}"},
    )
    assert r.status_code == 202, r.text
    assert rollout(api)["state"] == "halted"
    viewer = scoped(api)
    for path in FLEET_READS:
        r = viewer.get(path)
        assert r.status_code == 200, (path, r.text)
        for hidden in (SECRET, "dev-hidden", "c2 (clusters"):
            assert hidden not in r.text, (path, hidden, r.text)
    shown = viewer.get("/v1/overrides/*").json()["rollout"]
    assert "2 pods in clusters outside your scope" in shown["halted_reason"]


def test_a_speed_halt_in_the_callers_own_clusters_is_shown_whole(api: httpx.Client) -> None:
    spec = {**SLOW, "rollout": {"percent": 20, "max_slowdown_pct": 5}}
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    east = measured_stage_pods(api, "prod-east", 1)[0][0]
    west = measured_stage_pods(api, "prod-west", 1)[0][0]
    report(own_source(api, f"prod-east/{east}", measured=True)[0], "prod-east", east)
    report(own_source(api, f"prod-west/{west}", measured=True)[0], "prod-west", west)
    full = rollout(api)
    assert full["state"] == "halted"
    viewer = scoped(api)
    shown = viewer.get("/v1/overrides/*").json()["rollout"]
    assert shown["halted_reason"] == full["halted_reason"]
    assert shown["halted_cause"] == {**full["halted_cause"], "pods_outside_scope": 0}
    (entry,) = viewer.get("/v1/audit", params={"action": "rollout.slowdown"}).json()["items"]
    assert entry["note"] == full["halted_reason"]


def test_the_change_stream_tells_a_fleet_halt_in_the_callers_words(api: httpx.Client) -> None:
    spec = {"force": "FLASHINFER", "note": "try", "rollout": {"percent": 20, "max_failures": 1}}
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    viewer = scoped(api)
    with viewer.stream("GET", "/v1/events") as stream:
        lines = stream.iter_lines()
        assert any(line == "event: hello" for line in lines)
        dev = agent(api, ["dev-*"])
        [(_, answer)] = stage_pods(dev, "dev-hidden", 1)
        r = dev.post(
            f"/v1/selections/{answer['decision_id']}/failure",
            json={"backend": answer["backend"], "error": f"RuntimeError: {SECRET}"},
        )
        assert r.status_code == 202, r.text
        halted = None
        for line in lines:
            if line.startswith("data:") and '"halted"' in line:
                halted = json.loads(line[len("data:") :])
                break
    assert halted is not None
    assert halted["halted_reason"] == "halted by failures in clusters outside your scope"
    assert SECRET not in json.dumps(halted) and "dev-hidden" not in json.dumps(halted)


def _measured_failure(c: httpx.Client, cluster: str, pod: str, error: str = SECRET) -> None:
    select(c, cluster, pod=pod)
    r = c.post(
        "/v1/measurements",
        json={
            "cluster": cluster,
            "pod": pod,
            "device": H200,
            "model": {**R1, "num_heads": 128},
            "dtype": "bfloat16",
            "packages": ALL,
            "results": [
                {
                    "backend": "FLASHINFER",
                    "impl": f"impl-{error}",
                    "shape": {"seqlens": [4096], "num_heads": 128},
                    "correct": False,
                    "error": f"{error}: max abs err 3.1",
                }
            ],
        },
    )
    assert r.status_code == 201 and r.json()["counted"] is True, r.text


@pytest.mark.parametrize("other", ["_dev", "dev-b"])
def test_failures_a_cluster_trusts_are_counted_not_quoted(api: httpx.Client, other: str) -> None:
    """A cluster whose name starts with ``_`` went unseen beside a prod pod's failure,
    so the reason was kept whole; an agent's own select answer and dry run quoted the
    other cluster's pods."""
    _measured_failure(agent(api, ["prod-*"]), "prod-east", "prod-failing", "prod-own-error")
    _measured_failure(agent(api, [other]), other, "secret-pod")
    trusting = {"policy": "measured", "trust_clusters": ["*"], "note": "data"}
    assert api.put("/v1/overrides/prod-east", json=trusting).status_code == 200
    prod = select(api, "prod-east", pod="prod-measured")
    assert SECRET in api.get(f"/v1/selections/{prod['decision_id']}").text  # the fleet's admin
    viewer = scoped(api)
    for path in ("/v1/selections/summary", f"/v1/selections/{prod['decision_id']}"):
        r = viewer.get(path)
        assert r.status_code == 200, r.text
        for hidden in (SECRET, other, "secret-pod"):
            assert hidden not in r.text, (path, hidden, r.text)
    summary = viewer.get("/v1/selections/summary").text
    assert "prod-own-error" in summary and "1 pod not named" in summary
    prod_agent = agent(api, ["prod-*"])
    for dry in (False, True):
        payload = body(cluster="prod-east", pod="prod-2", packages=ALL)
        payload["device"] = H200
        r = prod_agent.post("/v1/select", params={"dry_run": str(dry).lower()}, json=payload)
        assert r.status_code == 200, r.text
        for hidden in (SECRET, other, "secret-pod"):
            assert hidden not in r.text, (dry, hidden, r.text)
        excluded = [c for c in r.json()["candidates"] if c["exclusion"]]
        assert excluded and excluded[0]["exclusion"]["pods"] == 2
        assert [q["pod"] for q in excluded[0]["exclusion"]["quoted"]] == ["prod-failing"]
    # its own representation: never the unrestricted one's ETag, and a 304 for its own
    mine = prod_agent.post("/v1/select", json=payload)
    assert mine.headers["ETag"] != api.post("/v1/select", json=payload).headers["ETag"]
    again = prod_agent.post(
        "/v1/select", json=payload, headers={"If-None-Match": mine.headers["ETag"]}
    )
    assert again.status_code == 304 and again.headers["X-Decision-Id"]
    # a strict request for the excluded backend: the refusal quotes no other cluster
    payload = {**payload, "requested_backend": "FLASHINFER", "strict": True}
    refused = prod_agent.post("/v1/select", json=payload)
    assert refused.status_code == 409, refused.text
    assert "prod-failing" in refused.text
    for hidden in (SECRET, other, "secret-pod"):
        assert hidden not in refused.text, (hidden, refused.text)


def test_a_window_of_two_million_hours_is_still_redacted(sqlite_url: str) -> None:
    with make_inprocess_client(  # type: ignore[attr-defined]
        sqlite_url, failure_window_hours=2_000_000, failure_min_pods=1
    ) as api:
        api.headers["Authorization"] = f"Bearer {ADMIN}"
        _measured_failure(agent(api, ["dev-*"]), "dev-hidden", "secret-pod")
        trusting = {"policy": "measured", "trust_clusters": ["*"], "note": "data"}
        assert api.put("/v1/overrides/prod-east", json=trusting).status_code == 200
        prod = select(api, "prod-east", pod="prod-measured")
        viewer = scoped(api)
        for path in ("/v1/selections/summary", f"/v1/selections/{prod['decision_id']}"):
            r = viewer.get(path)
            assert SECRET not in r.text and "dev-hidden" not in r.text, (path, r.text)
        assert "in the last 2000000 h" in viewer.get("/v1/selections/summary").text


def _measured(c: httpx.Client, cluster: str, pod: str, impl: str, tflops: float) -> None:
    select(c, cluster, pod=pod)
    result = {
        "backend": "FLASH_ATTN",
        "impl": impl,
        "shape": {"seqlens": [4096], "num_heads": 128},
        "median_ms": 1.0,
        "tflops": tflops,
        "correct": True,
    }
    r = c.post(
        "/v1/measurements",
        json={
            "cluster": cluster,
            "pod": pod,
            "device": H200,
            "model": {**R1, "num_heads": 128},
            "dtype": "bfloat16",
            "packages": ALL,
            "results": [result, result],
        },
    )
    assert r.status_code == 201 and r.json()["counted"] is True, r.text


def test_the_measurements_summary_shows_a_caller_its_own_clusters_figures(
    api: httpx.Client,
) -> None:
    _measured(agent(api, ["dev-*"]), "dev-hidden", "dev-pod", f"impl-{SECRET}", 900.0)
    _measured(agent(api, ["prod-*"]), "prod-east", "prod-pod", "impl-prod", 300.0)
    everything = api.get("/v1/measurements/summary")
    assert SECRET in everything.text  # the fleet's admin reads every impl
    r = scoped(api).get("/v1/measurements/summary")
    assert r.status_code == 200 and SECRET not in r.text, r.text
    (row,) = [g for g in r.json()["groups"] if g["backend"] == "FLASH_ATTN"]
    assert (row["impls"], row["pods"], row["samples"]) == (["impl-prod"], 1, 2)
    assert row["median_tflops"] == pytest.approx(300.0)


def test_a_preview_quotes_a_scoped_admins_own_pods_only(api: httpx.Client) -> None:
    _measured_failure(agent(api, ["prod-*"]), "prod-east", "prod-failing", "prod-own-error")
    _measured_failure(agent(api, ["dev-*"]), "dev-hidden", "secret-pod")
    payload = body(cluster="prod-east", pod="prod-asks", packages=ALL)
    payload.update(device=H200, requested_backend="FLASHINFER")
    first = api.post("/v1/select", json=payload)
    assert first.status_code == 200 and first.json()["backend"] == "FLASHINFER", first.text
    admin = scoped(api, "admin")
    proposal = {"policy": "measured", "trust_clusters": ["*"], "note": "data"}
    r = admin.put("/v1/overrides/prod-east", params={"dry_run": "true"}, json=proposal)
    assert r.status_code == 200, r.text
    for hidden in (SECRET, "dev-hidden", "secret-pod"):
        assert hidden not in r.text, (hidden, r.text)
    whys = [w for c in r.json()["preview"]["changes"] for x in c["reasons"] for w in x["why"]]
    assert any("prod-own-error" in w and "1 pod not named" in w for w in whys), whys
