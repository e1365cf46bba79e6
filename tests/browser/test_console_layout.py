"""The console's layout over a filled fleet, in a real headless Chromium (one service and
one browser for the module):

- a long GPU name ("NVIDIA RTX PRO 6000 Blackwell Server Edition") no longer squeezes the
  pod column to a letter a line at 1440 px: the pod column keeps its width, the name ends
  in an ellipsis with the whole name on hover, and the Detail button stays on screen;
- a row opens its decision in a drawer beside the table (a labelled dialog) instead of a
  jump far down the page; Escape closes it and gives focus back to the row's button;
- rollouts in progress come first, with their step, guard figures, evidence and next step;
- the fleet chart marks clusters under an override (O) or in a rollout stage (S);
- counts are written one way (1,096), a search says "more on the next page" rather than
  "of more", and a loss measured on 4 of 44 pods says so, in a neutral colour;
- on a phone (390x844) every pod keeps its cluster, GPU and engine on screen, and a
  table wider than the screen shows a cue that it scrolls sideways.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.fleet import LONG_GPU, MIXED_B200, MIXED_H200, fill_fleet
from tests.browser.test_console import shown_range
from tests.browser.test_dashboard_browser import (
    TIMEOUT_MS,
    ConsoleErrors,
    _skip_if_missing,
    sign_in,
)
from tests.chromium import SharedChromium
from tests.conftest import ADMIN
from tests.served import Server, serving

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    _skip_if_missing()
    d = tmp_path_factory.mktemp("layout")
    with serving(f"sqlite:///{d / 'switchboard.db'}") as service:
        yield service, fill_fleet(service)


@pytest.fixture(scope="module")
def browser(chromium: SharedChromium, fleet: tuple[Server, int]) -> Iterator[Any]:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    with chromium.contexts() as b:
        try:
            yield b
        finally:
            b.close()


def open_console(browser: Any, service: Server, width: int, height: int) -> Any:
    ctx = browser.new_context(viewport={"width": width, "height": height}, locale="en-US")
    page = ctx.new_page()
    page.errors = ConsoleErrors(page, set())
    page.goto(service.url + "/")
    sign_in(page, ADMIN)
    return page


def box(locator: Any) -> dict[str, float]:
    b = locator.bounding_box()
    assert b is not None, locator
    return b


def test_desktop_table_drawer_rollouts_marks_and_counts(
    fleet: tuple[Server, int], browser: Any
) -> None:
    from playwright.sync_api import expect

    service, total = fleet
    page = open_console(browser, service, 1440, 900)
    rows = page.locator("#pods tbody tr")
    expect(rows).to_have_count(100)

    # 1. the long GPU name: the pod column keeps its width, the button stays on screen
    row = page.locator('#pods tr.pod-row[data-cluster="edge-rtx"]').first
    gpu = row.locator("td.col-device > div").first
    expect(gpu).to_have_attribute("title", LONG_GPU)
    pod_col = box(page.locator("#pods th.col-pod"))
    assert pod_col["width"] >= 180, pod_col
    assert box(row)["height"] < 90, box(row)  # a few lines, not a letter a line
    detail = row.locator("td.actions button")
    b = box(detail)
    assert b["x"] >= 0 and b["x"] + b["width"] <= 1440, b
    assert box(page.locator("#pods tbody tr").nth(5))["y"] < 900 + 800  # rows, not a column

    # 2. the drawer beside the table: no jump, a labelled dialog, Escape gives focus back
    detail.scroll_into_view_if_needed()
    scrolled = page.evaluate("window.scrollY")
    detail.click()
    drawer = page.locator("#detail-card")
    expect(drawer).to_have_class("card detail drawer-open")
    expect(drawer).to_have_attribute("role", "dialog")
    expect(drawer).to_have_attribute("aria-labelledby", "detail-title")
    expect(page.locator("#decision")).to_have_attribute(
        "data-decision-id", row.get_attribute("data-decision") or ""
    )
    d = box(drawer)
    assert d["x"] >= 1440 - 640 and d["x"] + d["width"] <= 1440, d
    assert d["y"] >= 0 and abs(d["y"] + d["height"] - 900) < 1, d  # below the bar, to the end
    assert abs(page.evaluate("window.scrollY") - scrolled) < 5
    page.keyboard.press("Escape")
    expect(drawer).not_to_have_class("card detail drawer-open")
    assert page.evaluate("document.activeElement.dataset.pod") == row.get_attribute("data-pod")

    # 3. rollouts first, with the step, guards, evidence and the next step
    rollout = page.locator('#rollouts li.rollout[data-cluster="prod-east"]')
    expect(rollout).to_contain_text("failures 0/3")
    expect(rollout).to_contain_text("evidence 0 verified pods / 0 static sources")
    expect(rollout.locator(".rollout-next")).to_contain_text("next 50 %")
    expect(rollout.locator('.step[aria-current="step"]')).to_have_text("20 %")
    assert box(page.locator("#rollouts-card"))["y"] < box(page.locator("#pods-card"))["y"]

    # 4. chart marks: an override in force (O), a rollout stage (S), and their legend
    marks = page.eval_on_selector_all(
        "#fleet-chart g.row",
        "rs => Object.fromEntries(rs.map(r => [r.dataset.cluster,"
        " [...r.querySelectorAll('g.mark')].map(m => m.dataset.mark)]))",
    )
    assert marks["prod-east"] == ["override", "stage"], marks
    assert marks["prod-west"] == ["override"], marks
    assert marks["mixed"] == [] and marks["edge-rtx"] == [], marks
    expect(page.locator("#chart-marks")).to_contain_text("override in force")

    # 5. counts one way; a search says more follow; an honest small sample
    expect(page.locator("#kpi-pods")).to_have_text(f"{total:,}")
    expect(page.locator("#pods-range")).to_have_text(shown_range(1, 100, total))
    expect(page.locator('#fleet-chart g.row[data-cluster="prod-east"] .row-total')).to_have_text(
        "1,000 pods"
    )
    expect(page.locator('#pf-cluster option[value="prod-east"]')).to_have_text("prod-east (1,000)")
    expect(page.locator('#rollouts li.rollout[data-cluster="prod-east"]')).to_contain_text(
        "of 1,000 pods in the stage"
    )
    page.locator("#pf-q").fill("b-")  # mixed's b-00.. and prod-west's nodes b-0..b-5
    expect(page.locator("#pods-range")).to_have_text(shown_range(1, 80))
    page.locator("#pods-limit").select_option("50")
    more = shown_range(1, 50) + " \u00b7 more on the next page"  # not "of more"
    expect(page.locator("#pods-range")).to_have_text(more)
    regret = page.locator('#regret tr[data-cluster="mixed"] td.num').first
    expect(regret).to_have_attribute("data-small-sample", "true")
    expect(regret).to_contain_text(f"measured on {MIXED_H200} of {MIXED_H200 + MIXED_B200} pods")
    assert "lost" not in (regret.get_attribute("class") or "")
    assert not page.errors, page.errors
    page.context.close()


def test_phone_keeps_cluster_gpu_engine_and_cues_side_scroll(
    fleet: tuple[Server, int], browser: Any
) -> None:
    from playwright.sync_api import expect

    service, _ = fleet
    page = open_console(browser, service, 390, 844)
    row = page.locator('#pods tr.pod-row[data-cluster="edge-rtx"]').first
    expect(row).to_be_attached()
    for cell, text in (("col-cluster", "edge-rtx"), ("col-device", "NVIDIA RTX"),
                       ("col-engine", "vllm"), ("actions", "Detail")):  # fmt: skip
        td = row.locator(f"td.{cell}")
        expect(td).to_be_visible()
        expect(td).to_contain_text(text)
        b = box(td)
        assert b["x"] >= 0 and b["x"] + b["width"] <= 390, (cell, b)

    # the editor's preview is wider than a phone: the box says it scrolls sideways
    page.locator("#new-override").click()
    page.locator("#ed-scope").fill("mixed")
    page.locator("#ed-force").select_option("FLASHINFER")
    page.locator("#ed-note").fill("try FlashInfer")
    page.locator("#ed-preview-btn").click()
    wrap = page.locator("#ed-preview .table-wrap")
    expect(wrap).to_be_visible()
    assert wrap.evaluate("w => w.scrollWidth > w.clientWidth")
    expect(wrap).to_have_class("table-wrap scrolls-x")
    wrap.evaluate("w => w.scrollTo(w.scrollWidth, 0)")
    expect(wrap).to_have_class("table-wrap")  # at the right edge: no cue
    assert not page.errors, page.errors
    page.context.close()
