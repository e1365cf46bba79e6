"""The console live, in a real headless Chromium against two real ``switchboard serve``
replicas on one SQLite file:

- an override put by another client (through the API, on this replica or the other)
  shows in an open page within 2 s, without a reload (the change stream, GET /v1/events);
- an open editor is told when the override it edits changed underneath, with the
  "keep mine / load theirs" choice;
- a replica past its limit of streams (here 0) answers 503 and the page polls instead,
  and still shows the change;
- a stopped service (SIGSTOP) shows the "has not answered" banner within 5 s of a
  Refresh, and "last updated" says it is not answering; SIGCONT recovers.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.browser.test_dashboard_browser import (
    TIMEOUT_MS,
    _skip_if_missing,
    launch,
    sign_in,
)
from tests.conftest import ServiceProcess, start_together

pytestmark = pytest.mark.browser


def put(service: ServiceProcess, cluster: str, note: str) -> None:
    with service.client() as api:
        r = api.put(f"/v1/overrides/{cluster}", json={"force": "FLASHINFER", "note": note})
    assert r.status_code in (200, 201), r.text


def opened(browser: Any, service: ServiceProcess, token: str) -> Any:
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.goto(service.url + "/")
    sign_in(page, token)
    return page


def test_changes_arrive_live_across_replicas_and_a_hung_service_says_so(
    tmp_path: Path,
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)
    url = f"sqlite:///{tmp_path / 'sb.db'}"
    one, two = start_together(
        tmp_path,
        ServiceProcess(url),
        # the second replica takes no stream at all: its page polls
        ServiceProcess(url, env={"SWITCHBOARD_EVENT_STREAMS_MAX": "0"}),
    )
    admin = one.bootstrap_token or ""
    try:
        with sync_playwright() as p:
            browser = launch(p)
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
            # within 2 s, no reload
            put(one, "prod-east", "from the API")
            expect(page.locator("#overrides li[data-cluster='prod-east']")).to_be_visible(
                timeout=2_000
            )
            put(two, "prod-west", "from the other replica")
            expect(page.locator("#overrides li[data-cluster='prod-west']")).to_be_visible(
                timeout=2_000
            )

            # the editor is told when what it edits changes underneath
            page.locator("#overrides li[data-cluster='prod-east'] [data-act=edit]").click()
            expect(page.locator("#editor")).to_be_visible()
            put(two, "prod-east", "changed underneath")
            box = page.locator("#ed-conflict")
            expect(box).to_have_attribute("data-underneath", "put", timeout=2_000)
            expect(box).to_contain_text("while you were editing")
            expect(page.locator("#ed-conflict-load")).to_be_visible()
            page.keyboard.press("Escape")

            # a service that does not answer says so within 5 s, and stops looking fresh
            assert one.proc is not None
            os.kill(one.proc.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                page.locator("#refresh").click()
                banner = page.locator("#banner")
                expect(banner).to_contain_text("has not answered", timeout=5_000)
                assert time.monotonic() - started < 5.5
                expect(updated).to_contain_text("not answering")
                expect(page.locator("#banner-retry")).to_be_visible()
            finally:
                os.kill(one.proc.pid, signal.SIGCONT)
            # answering again: the banner goes and the page is live once more
            expect(banner).to_be_hidden()
            expect(updated).not_to_contain_text("not answering")
            expect(updated).to_have_attribute("data-live", "live")

            # the page on the replica that refused its stream still shows the changes
            # (its poll, every 10 s: most of that has passed above)
            expect(polled.locator("#overrides li[data-cluster='prod-west']")).to_be_visible(
                timeout=12_000
            )
            expect(polled.locator("#last-updated")).to_have_attribute("data-live", "polling")
            browser.close()
    finally:
        one.stop()
        two.stop()
