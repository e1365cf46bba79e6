"""Dashboard rough edges found by using it, each checked in a real headless Chromium.

- A decision's reported failures showed their raw UTC timestamps, unlike every other
  time on the page; now every time, these included, is relative with the UTC time on
  hover (dates once mixed "12/1/2026, 4:03:04 AM" with "2 min ago").
- With many clusters the fleet chart was one long alphabetical list: it can now be
  filtered by name and sorted by pods or by name, and keeps both across refreshes.
- On a narrow screen the pod table pushed its Backend column out of view (the one
  column a person opens it for); it now stays on screen (in the server-paged table that
  replaced the cluster's list of 50 decisions).
Screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.browser.test_dashboard_browser import (
    ARTIFACTS,
    TIMEOUT_MS,
    ConsoleErrors,
    _skip_if_missing,
    body,
    sign_in,
)
from tests.chromium import SharedChromium
from tests.conftest import ADMIN
from tests.served import Server, ThreadServer

pytestmark = pytest.mark.browser


def _select(service: Server, *bodies: dict[str, Any]) -> list[dict[str, Any]]:
    with service.client() as api:
        answers = []
        for b in bodies:
            r = api.post("/v1/select", json=b)
            assert r.status_code == 200, r.text
            answers.append(r.json())
    return answers


def _rows(page: Any) -> list[tuple[str, int]]:
    return [
        (name, int(total))
        for name, total in page.eval_on_selector_all(
            "#fleet-chart g.row", "rows => rows.map(r => [r.dataset.cluster, r.dataset.total])"
        )
    ]


def test_failure_times_are_relative_with_utc_on_hover(
    chromium: SharedChromium, service: ThreadServer
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    (answer,) = _select(service, body("prod-east", "h-1", "r1-0", [9, 0]))
    with service.client() as api:
        r = api.post(
            f"/v1/selections/{answer['decision_id']}/failure",
            json={"backend": answer["backend"], "error": "nvcc: exit 1"},
        )
        assert r.status_code == 202, r.text
        (failure,) = api.get(f"/v1/selections/{answer['decision_id']}").json()["failures"]

    with chromium.contexts() as browser:
        try:
            # a zone far from UTC, so that a UTC time cannot pass for a local one
            context = browser.new_context(locale="en-US", timezone_id="Pacific/Auckland")
            page = context.new_page()
            console_errors = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, ADMIN)
            page.locator("#lookup-cluster").fill("prod-east")
            page.locator("#lookup-pod").fill("r1-0")
            page.locator("#lookup button[type=submit]").click()
            item = page.locator("#decision-failures li")
            expect(item).to_have_count(1)
            expect(item).to_contain_text("nvcc: exit 1")
            expect(item).to_contain_text(answer["backend"])
            when = item.locator("time")
            expect(when).to_have_attribute("datetime", failure["at"])
            at = datetime.fromisoformat(failure["at"]).astimezone(UTC)
            expect(when).to_have_attribute("title", at.strftime("%Y-%m-%d %H:%M:%S UTC"))
            expect(when).to_have_text(re.compile(r"^(\d+ (s|min) ago|just now)$"))
            assert failure["at"][:16] not in item.inner_text()  # no raw ISO text
            ARTIFACTS.mkdir(exist_ok=True)
            page.locator("#decision-failures").screenshot(path=str(ARTIFACTS / "failures.png"))
        finally:
            browser.close()
    assert not console_errors, console_errors


def test_fleet_chart_filters_and_sorts_many_clusters(
    chromium: SharedChromium, service: ThreadServer
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    # 36 clusters, 1-6 pods each: prod-00..prod-17 and lab-00..lab-17
    pods = {
        f"{kind}-{i:02d}": 1 + (i * 5 + len(kind)) % 6
        for kind in ("prod", "lab")
        for i in range(18)
    }
    _select(
        service,
        *[body(c, "n", f"p{j}", [9, 0]) for c, n in pods.items() for j in range(n)],
    )
    by_name = sorted(pods.items())
    by_pods = sorted(pods.items(), key=lambda kv: (-kv[1], kv[0]))

    with chromium.contexts() as browser:
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            console_errors = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, ADMIN)
            expect(page.locator("#fleet-chart g.row")).to_have_count(len(pods))
            assert _rows(page) == by_name  # default: by name
            expect(page.locator("#fleet-count")).to_have_text("36 clusters")

            page.locator("#fleet-sort").select_option("pods")
            assert _rows(page) == by_pods  # most pods first, ties by name

            page.locator("#fleet-filter").fill("prod")
            expected = [kv for kv in by_pods if kv[0].startswith("prod")]
            expect(page.locator("#fleet-chart g.row")).to_have_count(len(expected))
            assert _rows(page) == expected
            expect(page.locator("#fleet-count")).to_have_text("18 of 36 clusters")
            # KPIs stay fleet-wide
            expect(page.locator("#kpi-clusters")).to_have_text("36")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "fleet-filter.png"), full_page=True)

            # filter and sort survive a refresh
            page.locator("#refresh").click()
            expect(page.locator("#last-updated")).to_contain_text("Last updated")
            assert _rows(page) == expected

            page.locator("#fleet-filter").fill("PROD-1")  # case does not matter
            expect(page.locator("#fleet-chart g.row")).to_have_count(8)
            page.locator("#fleet-sort").select_option("name")
            assert [c for c, _ in _rows(page)] == [f"prod-1{i}" for i in range(8)]

            page.locator("#fleet-filter").fill("nothing-like-this")
            expect(page.locator("#fleet-chart g.row")).to_have_count(0)
            expect(page.locator("#chart")).to_contain_text("No cluster matches")
            expect(page.locator("#fleet-count")).to_have_text("0 of 36 clusters")
        finally:
            browser.close()
    assert not console_errors, console_errors


@pytest.mark.parametrize("width", [360, 600])
def test_narrow_pod_table_keeps_the_backend_column(
    chromium: SharedChromium, service: ThreadServer, width: int
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    model = "deepseek-ai/DeepSeek-R1-0528-with-a-long-model-name"
    answers = _select(
        service,
        *[
            {
                **body(
                    "prod-east", f"h100-node-{i:03d}.prod-east.example", f"r1-prefill-{i}", [9, 0]
                ),
                "model": {**body("x", "n", "p", [9, 0])["model"], "name": model},
            }
            for i in range(3)
        ],
    )
    with chromium.contexts() as browser:
        try:
            page = browser.new_page(viewport={"width": width, "height": 800})
            console_errors = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, ADMIN)
            page.locator('#fleet-chart g.row[data-cluster="prod-east"]').click()
            expect(page.locator("#pf-cluster")).to_have_value("prod-east")
            # The click's load marks the table busy until its rows are drawn; before
            # that the rows on screen may be the sign-in's unfiltered read, which the
            # filtered rows then replace (three rows either way when only these pods
            # run), leaving a row found before it detached.
            expect(page.locator("#pods-table")).not_to_have_attribute("aria-busy", "true")
            rows = page.locator("#pods-table tbody tr")
            expect(rows).to_have_count(3)
            # The scroll box and the cells are measured in one go, in one render.
            measured = page.evaluate(
                """() => {
                    const box = (el) => { const r = el.getBoundingClientRect();
                        return {x: r.x, width: r.width}; };
                    const wrap = document.querySelector('#pods-table .pods-wrap');
                    const heads = [...wrap.querySelectorAll('thead th')]
                        .map(th => th.textContent.trim());
                    const column = heads.indexOf('Backend');
                    return {wrap: box(wrap), cells: [...wrap.querySelectorAll('tbody tr')]
                        .map(tr => ({text: tr.children[column].textContent,
                                     box: box(tr.children[column])}))};
                }"""
            )
            wrap = measured["wrap"]
            assert len(measured["cells"]) == 3
            for answer, cell in zip(answers, measured["cells"], strict=True):
                box = cell["box"]
                assert answer["backend"] in cell["text"], cell
                # inside the scroll box's visible part, without scrolling sideways
                assert box["x"] >= wrap["x"] - 1, (box, wrap)
                assert box["x"] + box["width"] <= wrap["x"] + wrap["width"] + 1, (box, wrap)
                assert box["x"] + box["width"] <= width, (box, width)
            assert page.evaluate("document.scrollingElement.scrollWidth") <= width
            # the detail button is still reachable
            expect(rows.first.locator("button")).to_be_visible()
            ARTIFACTS.mkdir(exist_ok=True)
            rows.first.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / f"pods-{width}px.png"))
        finally:
            browser.close()
    assert not console_errors, console_errors
