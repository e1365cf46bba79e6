"""The override editor's every field, in a real headless Chromium against a real
``switchboard serve``: what the form is given is what the service stores, and what is
stored comes back into the form.

- create a staged override with deny, policy ``measured``, trust clusters, an expiry,
  failure and slowdown guards, steps and guard clusters; the dry run says why each
  cluster's pods move; the stored override has each field as typed;
- edit it: every field comes back, the expiry is kept, the policy goes
  ``engine-default`` -> ``priority`` -> as the rules say; an expiry at a given time is
  stored as that UTC time;
- an override that already expired keeps its expiry in the editor (it used to come back
  as "no expiry", turning it on again forever on any edit);
- the rollout shows its guards (failures, slowdown limit, guard clusters) before any
  speed is measured, both of its bars (in the stage, booted with it) are visible, the
  promote and halt confirmations say why pods move, and a guard that fires shows the
  pods that tripped it;
- the audit's before/after show their times in the page's one time format.

Screenshots land in ``test-artifacts/``; with ``UPDATE_DOC_IMAGES=1`` the README's
halted-rollout picture (``docs/images/console-halted.png``) is written too.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.browser.test_console import RELATIVE, boot, new_page, screenshot, token
from tests.browser.test_dashboard_browser import (
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

NOTE = "INC-5120: FlashAttention hangs on prod-east"
UTC_TITLE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")


def east(i: int) -> dict[str, Any]:
    return body("prod-east", f"h-{i % 6}", f"e-{i:03d}", [9, 0])


def stored(service: Server, scope: str) -> dict[str, Any]:
    with service.client() as api:
        r = api.get(f"/v1/overrides/{scope}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def at(iso: str) -> datetime:
    t = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def preview_and_apply(page: Any) -> None:
    from playwright.sync_api import expect

    page.locator("#ed-preview-btn").click()
    expect(page.locator("#ed-apply")).to_be_enabled()
    page.locator("#ed-apply").click()
    expect(page.locator("#dialog")).to_be_hidden()


def visible_at_centre(page: Any, selector: str) -> bool:
    """Whether the element's own centre shows it (nothing drawn over it there)."""
    return bool(
        page.evaluate(
            """sel => { const el = document.querySelector(sel);
                el.scrollIntoView({block: "center"});
                const r = el.getBoundingClientRect();
                if (r.width < 1 || r.height < 1) return false;
                return document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2) === el;
            }""",
            selector,
        )
    )


RECORD_BARS = """() => {
    window.__bars = [];
    new MutationObserver(() => {
        for (const svg of document.querySelectorAll("#rollouts svg.stage-bar")) {
            if (svg.__seen) continue;
            svg.__seen = true;
            const li = svg.closest("li.rollout");
            window.__bars.push({
                at_ms: Math.round(performance.now()),
                cluster: li && li.dataset.cluster,
                item: li && Object.assign({}, li.dataset),
                widths: [...svg.querySelectorAll("rect")].map((r) => r.getAttribute("width")),
                box_width: svg.getBoundingClientRect().width,
            });
        }
    }).observe(document.getElementById("rollouts"), {childList: true, subtree: true});
}"""
"""Keeps a record of every stage bar the page draws (when, from what counts, and how
wide it measured as it was put in): a failure's message says which drawing a
measurement met."""


def drawn(page: Any, bar: str) -> Any:
    """What the page drew the stage bar from, for a failure's message: the rollout's
    counts as drawn, the bar's rects and box, whether anything above it is hidden, the
    summary the page holds, and every stage bar drawn so far (``RECORD_BARS``)."""
    return page.evaluate(
        """bar => { const svg = document.querySelector(bar);
            const li = svg && svg.closest("li.rollout");
            const hidden = [];
            for (let el = svg; el; el = el.parentElement) {
                const style = getComputedStyle(el);
                if (el.hidden || style.display === "none") hidden.push(el.id || el.tagName);
            }
            return {
                at_ms: Math.round(performance.now()),
                bars_matching: document.querySelectorAll(bar).length,
                item: li && Object.assign({}, li.dataset),
                rects: svg && [...svg.querySelectorAll("rect")].map(
                    (r) => [r.getAttribute("class"), r.getAttribute("width")]),
                box: svg && svg.getBoundingClientRect().toJSON(),
                hidden,
                drawn: (window.__bars || []).slice(-8),
                rollouts: state.summary && state.summary.rollouts,
            }; }""",
        bar,
    )


def test_every_editor_field_is_stored_as_given_and_comes_back(
    chromium: SharedChromium, service: ThreadServer
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    boot(service, [east(i) for i in range(60)])

    with chromium.contexts() as browser:
        try:
            page = new_page(browser)
            errors = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, ADMIN)
            expect(page.locator("#fleet-chart g.row")).to_have_count(1)
            page.evaluate(RECORD_BARS)

            # 1. Every field, typed as a person would.
            page.locator("#new-override").click()
            page.locator("#ed-scope").fill("prod-east")
            deny = page.locator("#ed-deny")
            deny.locator('input[value="FLASH_ATTN"]').check()
            deny.locator('input[value="CUDNN"]').check()
            page.locator("#ed-policy").select_option("measured")
            page.locator("#ed-trust").fill("bench-*, prod-*")
            page.locator("#ed-expiry").select_option("1d")
            page.locator("#ed-note").fill(NOTE)
            page.locator("#ed-staged").check()
            page.locator("#ed-percent").fill("25")
            page.locator("#ed-max-failures").fill("3")
            page.locator("#ed-max-slowdown").fill("7.5")
            page.locator("#ed-steps").fill("25, 50, 100")
            page.locator("#ed-step-every").fill("2h")
            page.locator("#ed-guard").fill("prod-east, canary-*")
            before = datetime.now(UTC)
            page.locator("#ed-preview-btn").click()
            preview = page.locator("#ed-preview .preview")
            change = preview.locator(
                'tr.change[data-cluster="prod-east"][data-from="FLASH_ATTN"][data-to="TORCH_SDPA"]'
            )
            staged = int(change.get_attribute("data-pods") or -1)
            assert 0 < staged < 60
            # why they move, in the service's words, under the change
            why = preview.locator('tr.change[data-cluster="prod-east"] + tr.change-why li')
            expect(why).to_have_count(1)
            expect(why).to_contain_text(f"FLASH_ATTN: denied by override prod-east: {NOTE}")
            expect(why).to_contain_text("In the 25 % stage of override prod-east.")
            expect(why).to_contain_text("Using fallback TORCH_SDPA.")
            screenshot(page.locator("#dialog"), "console-editor-reasons.png", readme=False)
            page.locator("#ed-apply").click()
            expect(page.locator("#dialog")).to_be_hidden()
            after = datetime.now(UTC)

            o = stored(service, "prod-east")
            assert set(o["deny"]) == {"FLASH_ATTN", "CUDNN"} and o["force"] is None
            assert (o["policy"], o["trust_clusters"]) == ("measured", ["bench-*", "prod-*"])
            assert before + timedelta(days=1) <= at(o["expires_at"]) <= after + timedelta(days=1)
            r = o["rollout"]
            assert (r["percent"], r["max_failures"], r["max_slowdown_pct"]) == (25, 3, 7.5)
            assert (r["steps"], r["step_every"]) == ([25, 50, 100], "2h")
            assert r["guard_clusters"] == ["prod-east", "canary-*"]

            # 2. The rollout shows its guards before anything is measured.
            progress = page.locator('#rollouts li.rollout[data-cluster="prod-east"]')
            guards = progress.locator(".rollout-guards")
            expect(guards).to_contain_text("failures 0/3")
            expect(guards).to_contain_text("halts beyond \u22127.5 % against the rest")
            expect(guards).to_contain_text("guard clusters prod-east, canary-*")
            speed = progress.locator(".rollout-speed")
            expect(speed).to_have_attribute("data-compared", "false")
            expect(speed).to_contain_text("neither side measured yet")
            expect(speed).to_contain_text("the guard halts it beyond \u22127.5 %")
            line = page.locator('#overrides li.override[data-cluster="prod-east"] .rollout-line')
            expect(line).to_contain_text("guard clusters prod-east, canary-*")

            # 3. The stage boots: in the stage and booted with it, both bars visible.
            answers = boot(service, [east(i) for i in range(60)])
            stage = [a for a in answers if a["backend"] == "TORCH_SDPA"]
            assert len(stage) == staged
            page.locator("#refresh").click()
            expect(progress).to_have_attribute("data-booted", str(staged))
            expect(progress).to_have_attribute("data-in-stage", str(staged))
            bar = '#rollouts li.rollout[data-cluster="prod-east"] svg.stage-bar'
            assert visible_at_centre(page, f"{bar} rect.in-stage")
            assert visible_at_centre(page, f"{bar} rect.booted")
            widths = page.eval_on_selector_all(
                f"{bar} rect.in-stage, {bar} rect.booted",
                "rs => [Math.round(performance.now()),"
                " ...rs.map(r => r.getBoundingClientRect().width)]",
            )
            measured_at, *widths = widths
            assert widths[0] == pytest.approx(widths[1], abs=0.5) and widths[0] > 0, (
                widths,
                measured_at,
                drawn(page, bar),
            )

            # 4. The confirmations say why pods move.
            progress.locator('button[data-act="promote"]').click()
            expect(page.locator("#ra-percent")).to_have_value("50")
            moving = page.locator('#ra-preview tr.change[data-cluster="prod-east"] + tr.change-why')
            expect(moving).to_contain_text("In the 50 % stage of override prod-east.")
            expect(moving).to_contain_text("Using fallback TORCH_SDPA.")
            page.locator("#dialog-close").click()
            progress.locator('button[data-act="halt"]').click()
            back = page.locator('#ra-preview tr.change[data-cluster="prod-east"] + tr.change-why')
            expect(back).to_contain_text("The rollout of override prod-east is halted.")
            expect(back).to_contain_text("Using FLASH_ATTN: first valid backend")
            page.locator("#dialog-close").click()

            # 5. A guard fires: three stage pods, each under its own agent token (one
            # token is one evidence source), report their kernel failing (all three ask
            # first: a failure is evidence against the backend for the next select).
            staged_at = [i for i, a in enumerate(answers) if a["backend"] == "TORCH_SDPA"]
            reporters = []
            for i in staged_at[:3]:
                own = token(service, f"pod-{i}", "agent", ["prod-east"])
                with service.client(own) as c:
                    asked = c.post("/v1/select", json=east(i))
                assert asked.status_code == 200, asked.text
                reporters.append((own, asked.json()["decision_id"]))
            for own, decision_id in reporters:
                with service.client(own) as c:
                    r = c.post(
                        f"/v1/selections/{decision_id}/failure",
                        json={"backend": "TORCH_SDPA", "error": "RuntimeError: CUDA error"},
                    )
                assert r.status_code == 202, r.text
            # the guard's halt reaches the open page by itself (the change stream)
            expect(progress).to_have_attribute("data-state", "halted")
            assert stored(service, "prod-east")["rollout"]["state"] == "halted"
            page.locator("#refresh").click()
            expect(progress).to_have_attribute("data-state", "halted")
            tripped = progress.locator(".failed-pods button")
            expect(tripped).to_have_count(3)
            expect(progress.locator(".halted-reason")).to_contain_text("reported a failure")
            screenshot(page.locator("#rollouts-card"), "console-halted.png")
            # 6. Edit: every field comes back; the expiry is kept; the policy changes.
            item = page.locator('#overrides li.override[data-cluster="prod-east"]')
            expires = o["expires_at"]
            for policy in ("engine-default", "priority", ""):
                item.locator('button[data-act="edit"]').click()
                expect(page.locator("#ed-scope")).to_have_value("prod-east")
                expect(deny.locator('input[value="FLASH_ATTN"]')).to_be_checked()
                expect(deny.locator('input[value="CUDNN"]')).to_be_checked()
                expect(deny.locator('input[value="FLASHINFER"]')).not_to_be_checked()
                expect(page.locator("#ed-trust")).to_have_value("bench-*, prod-*")
                expect(page.locator("#ed-expiry")).to_have_value("keep")
                expect(page.locator("#ed-expiry-now time")).to_have_attribute("datetime", expires)
                expect(page.locator("#ed-guard")).to_have_value("prod-east, canary-*")
                expect(page.locator("#ed-max-slowdown")).to_have_value("7.5")
                page.locator("#ed-policy").select_option(policy)
                page.locator("#ed-note").fill(f"{NOTE}: policy {policy or 'of the rules'}")
                preview_and_apply(page)
                o = stored(service, "prod-east")
                assert o["policy"] == (policy or None), o
                assert o["expires_at"] == expires  # kept, to the microsecond
                assert o["trust_clusters"] == ["bench-*", "prod-*"]
                assert o["rollout"]["guard_clusters"] == ["prod-east", "canary-*"]

            # 7. An expiry at a given time is that time, in UTC.
            item.locator('button[data-act="edit"]').click()
            page.locator("#ed-expiry").select_option("at")
            page.locator("#ed-expiry-at").fill("2031-02-03T04:05")
            preview_and_apply(page)
            assert at(stored(service, "prod-east")["expires_at"]) == datetime(
                2031, 2, 3, 4, 5, tzinfo=UTC
            )

            # 8. The audit's before/after: times in the one format, no ISO text.
            entry = page.locator('#audit li.audit-entry[data-action="override.put"]').first
            entry.locator("details summary").click()
            times = entry.locator(".diff pre time")
            assert times.count() >= 4  # created_at and expires_at, before and after
            for t in times.evaluate_all("ts => ts.map(t => [t.textContent, t.title])"):
                assert RELATIVE.search(t[0]) and UTC_TITLE.match(t[1]), t
            text = entry.locator(".diff").inner_text()
            assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", text), text

        finally:
            browser.close()
    assert not errors, errors


def test_an_expired_override_keeps_its_expiry_when_edited(
    chromium: SharedChromium, service: ThreadServer
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    boot(service, [east(i) for i in range(5)])
    soon = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    with service.client() as api:
        r = api.put(
            "/v1/overrides/prod-east",
            json={"deny": ["CUDNN"], "note": "for the drill", "expires_at": soon},
        )
        assert r.status_code == 200, r.text
    expires = stored(service, "prod-east")["expires_at"]
    while at(expires) > datetime.now(UTC) - timedelta(seconds=0.5):
        time.sleep(0.2)

    with chromium.contexts() as browser:
        try:
            page = new_page(browser)
            errors = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, ADMIN)
            item = page.locator('#overrides li.override[data-cluster="prod-east"]')
            expect(item).to_have_attribute("data-expired", "true")
            item.locator('button[data-act="edit"]').click()
            expiry = page.locator("#ed-expiry")
            expect(expiry).to_have_value("keep")  # not "no expiry": that turns it on again
            expect(expiry).to_have_attribute("data-expired", "true")
            now = page.locator("#ed-expiry-now")
            expect(now).to_contain_text("Expired")
            expect(now).to_contain_text("it applies to no pod")
            expect(now.locator("time")).to_have_attribute("datetime", expires)
            assert UTC_TITLE.match(now.locator("time").get_attribute("title") or "")
            # saving it as it is would be refused: the page says so and sends nothing
            page.locator("#ed-note").fill("for the drill, again")
            page.locator("#ed-preview-btn").click()
            expect(page.locator("#ed-error")).to_contain_text("this override has expired")
            expect(page.locator("#ed-apply")).to_be_disabled()
            assert stored(service, "prod-east")["expires_at"] == expires
            # turning it on again is a choice: a new expiry
            expiry.select_option("1h")
            before = datetime.now(UTC)
            preview_and_apply(page)
            o = stored(service, "prod-east")
            assert before + timedelta(hours=1) - timedelta(seconds=5) <= at(o["expires_at"])
            assert at(o["expires_at"]) <= datetime.now(UTC) + timedelta(hours=1)
            assert o["note"] == "for the drill, again" and not o["expired"]
        finally:
            browser.close()
    assert not errors, errors
