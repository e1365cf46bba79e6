"""How fast the console hears of things, in a real headless Chromium: the bounds the
console promises, measured alone (``serial``) since a busy machine stretches them.

- a change made through the API shows in an open page within 2 s (the change stream;
  without it the page would read again only at its next poll);
- a service that stops answering shows the "has not answered" banner within 5 s of a
  Refresh (live.js SLOW_MS, 4 s).

That each of these happens at all is test_console_live.py's, without a bound.
"""

from __future__ import annotations

import time

import pytest

from tests.browser.test_console_live import opened, put
from tests.browser.test_dashboard_browser import TIMEOUT_MS, _skip_if_missing, launch
from tests.conftest import MachineLoad
from tests.served import ThreadServer

pytestmark = [pytest.mark.browser, pytest.mark.serial]

ARRIVES_S = 2.0
SAYS_NOT_ANSWERING_S = 5.5


def test_a_change_arrives_within_2_s_and_a_hung_service_is_named_within_5_s(
    service: ThreadServer, machine_load: MachineLoad
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = opened(browser, service, service.bootstrap_token or "")
            expect(page.locator("#last-updated")).to_have_attribute("data-live", "live")

            machine_load.restart()
            started = time.monotonic()
            put(service, "prod-east", "from the API")
            expect(page.locator("#overrides li[data-cluster='prod-east']")).to_be_visible()
            took = time.monotonic() - started
            assert took < ARRIVES_S, machine_load.says(f"the change took {took:.2f} s")

            with service.hung():
                machine_load.restart()
                started = time.monotonic()
                page.locator("#refresh").click()
                expect(page.locator("#banner")).to_contain_text("has not answered")
                took = time.monotonic() - started
            assert took < SAYS_NOT_ANSWERING_S, machine_load.says(f"the banner took {took:.2f} s")
        finally:
            browser.close()
