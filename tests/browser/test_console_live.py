"""The console live, in a real headless Chromium against two replicas (each a service of
its own, served from a thread of this process) on one SQLite file:

- an override put by another client (through the API, on this replica or the other)
  shows in an open page without a reload (the change stream, GET /v1/events);
- an open editor is told when the override it edits changed underneath, with the
  "keep mine / load theirs" choice;
- a replica past its limit of streams (here 0) answers 503 and the page polls instead,
  and still shows the change;
- a service that stops answering (its event loop blocked) shows the "has not answered"
  banner after a Refresh, and "last updated" says it is not answering; it recovers.

How fast each arrives is test_console_live_timing.py's (serial) business: here only
that it does, through Playwright's waiting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from tests.browser.test_console import boot
from tests.browser.test_dashboard_browser import (
    TIMEOUT_MS,
    _skip_if_missing,
    body,
    sign_in,
)
from tests.chromium import SharedChromium
from tests.served import Server, ThreadServer

# the page on a replica that refused its stream polls this often (dashboard.js REFRESH_MS)
REFRESH_MS = 10_000

pytestmark = pytest.mark.browser


def put(service: Server, cluster: str, note: str) -> None:
    with service.client() as api:
        r = api.put(f"/v1/overrides/{cluster}", json={"force": "FLASHINFER", "note": note})
    assert r.status_code in (200, 201), r.text


def opened(browser: Any, service: Server, token: str) -> Any:
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.goto(service.url + "/")
    sign_in(page, token)
    return page


def test_changes_arrive_live_across_replicas_and_a_hung_service_says_so(
    chromium: SharedChromium,
    served: Callable[..., ThreadServer],
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    one = served()
    # the second replica, on the same store, takes no stream at all: its page polls
    two = served(one.database_url, event_streams_max=0)
    admin = one.bootstrap_token or ""
    with chromium.contexts() as browser:
        try:
            page = opened(browser, one, admin)
            polled = opened(browser, two, admin)
            updated = page.locator("#last-updated")
            expect(updated).to_have_attribute("data-live", "live")
            expect(polled.locator("#last-updated")).to_have_attribute("data-live", "polling")
            with two.client() as api:  # what its page was told
                r = api.get("/v1/events")
            assert r.status_code == 503 and r.headers["Retry-After"] == "30", r.text
            assert "SWITCHBOARD_EVENT_STREAMS_MAX" in r.json()["detail"]["message"]

            # another client's change on this replica, then on the other one: on the page
            # without a reload (a live page reads everything only once a minute otherwise)
            put(one, "prod-east", "from the API")
            expect(page.locator("#overrides li[data-cluster='prod-east']")).to_be_visible()
            put(two, "prod-west", "from the other replica")
            expect(page.locator("#overrides li[data-cluster='prod-west']")).to_be_visible()

            # the editor is told when what it edits changes underneath
            page.locator("#overrides li[data-cluster='prod-east'] [data-act=edit]").click()
            expect(page.locator("#editor")).to_be_visible()
            put(two, "prod-east", "changed underneath")
            box = page.locator("#ed-conflict")
            expect(box).to_have_attribute("data-underneath", "put")
            expect(box).to_contain_text("while you were editing")
            expect(page.locator("#ed-conflict-load")).to_be_visible()
            page.keyboard.press("Escape")

            # a service that does not answer says so, and stops looking fresh
            banner = page.locator("#banner")
            with one.hung():
                page.locator("#refresh").click()
                expect(banner).to_contain_text("has not answered")
                expect(updated).to_contain_text("not answering")
                expect(page.locator("#banner-retry")).to_be_visible()
            # answering again: the banner goes and the page is live once more, at the
            # page's next try (its reconnect backs off up to 30 s while nothing answers;
            # how soon it comes on a quiet machine is test_console_live_timing's)
            expect(banner).to_be_hidden(timeout=30_000 + TIMEOUT_MS)
            expect(updated).not_to_contain_text("not answering")
            expect(updated).to_have_attribute("data-live", "live")

            # the page on the replica that refused its stream still shows the changes, at
            # its next poll
            expect(polled.locator("#overrides li[data-cluster='prod-west']")).to_be_visible(
                timeout=REFRESH_MS + TIMEOUT_MS
            )
            expect(polled.locator("#last-updated")).to_have_attribute("data-live", "polling")
        finally:
            browser.close()


def test_an_answer_that_comes_late_never_replaces_a_newer_one(
    chromium: SharedChromium,
    served: Callable[..., ThreadServer],
) -> None:
    """Two reads of the summary overlap (the live counts' read and a refresh); the
    older one's answer, arriving last, must not take the page back to before the pods
    the newer one showed: here it is held at the browser until the newer has shown."""
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    one = served()
    boot(one, [body("prod-east", "n-0", "p-0", [9, 0])])
    held: list[tuple[Any, Any]] = []

    def hold_one(route: Any) -> None:
        if held or not holding:
            route.continue_()
            return
        held.append((route, route.fetch()))  # the answer as of now, shown only later

    holding = False
    with chromium.contexts() as browser:
        try:
            page = opened(browser, one, one.bootstrap_token or "")
            pods = page.locator("#kpi-pods")
            expect(pods).to_have_text("1")
            # the stream tells the counts; the refresh its start asks for is over, so the
            # next read of the summary is the counts' own
            expect(page.locator("#last-updated")).to_have_attribute("data-live", "live")
            page.wait_for_function("() => !state.inflight")
            page.route("**/v1/selections/summary", hold_one)
            holding = True
            boot(one, [body("prod-east", "n-0", "p-1", [9, 0])])  # the counts' read, held
            for _ in range(TIMEOUT_MS // 50):
                if held:
                    break
                page.wait_for_timeout(50)
            assert held, "the page never read the summary after a pod booted"
            boot(one, [body("prod-east", "n-0", "p-2", [9, 0])])
            page.locator("#refresh").click()  # a later read, answered at once
            expect(pods).to_have_text("3")
            route, late = held[0]
            with page.expect_event("requestfinished", lambda r: r is route.request):
                route.fulfill(response=late)  # the first read's answer: two pods
            # the page has read that answer once a task queued after it has run
            page.evaluate("() => new Promise((done) => setTimeout(done, 0))")
            assert pods.inner_text() == "3"
        finally:
            for route, _ in held:
                with contextlib.suppress(Exception):
                    route.abort()
