"""The console by keyboard and screen reader, and its states that used to go stale, in a
real headless Chromium against one real ``switchboard serve`` shared by the module:

- no literal "null" in the Halt and Resume confirmations;
- the editor's expiry line follows the choice ("in 7 days" no longer says "in 23 h");
- Resume after another admin removed the override drops the dry run, disables the
  action, says so and offers to reload;
- a click outlives a redraw of the overrides between its press and its release;
- editing a halted override says that applying resumes it (a PUT stores the rollout
  anew, active: checked against the API);
- a skip link is the first stop of Tab, and reaches "New override" in three presses;
- after signing in, the focus is on the first skip link, not on the page body;
- the "has not answered for N s" banner of a hung service counts up;
- closing a dialog (Escape, Close, Cancel, after a write) gives focus back to the control
  that opened it, even once the panels were redrawn;
- the failure reports' Clear buttons have unique accessible names;
- an axe-core scan of every view finds no violation of any impact, a rollout halted by
  a pod's failure (its "Tripped by" link on red) included.

Each test uses clusters of its own, so their order does not matter.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.browser.test_console import boot, token
from tests.browser.test_dashboard_browser import TIMEOUT_MS, _skip_if_missing, body, sign_in
from tests.chromium import SharedChromium
from tests.conftest import ADMIN
from tests.served import Server, serving

pytestmark = pytest.mark.browser

NOTE = "INC-7001: FlashInfer canary"
STAGED = {"force": "FLASHINFER", "note": NOTE, "rollout": {"percent": 50, "max_failures": 3}}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    _skip_if_missing()
    d: Path = tmp_path_factory.mktemp("a11y")
    with serving(f"sqlite:///{d / 'switchboard.db'}") as svc:
        clusters = ["halt", "gone", "press", "edit", "expiry", "focus", "skip", "scan"]
        clusters += ["tripped"]
        boot(
            svc,
            [body(c, f"n-{i % 3}", f"{c}-{i}", [9, 0]) for c in clusters for i in range(8)]
            + [body("scan", "b-1", f"scan-b{i}", [10, 0]) for i in range(4)],
        )
        yield svc


@pytest.fixture(scope="module")
def browser(chromium: SharedChromium, service: Server) -> Iterator[Any]:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    with chromium.contexts() as b:
        yield b
        b.close()


@pytest.fixture(scope="module")
def admin_page(browser: Any, service: Server) -> Iterator[Any]:
    """One signed-in admin page for the module (a context and sign-in per test cost more
    than the tests)."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900}, locale="en-US")
    pg = ctx.new_page()
    pg.goto(service.url + "/")
    sign_in(pg, ADMIN)
    pg.locator("#fleet-chart g.row").first.wait_for()
    yield pg
    ctx.close()


@pytest.fixture
def page(admin_page: Any) -> Iterator[Any]:
    """The shared page, its dialog closed again after each test."""
    yield admin_page
    admin_page.evaluate(
        "() => { const d = document.getElementById('dialog'); if (d.open) d.close(); }"
    )


def put(service: Server, scope: str, spec: dict[str, Any] = STAGED) -> dict[str, Any]:
    with service.client() as api:
        r = api.put(f"/v1/overrides/{scope}", json=spec)
        assert r.status_code in (200, 201), r.text
        return dict(r.json())


def halt(service: Server, scope: str) -> None:
    with service.client() as api:
        r = api.post(f"/v1/overrides/{scope}/rollout", json={"action": "halt", "note": "drill"})
        assert r.status_code == 200, r.text


def override_item(page: Any, scope: str) -> Any:
    item = page.locator(f'#overrides li.override[data-cluster="{scope}"]')
    page.locator("#refresh").click()
    item.wait_for()
    return item


def focused(page: Any) -> str:
    """The focused element: its id, else its accessible name (aria-label or text)."""
    return str(
        page.evaluate(
            """() => { const el = document.activeElement;
                if (!el || el === document.body) return "<body>";
                return el.id ? "#" + el.id
                  : (el.getAttribute("aria-label") || el.textContent.trim()); }"""
        )
    )


# ---------------------------------------------------------------- stale states


def test_halt_and_resume_confirmations_show_no_null(page: Any, service: Server) -> None:
    from playwright.sync_api import expect

    put(service, "halt")
    item = override_item(page, "halt")
    item.locator('button[data-act="halt"]').click()
    expect(page.locator("#ra-preview .preview")).to_be_visible()
    assert "null" not in page.locator("#dialog-body").inner_text()
    page.keyboard.press("Escape")
    halt(service, "halt")
    item = override_item(page, "halt")
    item.locator('button[data-act="resume"]').click()
    expect(page.locator("#ra-preview .preview")).to_be_visible()
    assert "null" not in page.locator("#dialog-body").inner_text()


def test_resume_after_removal_drops_the_dry_run_and_offers_a_reload(
    page: Any, service: Server
) -> None:
    from playwright.sync_api import expect

    put(service, "gone")
    halt(service, "gone")
    override_item(page, "gone").locator('button[data-act="resume"]').click()
    expect(page.locator("#ra-confirm")).to_be_enabled()
    with service.client() as api:  # another admin removes it meanwhile
        assert api.delete("/v1/overrides/gone", params={"note": "done"}).status_code == 200
    page.locator("#ra-note").fill("resume after the fix")
    page.locator("#ra-confirm").click()
    gone = page.locator("#action-conflict")
    expect(gone).to_contain_text("The override was removed")
    expect(page.locator("#ra-confirm")).to_be_disabled()
    expect(page.locator("#ra-preview")).to_be_empty()
    expect(page.locator("#ra-change")).to_be_empty()
    assert "Refused (404)" not in page.locator("#dialog-body").inner_text()
    page.locator("#action-reload").click()
    expect(page.locator("#dialog")).to_be_hidden()
    expect(page.locator('#overrides li.override[data-cluster="gone"]')).to_have_count(0)


def test_a_click_outlives_a_redraw_between_press_and_release(page: Any, service: Server) -> None:
    """A live change or a poll redraws the overrides between a button's press and its
    release (a person's click takes about 100 ms): the click still acts, also when a
    second passed meanwhile and the item's relative times say so."""
    from playwright.sync_api import expect

    put(service, "press")
    halt(service, "press")
    resume = override_item(page, "press").locator('button[data-act="resume"]')
    resume.wait_for()
    # the page's redraw of every change made above, awaited, before the button's place
    # is read: a live update landing later would move it under the pointer
    page.evaluate("() => refreshAll()")
    resume.scroll_into_view_if_needed()
    box = resume.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.wait_for_timeout(1_100)  # "halted 1 s ago" becomes "2 s ago" in the redraw
    page.evaluate("() => refreshAll()")  # the page's own redraw, awaited
    page.mouse.up()
    expect(page.locator("#ra-confirm")).to_be_enabled()


def test_editing_a_halted_override_says_applying_resumes_it(page: Any, service: Server) -> None:
    from playwright.sync_api import expect

    put(service, "edit")
    halt(service, "edit")
    override_item(page, "edit").locator('button[data-act="edit"]').click()
    apply = page.locator("#ed-apply")
    expect(apply).to_have_text("Apply and resume the rollout")
    page.locator("#ed-note").fill("widen the canary")
    page.locator("#ed-preview-btn").click()
    expect(page.locator("#ed-resumes")).to_contain_text("Applying resumes the halted rollout")
    page.locator("#ed-staged").uncheck()
    expect(apply).to_have_text("Apply and end the halt")
    page.locator("#ed-staged").check()
    page.locator("#ed-preview-btn").click()
    expect(apply).to_be_enabled()
    apply.click()
    expect(page.locator("#dialog")).to_be_hidden()
    with service.client() as api:  # what the label promised is what the API did
        assert api.get("/v1/overrides/edit").json()["rollout"]["state"] == "active"


def test_expiry_line_follows_the_choice(page: Any, service: Server) -> None:
    from playwright.sync_api import expect

    expires = (datetime.now(UTC) + timedelta(hours=23, minutes=30)).isoformat()
    put(service, "expiry", {"deny": ["CUDNN"], "note": NOTE, "expires_at": expires})
    override_item(page, "expiry").locator('button[data-act="edit"]').click()
    line = page.locator("#ed-expiry-now")
    expect(line).to_contain_text("Expires in 23 h")
    page.locator("#ed-expiry").select_option("7d")
    expect(line).not_to_contain_text("23 h")
    expect(line).to_contain_text("Would expire in 7 d")
    when = datetime.fromisoformat((line.locator("time").get_attribute("datetime") or "")[:19])
    assert (
        abs(when - datetime.now(UTC).replace(tzinfo=None) - timedelta(days=7)).total_seconds() < 60
    )
    page.locator("#ed-expiry").select_option("none")
    expect(line).to_contain_text("No expiry")
    page.locator("#ed-expiry").select_option("keep")
    expect(line).to_contain_text("Expires in 23 h")


# ---------------------------------------------------------------- keyboard


def test_skip_link_is_the_first_stop_and_reaches_new_override(page: Any) -> None:
    page.reload()  # signed in still (the tab's session), and nothing focused yet
    page.locator("#fleet-chart g.row").first.wait_for()
    page.locator("#new-override").wait_for()  # drawn once the token's role is known
    page.keyboard.press("Tab")
    assert focused(page) == "Skip to main content"
    page.keyboard.press("Tab")
    assert focused(page) == "Skip to overrides"
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    assert focused(page) == "#new-override"


def test_signing_in_puts_the_focus_on_the_first_skip_link(browser: Any, service: Server) -> None:
    """The form that held the focus is gone once signed in: the focus goes to the top
    of the page (as after a reload), not to the body past the skip links."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900}, locale="en-US")
    try:
        pg = ctx.new_page()
        pg.goto(service.url + "/")
        pg.locator("#token-input").wait_for()
        assert focused(pg) == "#token-input"  # no identity provider: the token field
        pg.locator("#token-input").fill(ADMIN)
        pg.locator("#token-input").press("Enter")
        pg.locator("#fleet-chart g.row").first.wait_for()
        pg.locator("#new-override").wait_for()  # drawn once the token's role is known
        assert focused(pg) == "Skip to main content"
        pg.keyboard.press("Tab")
        assert focused(pg) == "Skip to overrides"
        pg.keyboard.press("Enter")
        pg.keyboard.press("Tab")
        assert focused(pg) == "#new-override"
    finally:
        ctx.close()


def test_a_hung_services_banner_counts_up(browser: Any, service: Server) -> None:
    """A service that stops answering: the banner says for how long, and that number
    grows while it stays silent (it used to stay at the first figure)."""
    from playwright.sync_api import expect

    ctx = browser.new_context(viewport={"width": 1440, "height": 900}, locale="en-US")
    try:
        pg = ctx.new_page()
        pg.goto(service.url + "/")
        sign_in(pg, ADMIN)
        pg.locator("#fleet-chart g.row").first.wait_for()
        pg.route("**/v1/**", lambda route: None)  # every API request hangs from here
        pg.locator("#refresh").click()
        banner = pg.locator("#banner")
        expect(banner).to_contain_text("The service has not answered for")
        shown = pg.locator("#banner-silent")
        first = int(shown.inner_text().removesuffix(" s"))
        assert first >= 4
        pg.wait_for_function(
            "(n) => parseInt(document.getElementById('banner-silent').textContent) >= n + 2",
            arg=first,
        )
        # a screen reader hears it once, not a number a second
        assert shown.get_attribute("aria-hidden") == "true"
        expect(banner).to_contain_text("a while")
    finally:
        ctx.close()


def test_closing_a_dialog_gives_focus_back_to_its_opener(page: Any, service: Server) -> None:
    from playwright.sync_api import expect

    put(service, "focus")
    item = override_item(page, "focus")
    edit = item.locator('button[data-act="edit"]')
    edit.click()
    expect(page.locator("#dialog")).to_be_visible()
    page.keyboard.press("Escape")
    assert focused(page) == "Edit override focus"
    edit.click()
    page.locator("#dialog-close").click()
    assert focused(page) == "Edit override focus"
    item.locator('button[data-act="halt"]').click()
    expect(page.locator("#ra-confirm")).to_be_enabled()
    page.evaluate("() => refreshAll()")  # the panels are redrawn under the dialog (a poll)
    page.locator("#dialog-body button", has_text="Cancel").click()
    assert focused(page) == "Halt the rollout of focus"
    # after a write (the override list redrawn): the redrawn button of the same override
    page.locator('#overrides li.override[data-cluster="focus"] button[data-act="edit"]').click()
    page.locator("#ed-note").fill("focus drill")
    page.locator("#ed-preview-btn").click()
    page.locator("#ed-apply").click()
    expect(page.locator("#dialog")).to_be_hidden()
    expect(page.locator("#notice")).to_contain_text("saved")
    page.wait_for_function("() => document.activeElement !== document.body")
    assert focused(page) == "Edit override focus"
    page.locator("#new-override").click()
    page.keyboard.press("Escape")
    assert focused(page) == "#new-override"


def test_the_drawer_and_the_exclusions_say_what_applies(page: Any, service: Server) -> None:
    """A pod's decision under a halted rollout names the override as not applied and why
    (not "quiet: none"); failure reports cite "(measured policy)" only while an override
    sets that policy, the only one under which they rule a backend out."""
    trip(service, "quiet")
    try:
        drawer_and_exclusions(page, service)
    finally:
        clear_failures(service)


def drawer_and_exclusions(page: Any, service: Server) -> None:
    from playwright.sync_api import expect

    boot(service, [body("quiet", "n-0", "quiet-late", [9, 0])])
    page.locator("#refresh").click()
    page.locator("#lookup-cluster").fill("quiet")
    page.locator("#lookup-pod").fill("quiet-late")
    page.locator("#lookup button[type=submit]").click()
    touched = page.locator("#decision-overrides li", has_text="quiet")
    expect(touched).to_contain_text("quiet: not applied: its rollout is halted")
    expect(touched).to_have_attribute("data-applied", "false")
    expect(page.locator("#decision-overrides")).not_to_contain_text(": none")
    if page.locator("#detail-close").is_visible():
        page.locator("#detail-close").click()

    lead = page.locator("#excluded-lead")
    expect(lead).to_contain_text("No cluster's policy rules them out now")
    expect(page.locator("#excluded-card")).not_to_contain_text("measured policy")
    put(service, "measured-one", {"policy": "measured", "note": NOTE})
    try:
        page.locator("#refresh").click()
        expect(lead).to_contain_text("rule out under the measured policy")
    finally:
        with service.client() as api:
            r = api.delete("/v1/overrides/measured-one", params={"note": "done"})
            assert r.status_code == 200, r.text
    page.locator("#refresh").click()
    expect(lead).to_contain_text("No cluster's policy rules them out now")


def test_failure_clear_buttons_have_unique_names(page: Any, service: Server) -> None:
    from playwright.sync_api import expect

    answers = boot(service, [body("scan", "n-9", "fails-h", [9, 0]),
                             body("scan", "b-9", "fails-b", [10, 0])])  # fmt: skip
    with service.client() as api:
        for a in answers:
            r = api.post(
                f"/v1/selections/{a['decision_id']}/failure",
                json={"backend": a["backend"], "error": "CUDA error: illegal address"},
            )
            assert r.status_code == 202, r.text
    page.locator("#refresh").click()
    clears = page.locator('#situations button[data-act="clear"]')
    expect(clears).to_have_count(2)
    names = [clears.nth(i).get_attribute("aria-label") or "" for i in range(2)]
    assert len(set(names)) == 2 and all(n.startswith("Clear failures of ") for n in names), names
    assert any("H200" in n for n in names) and any("B200" in n for n in names), names


# ---------------------------------------------------------------- axe-core scan


def violations(page: Any, within: str | None = None) -> list[str]:
    """axe-core's violations of any impact on the page as it is (or only ``within`` a
    selector: a modal dialog, the page under it being inert and scanned already), one
    line each."""
    from axe_playwright_python.sync_playwright import Axe

    found = Axe().run(page, context=within).response["violations"]
    return [
        f"{v['id']} ({v['impact']}): {v['help']} @ {[n['target'] for n in v['nodes'][:4]]}"
        for v in found
    ]


def trip(service: Server, scope: str) -> dict[str, Any]:
    """A staged override on ``scope`` halted by its guard: pods in the stage report
    failures until it trips. The rollout, halted, with the pods that tripped it."""
    put(service, scope, {**STAGED, "rollout": {"percent": 50, "max_failures": 1}})
    answers = boot(service, [body(scope, f"n-{i % 3}", f"{scope}-{i}", [9, 0]) for i in range(8)])
    with service.client() as api:
        for a in (a for a in answers if a["backend"] == STAGED["force"]):
            r = api.post(
                f"/v1/selections/{a['decision_id']}/failure",
                json={"backend": a["backend"], "error": "CUDA error: illegal address"},
            )
            assert r.status_code == 202, r.text
            for _ in range(100):  # the guard counts the reports off the request path
                rollout = api.get(f"/v1/overrides/{scope}").json()["rollout"]
                if rollout["state"] == "halted" and rollout["failed_pods"]:
                    return dict(rollout)
                time.sleep(0.05)
    raise AssertionError(f"the rollout of {scope} never halted: {rollout}")


def clear_failures(service: Server) -> None:
    """Clear every failure report (the rollouts stay halted): failure reports are the
    fleet's, per situation, not a cluster's, and a test that counts them sees only its own."""
    keys = ("device", "capability", "dims", "dtype", "packages", "engine", "backend")
    with service.client() as api:
        groups = api.get("/v1/measurements/summary").json()["groups"]
        for g in (g for g in groups if g["failures"] > 0):
            clear = {k: g[k] for k in keys if g.get(k) is not None} | {"note": "test done"}
            r = api.post("/v1/measurements/failures/clear", json=clear)
            assert r.status_code == 200, r.text


def test_axe_scan_of_every_view_finds_no_violation(
    browser: Any, page: Any, service: Server
) -> None:
    from playwright.sync_api import expect

    put(service, "scan")
    halted = trip(service, "tripped")
    clear_failures(service)  # the rollout stays halted; the module's other tests count theirs
    viewer = token(service, "a11y-viewer", "viewer")
    found: dict[str, list[str]] = {}
    item = override_item(page, "scan")
    tripped = override_item(page, "tripped")
    expect(tripped).to_have_attribute("data-rollout", "halted")
    link = tripped.locator(f'.failed-pods button[data-pod="{halted["failed_pods"][0]}"]')
    expect(link).to_be_visible()
    found["a rollout halted by a pod's failure"] = violations(page)
    page.locator("#pods tr.pod-row").first.click()
    expect(page.locator("#detail")).not_to_be_empty()
    found["dashboard, pods and a pod's detail"] = violations(page)
    page.locator("#detail-close").click()
    item.locator('button[data-act="edit"]').click()
    page.locator("#ed-note").fill("scan")
    page.locator("#ed-preview-btn").click()
    expect(page.locator("#ed-preview .preview")).to_be_visible()
    found["editor dialog"] = violations(page, "#dialog")
    page.keyboard.press("Escape")
    item.locator('button[data-act="halt"]').click()
    expect(page.locator("#ra-preview .preview")).to_be_visible()
    found["rollout action dialog"] = violations(page, "#dialog")
    page.keyboard.press("Escape")
    page.set_viewport_size({"width": 390, "height": 844})
    found["mobile 390x844"] = violations(page)
    page.set_viewport_size({"width": 1440, "height": 900})
    ctx = browser.new_context(viewport={"width": 1440, "height": 900}, locale="en-US")
    other = ctx.new_page()
    other.goto(service.url + "/")
    other.locator("#token-input").wait_for()
    found["signed out"] = violations(other)
    sign_in(other, viewer)
    other.locator("#fleet-chart g.row").first.wait_for()
    found["viewer token"] = violations(other)
    ctx.close()
    assert not any(found.values()), "\n".join(f"{k}: {v}" for k, v in found.items() if v)
