"""Guarded rollouts and failure exclusions on the dashboard, in a
real headless Chromium against a real service process seeded through the API.

- Each override shows its rollout: state badge, percent, steps and step_every,
  failures against max_failures; a halted one shows the service's reason (which pod,
  which error), the pods that tripped it, and when it halted: relative, with the UTC
  time on hover (the console's one time format).
- The Rollouts panel shows each staged override's progress from the summary: pods in
  the stage out of the scope (a bar), how many booted with it, failures, and the
  stage's median TFLOP/s against the rest of the scope once both are measured.
- The "Excluded by failures" panel lists, per cluster, the backends failure evidence
  rules out with the full reason, and is not shown while nothing is excluded.
Screenshots land in ``test-artifacts/dashboard-rollouts*.png``.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from mla_switchboard.core.schemas import OverrideSpec, Rollout, rollout_id
from mla_switchboard.core.stages import bucket_in_stage, stage_bucket

from tests.browser.test_dashboard_browser import (
    ALL,
    ARTIFACTS,
    R1,
    TIMEOUT_MS,
    ConsoleErrors,
    _skip_if_missing,
    body,
    make_token,
    sign_in,
)
from tests.chromium import SharedChromium
from tests.served import Server, ThreadServer

pytestmark = pytest.mark.browser

H200 = {"name": "NVIDIA H200", "capability": [9, 0]}
# The error a stage pod reports: it reaches the page inside the halted reason, as text.
HOSTILE_ERROR = '<img src=x onerror="window.__xss=1"> boom'


def _select(api: httpx.Client, cluster: str, pod: str) -> dict[str, Any]:
    r = api.post("/v1/select", json=body(cluster, "n-1", pod, [9, 0]))
    assert r.status_code == 200, r.text
    return r.json()


def _canary_pods() -> list[str]:
    """Ten canary pod names, two of them in the 20 % stage (the stage is a stable bucket
    per pod, so ten arbitrary names may all fall outside it)."""
    spec = OverrideSpec.model_validate(
        {"force": "FLASHINFER", "note": "FlashInfer canary", "rollout": {"percent": 20}}
    )
    rollout = Rollout(percent=20, id=rollout_id("canary", spec))
    names = [f"canary-{i}" for i in range(200)]
    inside = [n for n in names if bucket_in_stage(stage_bucket("canary", n), rollout)]
    return sorted(inside[:2] + [n for n in names if n not in inside][:8])


CANARY_PODS = _canary_pods()


def _in_stage(answer: dict[str, Any]) -> bool:
    return any((o.get("rollout") or {}).get("in_stage") for o in answer["overrides"])


def _measure(api: httpx.Client, cluster: str, pod: str, backend: str, tflops: float) -> None:
    r = api.post(
        "/v1/measurements",
        json={
            "cluster": cluster,
            "pod": pod,
            "node": "n-1",
            "device": H200,
            "model": R1,
            "dtype": "bfloat16",
            "packages": ALL,
            "results": [
                {
                    "backend": backend,
                    "shape": {"seqlens": [4096], "num_heads": 128},
                    "median_ms": 1.0,
                    "tflops": tflops,
                    "correct": True,
                }
            ],
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["counted"], r.text


def _wait_halted(api: httpx.Client, cluster: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rollout = api.get(f"/v1/overrides/{cluster}").json()["rollout"]
        if rollout["state"] == "halted":
            return rollout
        time.sleep(0.1)
    raise AssertionError(f"the rollout of {cluster} did not halt: {rollout}")


def seed(service: Server) -> dict[str, Any]:
    """canary: a 20 % rollout halted by a stage pod's failure report; wave: an active
    50 % rollout with steps, most of its stage rebooted and both sides measured;
    guarded: policy measured with one pod's failure excluding its backend."""
    with service.client() as api:
        for pod in CANARY_PODS:
            _select(api, "canary", pod)
        for i in range(10):
            _select(api, "wave", f"wave-{i}")

        r = api.put(
            "/v1/overrides/canary",
            json={"force": "FLASHINFER", "note": "FlashInfer canary", "rollout": {"percent": 20}},
        )
        assert r.status_code in (200, 201), r.text
        r = api.put(
            "/v1/overrides/wave",
            json={
                "force": "FLASHINFER",
                "note": "FlashInfer wave",
                "rollout": {
                    "percent": 50,
                    "max_failures": 3,
                    "steps": [10, 50, 100],
                    "step_every": "30m",
                },
            },
        )
        assert r.status_code in (200, 201), r.text

        # canary: the first stage pod that boots reports a build failure: halted.
        stage = [a for a in (_select(api, "canary", pod) for pod in CANARY_PODS) if _in_stage(a)]
        assert stage and stage[0]["backend"] == "FLASHINFER", stage
        r = api.post(
            f"/v1/selections/{stage[0]['decision_id']}/failure",
            json={"backend": "FLASHINFER", "error": HOSTILE_ERROR + "\nsecond line"},
        )
        assert r.status_code == 202, r.text
        halted = _wait_halted(api, "canary")

        # wave: pods 0-7 reboot (8 and 9 have not yet); every rebooted pod benches the
        # backend it runs: the stage's FLASHINFER faster than the rest's FLASH_ATTN.
        answers = {f"wave-{i}": _select(api, "wave", f"wave-{i}") for i in range(8)}
        for pod, a in answers.items():
            speed = 600.0 if a["backend"] == "FLASHINFER" else 500.0
            for _ in range(2):
                _measure(api, "wave", pod, a["backend"], speed)

        # guarded: measured policy; two pods' failures exclude their backend there (the
        # failure policy's default: SWITCHBOARD_FAILURE_MIN_PODS=2).
        r = api.put("/v1/overrides/guarded", json={"policy": "measured", "note": "x"})
        assert r.status_code in (200, 201), r.text
        for pod in ("g-0", "g-1"):
            a = _select(api, "guarded", pod)
            r = api.post(
                f"/v1/selections/{a['decision_id']}/failure",
                json={"backend": a["backend"], "error": "nvcc: exit 1"},
            )
            assert r.status_code == 202, r.text

        summary = api.get("/v1/selections/summary").json()
    return {"halted": halted, "summary": summary, "guarded_backend": a["backend"]}


def test_rollouts_and_exclusions(chromium: SharedChromium, service: ThreadServer) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    viewer = make_token(service, "viewer")
    assert viewer
    with service.client() as api:
        _select(api, "quiet", "q-0")

    with chromium.contexts() as browser:
        try:
            # a zone far from UTC, so that a UTC time cannot pass for a local one
            context = browser.new_context(
                viewport={"width": 1280, "height": 1000},
                locale="en-US",
                timezone_id="Pacific/Auckland",
            )
            page = context.new_page()
            errors = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, viewer)

            # Nothing staged, nothing excluded: neither panel is shown.
            expect(page.locator("#fleet-chart g.row")).to_have_count(1)
            expect(page.locator("#overrides")).to_contain_text("No overrides")
            expect(page.locator("#rollouts-card")).to_be_hidden()
            expect(page.locator("#excluded-card")).to_be_hidden()

            seeded = seed(service)
            halted, summary = seeded["halted"], seeded["summary"]
            progress = {r["cluster"]: r for r in summary["rollouts"]}
            assert set(progress) == {"canary", "wave"}, summary["rollouts"]
            page.locator("#refresh").click()

            # 1. Each override carries its rollout; the halted one says why and when.
            canary = page.locator('#overrides li.override[data-cluster="canary"]')
            expect(canary).to_have_attribute("data-rollout", "halted")
            expect(canary.locator(".rollout-state")).to_have_text("halted")
            expect(canary.locator(".rollout-line")).to_contain_text("20 % of pods")
            expect(canary.locator(".rollout-line")).to_contain_text("failures 1/1")
            # how much of what the guard counted is verified (here: one static token)
            expect(canary.locator(".rollout-evidence")).to_have_text(
                "0 verified pod(s), 1 static source(s)"
            )
            reason = canary.locator(".halted-reason")
            expect(reason).to_have_text(halted["halted_reason"])
            assert "canary-" in halted["halted_reason"] and "boom" in halted["halted_reason"]
            expect(reason).to_contain_text(HOSTILE_ERROR)  # as text, never as markup
            when = canary.locator(".halted-head time")
            expect(when).to_have_attribute("datetime", halted["halted_at"])
            at = datetime.fromisoformat(halted["halted_at"]).astimezone(UTC)
            expect(when).to_have_attribute("title", at.strftime("%Y-%m-%d %H:%M:%S UTC"))
            expect(when).to_have_text(re.compile(r"^(\d+ (s|min) ago|just now)$"))
            # the stage pod that tripped it, as the rollout's failed_pods name it
            (tripped,) = halted["failed_pods"]
            expect(canary.locator(f'.failed-pods button[data-pod="{tripped}"]')).to_be_visible()

            wave = page.locator('#overrides li.override[data-cluster="wave"]')
            expect(wave).to_have_attribute("data-rollout", "active")
            line = wave.locator(".rollout-line")
            expect(line.locator(".rollout-state")).to_have_text("active")
            expect(line).to_contain_text("50 % of pods")
            expect(line).to_contain_text("steps 10 % → 50 % → 100 % every 30m")
            expect(line).to_contain_text("failures 0/3")
            expect(line).to_contain_text("next 100 % in")
            expect(wave.locator(".halted")).to_have_count(0)
            # an override without a rollout shows none
            guarded = page.locator('#overrides li.override[data-cluster="guarded"]')
            expect(guarded).to_contain_text("policy measured")
            expect(guarded.locator(".rollout-line")).to_have_count(0)

            # 2. Progress: halted first, then active; counts as the summary has them.
            card = page.locator("#rollouts-card")
            expect(card).to_be_visible()
            items = page.locator("#rollouts li.rollout")
            expect(items).to_have_count(2)
            assert items.evaluate_all("els => els.map(e => e.dataset.cluster)") == [
                "canary",
                "wave",
            ]
            expect(page.locator("#rollouts-count")).to_have_text("1 halted of 2")
            w = progress["wave"]
            assert w["pods_in_scope"] == 10 and 0 < w["pods_booted_with_it"] <= w["pods_in_stage"]
            item = page.locator('#rollouts li.rollout[data-cluster="wave"]')
            expect(item).to_have_attribute("data-state", "active")
            expect(item).to_have_attribute("data-in-scope", "10")
            expect(item).to_have_attribute("data-in-stage", str(w["pods_in_stage"]))
            expect(item).to_have_attribute("data-booted", str(w["pods_booted_with_it"]))
            expect(item).to_contain_text(f"{w['pods_in_stage']} of 10 pods in the stage")
            expect(item).to_contain_text(f"{w['pods_booted_with_it']} booted with it")
            expect(item).to_contain_text("failures 0/3")
            expect(item).to_contain_text("force FLASHINFER")
            assert (w["stage_median_tflops"], w["rest_median_tflops"]) == (600.0, 500.0), w
            speed = item.locator(".rollout-speed")
            expect(speed).to_have_attribute("data-compared", "true")
            expect(speed).to_contain_text("stage 600.0 vs rest 500.0 TFLOP/s")
            expect(speed).to_contain_text("+20.0 %")
            bar = item.locator("svg.stage-bar")
            expect(bar).to_have_attribute(
                "aria-label",
                f"{w['pods_in_stage']} of 10 pods in the stage, "
                f"{w['pods_booted_with_it']} booted with it",
            )
            assert float(bar.locator("rect.in-stage").get_attribute("width")) == pytest.approx(
                10 * w["pods_in_stage"]
            )
            c = page.locator('#rollouts li.rollout[data-cluster="canary"]')
            expect(c).to_have_attribute("data-state", "halted")
            expect(c).to_contain_text("failures 1/1")
            expect(c.locator(".halted-reason")).to_contain_text(halted["halted_reason"])
            expect(c.locator(".rollout-speed")).to_have_attribute("data-compared", "false")

            # 3. Exclusions: per cluster, each backend with the service's full reason.
            excluded = summary["excluded"]
            assert set(excluded) == {"guarded"}, excluded
            backend = seeded["guarded_backend"]
            expect(page.locator("#excluded-card")).to_be_visible()
            ex = page.locator('#excluded li.excluded-cluster[data-cluster="guarded"]')
            expect(ex.locator(f'li[data-backend="{backend}"] .backend-tag')).to_have_text(backend)
            expect(ex.locator(f'li[data-backend="{backend}"] .excluded-reason')).to_have_text(
                excluded["guarded"][backend]
            )
            assert "nvcc: exit 1" in excluded["guarded"][backend]
            expect(page.locator("#excluded li.excluded-cluster")).to_have_count(1)
            expect(page.locator("#excluded-count")).to_have_text("1 backend in 1 cluster")

            assert page.evaluate("window.__xss") is None
            assert page.locator("#overrides img, #rollouts img").count() == 0

            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-rollouts.png"), full_page=True)
            page.locator("#rollouts-card").screenshot(
                path=str(ARTIFACTS / "dashboard-rollouts-progress.png")
            )
            page.locator(".col-side").screenshot(
                path=str(ARTIFACTS / "dashboard-rollouts-side.png")
            )

            # Signing out takes the panels away with the rest of the data.
            page.locator("#sign-out").click()
            expect(page.locator("#signin")).to_be_visible()
            assert page.locator("#rollouts li, #excluded li, #overrides li").count() == 0
            expect(page.locator("#rollouts-card")).to_be_hidden()
            expect(page.locator("#excluded-card")).to_be_hidden()
        finally:
            browser.close()
    assert not errors, "console errors:\n" + "\n".join(errors)
