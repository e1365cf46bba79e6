"""A token limited to some clusters reads nothing of another cluster's pods: no pod or
node name and no error text of theirs, in any read. Where something outside its scope
matters (a fleet-wide rollout halted by pods it cannot see) it is told so, without the
details."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mla_switchboard.core.evaluator import FLEET_HALT_POINTER

from tests.conftest import ADMIN, ServiceProcess, make_inprocess_client
from tests.service.test_measured import ALL, H200, select
from tests.service.test_rollout_guards import agent, fail, rollout, stage_pods
from tests.service.test_select_decisions import R1, body

SECRET = "SECRET-DEV-ERROR"
DEV = "dev-secret-team"
OUTSIDE = "halted by failures in clusters outside your scope"


def _fail_secretly(c: httpx.Client, answer: dict[str, Any]) -> None:
    r = c.post(
        f"/v1/selections/{answer['decision_id']}/failure",
        json={"backend": answer["backend"], "error": f"RuntimeError: {SECRET} in kernel"},
    )
    assert r.status_code == 202, r.text


@pytest.fixture
def api(sqlite_url: str) -> Iterator[httpx.Client]:
    # one pod's failure excludes: what is quoted of an exclusion is the subject here
    with make_inprocess_client(sqlite_url, failure_min_pods=1) as client:  # type: ignore[attr-defined]
        client.headers["Authorization"] = f"Bearer {ADMIN}"
        yield client


def scoped(api: httpx.Client, role: str) -> httpx.Client:
    r = api.post("/v1/tokens", json={"name": f"prod-{role}", "role": role, "clusters": ["prod-*"]})
    assert r.status_code == 201, r.text
    return httpx.Client(
        transport=api._transport,
        base_url=str(api.base_url),
        headers={"Authorization": f"Bearer {r.json()['token']}"},
    )


READS = [
    "/v1/overrides",
    "/v1/overrides/*",
    "/v1/audit",
    "/v1/selections",
    "/v1/selections/summary",
    "/v1/measurements/summary",
    "/v1/pods",
    "/v1/pods/facets",
    "/v1/refusals",
]


def test_a_fleet_rollout_halted_by_dev_pods_shows_prod_only_that_it_was(
    api: httpx.Client,
) -> None:
    spec = {"force": "FLASHINFER", "note": "try it", "rollout": {"percent": 20, "max_failures": 2}}
    assert api.put("/v1/overrides/*", json=spec).status_code == 200
    dev = agent(api, ["dev-*"])
    [(prod_where, prod_answer)] = stage_pods(api, "prod-east", 1)
    fail(api, prod_answer)  # one in-scope failure, then a dev one halts it
    [(dev_where, dev_answer)] = stage_pods(dev, DEV, 1)
    _fail_secretly(dev, dev_answer)
    full = rollout(api)
    assert full["state"] == "halted" and SECRET in full["halted_reason"]  # the fleet admin's view
    assert dev_where in full["failed_pods"]
    # a prod pod's decision after the halt says the rollout is halted
    after = api.post("/v1/select", json=body(cluster="prod-east", pod="prod-late")).json()

    for role in ("viewer", "admin"):
        c = scoped(api, role)
        for path in [*READS, f"/v1/selections/{after['decision_id']}"]:
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
            assert SECRET not in r.text and DEV not in r.text, (role, path, r.text)
        shown = c.get("/v1/overrides/*").json()["rollout"]
        # the caller's own pod named, the other cluster's counted, its error left out
        assert shown["state"] == "halted" and shown["halted_reason"] == (
            f"{OUTSIDE} and in yours: 2 evidence source(s) (0 verified pod(s), 2 static "
            "source(s)) reported a failure of what the rollout gave their stage pods, "
            f"reaching max_failures 2: pods {prod_where} (clusters prod-east) and 1 pod in "
            "clusters outside your scope; latest: a pod in a cluster outside your scope"
        )
        cause = shown["halted_cause"]
        assert cause["kind"] == "failures" and cause["latest"] is None
        assert cause["pods"] == [dict(zip(("cluster", "pod"), prod_where.split("/"), strict=True))]
        assert cause["pods_outside_scope"] == 1
        assert shown["failed_pods"] == [prod_where]
        assert shown["failed_pods_outside_scope"] == 1 and shown["failures"] == 2
        (listed,) = c.get("/v1/overrides").json()["items"]
        assert listed["rollout"] == shown
        (entry,) = c.get("/v1/audit", params={"action": "rollout.failure", "limit": 1}).json()[
            "items"
        ]
        assert entry["target"] == "*"
        assert entry["after"]["rollout"]["halted_reason"] == shown["halted_reason"]
        progress = c.get("/v1/selections/summary").json()["rollouts"]
        assert progress[0]["rollout"]["halted_reason"] == shown["halted_reason"]
        if role == "admin":  # a dry run answers the preview of the caller's own change
            dry = c.put(
                "/v1/overrides/prod-east",
                params={"dry_run": "true"},
                json={"force": "CUDNN", "note": "try"},
            )
            assert dry.status_code == 200 and SECRET not in dry.text and DEV not in dry.text
        # the decision points at the rollout (whose reason is redacted above) rather
        # than quoting it
        detail = c.get(f"/v1/selections/{after['decision_id']}").json()
        assert any(
            m.startswith("The rollout of fleet override (*) rev ")
            and m.endswith(f"is halted ({FLEET_HALT_POINTER}): answered as without it.")
            for m in detail["answer"]["messages"]
        ), detail


def test_measurement_failures_of_other_clusters_are_counted_not_quoted(api: httpx.Client) -> None:
    dev = agent(api, ["dev-*"])
    select(dev, DEV, pod="secret-pod-9")
    r = dev.post(
        "/v1/measurements",
        json={
            "cluster": DEV,
            "pod": "secret-pod-9",
            "device": H200,
            "model": {**R1, "num_heads": 128},
            "dtype": "bfloat16",
            "packages": ALL,
            "results": [
                {
                    "backend": "FLASHINFER",
                    "impl": "test",
                    "shape": {"seqlens": [4096], "num_heads": 128},
                    "correct": False,
                    "error": f"{SECRET}: max abs err 3.1",
                }
            ],
        },
    )
    assert r.status_code == 201 and r.json()["counted"] is True, r.text
    everything = api.get("/v1/measurements/summary")
    assert SECRET in everything.text  # the fleet admin sees whose failure it was
    viewer = scoped(api, "viewer")
    r = viewer.get("/v1/measurements/summary")
    assert SECRET not in r.text and DEV not in r.text and "secret-pod-9" not in r.text
    assert r.headers["ETag"] != everything.headers["ETag"]  # never one cache entry for both
    excluded = [g["excluded"] for g in r.json()["groups"] if g["excluded"]]
    assert excluded and "1 pod in clusters outside your scope" in excluded[0], excluded
    # a 304 only for the ETag it was given
    again = viewer.get("/v1/measurements/summary", headers={"If-None-Match": r.headers["ETag"]})
    assert again.status_code == 304
    other = viewer.get(
        "/v1/measurements/summary", headers={"If-None-Match": everything.headers["ETag"]}
    )
    assert other.status_code == 200
    # a prod pod decided by measurements, with the dev failure excluding a backend
    trusting = {"policy": "measured", "trust_clusters": ["prod-*", "dev-*"], "note": "data"}
    r = api.put("/v1/overrides/prod-east", json=trusting)
    assert r.status_code == 200, r.text
    prod = select(api, "prod-east", pod="prod-measured")
    assert SECRET in api.get(f"/v1/selections/{prod['decision_id']}").text  # prod trusts dev
    assert SECRET in api.get("/v1/selections/summary").text
    for path in (
        "/v1/selections/summary",
        f"/v1/selections/{prod['decision_id']}",
        "/v1/selections",
    ):
        r = viewer.get(path)
        assert SECRET not in r.text and DEV not in r.text, (path, r.text)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, str]]:
    """``switchboard serve`` with a fleet rollout halted by a dev pod, and a prod-*
    viewer's token."""
    d = tmp_path_factory.mktemp("scoped")
    server = ServiceProcess(f"sqlite:///{d / 'sb.db'}").start(d)
    try:
        with server.client() as admin:
            spec = {
                "force": "FLASHINFER",
                "note": "t",
                "rollout": {"percent": 50, "max_failures": 1},
            }
            assert admin.put("/v1/overrides/*", json=spec).status_code == 200
            tokens = {
                role: admin.post(
                    "/v1/tokens", json={"name": role, "role": role, "clusters": [glob]}
                ).json()["token"]
                for role, glob in (("agent", "dev-*"), ("viewer", "prod-*"))
            }
            with server.client(tokens["agent"]) as dev:
                [(_, answer)] = stage_pods(dev, DEV, 1)
                _fail_secretly(dev, answer)
        yield server, tokens["viewer"]
    finally:
        server.stop()


def test_a_served_process_answers_each_scope_its_own_representation(
    served: tuple[ServiceProcess, str],
) -> None:
    """Through ``switchboard serve``: the prod viewer reads that the fleet rollout was
    halted outside its scope; its ETag is its own, so neither caller gets a 304 for
    the other's representation."""
    server, token = served
    with server.client() as admin, server.client(token) as viewer:
        full = admin.get("/v1/overrides/*")
        assert full.json()["rollout"]["state"] == "halted" and SECRET in full.text
        mine = viewer.get("/v1/overrides/*")
        assert mine.json()["rollout"]["halted_reason"] == OUTSIDE, mine.text
        assert mine.json()["rollout"]["failed_pods_outside_scope"] == 1
        assert SECRET not in mine.text and DEV not in mine.text
        assert mine.headers["ETag"] != full.headers["ETag"]
        for etag, status in ((full.headers["ETag"], 200), (mine.headers["ETag"], 304)):
            r = viewer.get("/v1/overrides/*", headers={"If-None-Match": etag})
            assert r.status_code == status and SECRET not in r.text
        audit = viewer.get("/v1/audit", params={"target": "*"})
        assert audit.status_code == 200 and SECRET not in audit.text and DEV not in audit.text


@pytest.mark.browser
def test_the_dashboard_says_the_rollout_was_halted_outside_the_viewers_scope(
    served: tuple[ServiceProcess, str],
) -> None:
    from tests.browser.test_dashboard_browser import (
        TIMEOUT_MS,
        ConsoleErrors,
        _skip_if_missing,
        launch,
        sign_in,
    )

    _skip_if_missing()
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)
    server, token = served
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page()
            errors = ConsoleErrors(page, set())
            page.goto(server.url + "/")
            sign_in(page, token)
            fleet = page.locator('#overrides li.override[data-cluster="*"]')
            expect(fleet).to_have_attribute("data-rollout", "halted")
            expect(fleet.locator(".halted-reason")).to_have_text(OUTSIDE)
            outside = fleet.locator(".failed-pods")
            expect(outside).to_have_text("Tripped by 1 pod in clusters outside your scope")
            expect(outside.locator("button")).to_have_count(0)
            assert DEV not in page.content() and SECRET not in page.content()
            assert not errors, errors
        finally:
            browser.close()
