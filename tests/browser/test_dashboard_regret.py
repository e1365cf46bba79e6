"""The dashboard's regret panel in headless Chromium: clusters whose pods run
a slower backend than the fleet measured for their situation show the share lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.test_dashboard_browser import (
    ALL,
    ARTIFACTS,
    TIMEOUT_MS,
    ConsoleErrors,
    _skip_if_missing,
    body,
    make_token,
    sign_in,
)
from tests.chromium import SharedChromium
from tests.served import ThreadServer

pytestmark = pytest.mark.browser

H200 = {"name": "NVIDIA H200", "capability": [9, 0]}


def measurement(pod: str, speeds: dict[str, float]) -> dict[str, object]:
    return {
        "cluster": "slow",  # evidence is trusted within the reporting pod's cluster
        "pod": pod,
        "device": H200,
        "model": {
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "num_heads": 128,
        },
        "dtype": "bfloat16",
        "packages": ALL,
        "results": [
            {
                "backend": b,
                "shape": {"seqlens": [4096], "num_heads": 128},
                "median_ms": 1.0,
                "tflops": t,
                "correct": True,
            }
            for b, t in speeds.items()
        ],
    }


def test_regret_panel(chromium: SharedChromium, service: ThreadServer) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    with service.client() as api:
        for pod in ("b0", "b1"):
            # a report counts only from a pod that booted (has a decision) like this one
            booted = body("slow", "n-0", pod, [9, 0])
            booted["device"], booted["packages"] = H200, ALL
            assert api.post("/v1/select", json=booted).status_code == 200
            for _ in range(2):
                r = api.post(
                    "/v1/measurements",
                    json=measurement(pod, {"FLASHINFER": 600.0, "FLASH_ATTN": 200.0}),
                )
                assert r.status_code == 201, r.text
        for i in range(4):  # seed rules: FLASH_ATTN on Hopper, a third of FlashInfer here
            payload = body("slow", "n-1", f"p-{i}", [9, 0])
            payload["device"], payload["packages"] = H200, ALL
            assert api.post("/v1/select", json=payload).status_code == 200
        payload = body("cpu-only", "n-1", "p-0", None)
        assert api.post("/v1/select", json=payload).status_code == 200
    viewer = make_token(service, "viewer")
    assert viewer

    with chromium.contexts() as browser:
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, viewer)
            row = page.locator('#regret tr[data-cluster="slow"]')
            expect(row).to_have_count(1)
            lost = 100 * (1 - 200.0 / 600.0)
            assert float(row.get_attribute("data-lost")) == pytest.approx(lost, abs=0.01)
            # 4 serving pods and the 2 bench pods (they booted too)
            expect(row).to_contain_text("0/6")
            expect(row).to_contain_text("FLASHINFER (6)")
            # a cluster without evidence is not listed
            expect(page.locator('#regret tr[data-cluster="cpu-only"]')).to_have_count(0)
            ARTIFACTS.mkdir(exist_ok=True)
            shot = Path(ARTIFACTS / "dashboard-regret.png")
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
        finally:
            browser.close()
    assert not errors, "console errors:\n" + "\n".join(errors)
