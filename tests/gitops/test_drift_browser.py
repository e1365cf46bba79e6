"""The dashboard shows drift from the last applied overrides file beside the
overrides' count, with who changed what by hand (in Chromium, against a real service)."""

from __future__ import annotations

import pytest

from tests.browser.test_dashboard_browser import (
    TIMEOUT_MS,
    ConsoleErrors,
    _skip_if_missing,
    body,
    sign_in,
)
from tests.chromium import SharedChromium
from tests.conftest import ADMIN
from tests.served import ThreadServer, serving

pytestmark = pytest.mark.browser
HEADER = {"apiVersion": "switchboard/v1", "kind": "Overrides"}


def test_the_overrides_card_says_what_drifted(chromium: SharedChromium, sqlite_url: str) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    with serving(sqlite_url) as service:
        _drifted_card(chromium, service)


def _drifted_card(chromium: SharedChromium, service: ThreadServer) -> None:
    """The test against ``service``: uvicorn in a thread of this process (tests/served.py)."""
    from playwright.sync_api import expect

    with service.client() as api:
        assert api.post("/v1/select", json=body("prod-a", "n-1", "p-0", [9, 0])).status_code == 200
        doc = {**HEADER, "overrides": {"prod-a": {"force": "FLASHINFER", "note": "from git"}}}
        plan = api.post("/v1/plan", json={"file": doc}).json()
        r = api.post("/v1/apply", json={"file": doc, "etags": plan["etags"], "revision": "abc1234"})
        assert r.status_code == 200, r.text

    with chromium.contexts() as browser:
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            console_errors = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, ADMIN)
            expect(page.locator("#overrides")).to_contain_text("prod-a")
            expect(page.locator("#overrides-drift")).to_be_hidden()  # live equals the file
            with service.client() as api:
                hand = {"force": "FLASH_ATTN", "note": "hotfix"}
                assert api.put("/v1/overrides/prod-a", json=hand).status_code == 200
            page.reload()
            drift = page.locator("#overrides-drift")
            expect(drift).to_have_text("1 differs from overrides file rev abc1234")
            title = drift.get_attribute("title") or ""
            assert "override.put prod-a (hotfix)" in title and ADMIN not in title
        finally:
            browser.close()
    assert not console_errors, "console errors:\n" + "\n".join(console_errors)
