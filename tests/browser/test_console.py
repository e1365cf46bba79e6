"""The operator console in a real headless Chromium, against a real ``switchboard serve``
process (SQLite) whose fleet was made through ``POST /v1/select``, as pods make it.

A platform engineer's day, clicked as a person would:

- create a staged override in the editor, see the dry run's preview (pods per cluster,
  from -> to), apply it, and see the pods move once they boot again;
- a second browser (another admin) changes the override while the first has it open:
  the first one's apply answers "someone else changed it" with the new version;
- halt, resume and promote the rollout, each through a confirmation that shows the
  state it sets and the pods it moves; each lands in the audit list on the page;
- clear a situation's failure reports;
- a viewer gets no control at all, an admin limited to ``prod-*`` gets them for its
  clusters only and none for the fleet override ``*``;
- a select sent with a wrong token shows on the refused-selects card;
- every time on the page is relative, with the UTC time on hover;
- the pod table pages through 2,000 pods with the service's cursor and filters them (how
  the listing's cost grows with the fleet is tests/service/test_scale_growth.py's).

Screenshots land in ``test-artifacts/console-*.png``; with ``UPDATE_DOC_IMAGES=1`` the
README's pictures (``docs/images/``) are written too.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
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
from tests.conftest import ADMIN, ROOT, post_all
from tests.served import Server, ThreadServer

pytestmark = pytest.mark.browser

DOC_IMAGES = ROOT / "docs" / "images"
VLLM = {"name": "vllm", "version": "0.33.0"}
# A relative time as the page writes it, after an optional prefix ("set ", "expires ").
RELATIVE = re.compile(r"(just now|\d+ (s|min|h|d)( \d+ min)? ago|in \d+ (s|min|h|d)( \d+ min)?)$")


def shown_range(first: int, last: int, total: int | None = None) -> str:
    """The pager's text: "1\u2013100 of 10,000" (an en dash, thousands with commas)."""
    return f"{first:,}\u2013{last:,}" + ("" if total is None else f" of {total:,}")


def screenshot(target: Any, name: str, *, readme: bool = True) -> None:
    """Into test-artifacts/ always; the README's pictures also into docs/images/ when
    asked to (UPDATE_DOC_IMAGES=1)."""
    ARTIFACTS.mkdir(exist_ok=True)
    target.screenshot(path=str(ARTIFACTS / name))
    if readme and os.environ.get("UPDATE_DOC_IMAGES") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        target.screenshot(path=str(DOC_IMAGES / name))


def boot(service: Server, bodies: list[dict[str, Any]], conns: int = 16) -> list[Any]:
    """POST /v1/select for every body, as pods booting at once; the answers in order."""
    answers = []
    for status, _, content in post_all(service.port, "/v1/select", bodies, conns):
        assert status == 200, content
        answers.append(json.loads(content))
    return answers


def token(service: Server, name: str, role: str, clusters: list[str] | None = None) -> str:
    with service.client() as api:
        r = api.post("/v1/tokens", json={"name": name, "role": role, "clusters": clusters})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def new_page(browser: Any) -> Any:
    """A browser context of its own (a second one is another person's browser)."""
    ctx = browser.new_context(
        viewport={"width": 1400, "height": 1000},
        locale="en-US",
        timezone_id="Pacific/Auckland",  # far from UTC: a local time cannot pass for UTC
    )
    return ctx.new_page()


def east(i: int) -> dict[str, Any]:
    return body("prod-east", f"h-{i % 12}", f"r1-{i:03d}", [9, 0])


def west(i: int) -> dict[str, Any]:
    return body("prod-west", f"b-{i % 6}", f"v3-{i:03d}", [10, 0], engine=VLLM)


# ---------------------------------------------------------------- the workflow


def test_edit_preview_apply_conflict_and_steer_a_rollout(
    chromium: SharedChromium, service: ThreadServer
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    other = token(service, "other-admin", "admin")
    boot(service, [east(i) for i in range(120)] + [west(i) for i in range(40)])

    spec = {
        "force": "FLASHINFER",
        "note": "INC-4711: FlashInfer on prod-east, staged",
        "rollout": {"percent": 20, "max_failures": 2, "steps": [20, 50, 100], "step_every": "1h"},
    }
    with service.client() as api:
        r = api.put("/v1/overrides/prod-east?dry_run=true", json=spec)
        assert r.status_code == 200, r.text
        expected = r.json()["preview"]
    staged = expected["pods_changed"]
    why = ["In the 20 % stage of override prod-east.", f"Forced to FLASHINFER by override "
           f"prod-east: {spec['note']}"]  # fmt: skip
    assert 0 < staged < 120 and expected["changes"] == [
        {"cluster": "prod-east", "from": "FLASH_ATTN", "to": "FLASHINFER", "pods": staged,
         "reasons": [{"pods": staged, "why": why, "exclusions": {}}]}
    ], expected  # fmt: skip

    with chromium.contexts() as browser:
        try:
            a = new_page(browser)
            # the conflicts (412) and the refused promote (409) below are provoked
            errors = ConsoleErrors(a, {409, 412})
            a.goto(service.url + "/")
            sign_in(a, ADMIN)
            expect(a.locator("#whoami")).to_contain_text("(admin)")
            expect(a.locator("#fleet-chart g.row")).to_have_count(2)

            # 1. A new staged override: the preview comes before Apply can be pressed.
            a.locator("#new-override").click()
            dialog = a.locator("#dialog")
            expect(dialog).to_be_visible()
            expect(dialog).to_have_attribute("data-kind", "editor")
            a.locator("#ed-scope").fill("prod-east")
            a.locator("#ed-force").select_option("FLASHINFER")
            a.locator("#ed-note").fill(spec["note"])
            a.locator("#ed-staged").check()
            a.locator("#ed-percent").fill("20")
            a.locator("#ed-max-failures").fill("2")
            a.locator("#ed-steps").fill("20, 50, 100")
            a.locator("#ed-step-every").fill("1h")
            expect(a.locator("#ed-apply")).to_be_disabled()
            a.locator("#ed-preview-btn").click()
            preview = a.locator("#ed-preview .preview")
            expect(preview).to_have_attribute("data-changed", str(staged))
            expect(preview).to_have_attribute("data-total", "160")
            row = preview.locator(
                'tr[data-cluster="prod-east"][data-from="FLASH_ATTN"][data-to="FLASHINFER"]'
            )
            expect(row).to_have_attribute("data-pods", str(staged))
            expect(preview).to_contain_text(f"{staged} of 160 pods would change backend")
            reasons = preview.locator('tr.change[data-cluster="prod-east"] + tr.change-why li')
            expect(reasons).to_have_text(" · ".join(why))
            expect(preview).to_contain_text("only pods in the stage are counted")
            expect(a.locator("#ed-apply")).to_be_enabled()
            screenshot(dialog, "console-editor.png")

            # a change after the preview makes it stale until previewed again
            a.locator("#ed-percent").fill("30")
            expect(a.locator("#ed-apply")).to_be_disabled()
            expect(a.locator("#ed-stale")).to_be_visible()
            a.locator("#ed-percent").fill("20")
            expect(a.locator("#ed-apply")).to_be_enabled()
            a.locator("#ed-apply").dblclick()  # a double click applies once
            expect(dialog).to_be_hidden()
            expect(a.locator("#notice")).to_contain_text("Override prod-east saved")
            item = a.locator('#overrides li.override[data-cluster="prod-east"]')
            expect(item).to_have_attribute("data-rollout", "active")
            puts = a.locator('#audit li.audit-entry[data-action="override.put"]')
            expect(puts).to_have_count(1)
            expect(puts).to_contain_text(f"{staged} of 160 pods changed")

            # 2. The pods move when they boot again: exactly the previewed ones.
            answers = boot(service, [east(i) for i in range(120)])
            moved = sum(x["backend"] == "FLASHINFER" for x in answers)
            assert moved == staged
            a.locator("#refresh").click()
            seg = a.locator(
                '#fleet-chart g.row[data-cluster="prod-east"] rect[data-backend=FLASHINFER]'
            )
            expect(seg).to_have_attribute("data-pods", str(staged))
            progress = a.locator('#rollouts li.rollout[data-cluster="prod-east"]')
            expect(progress).to_have_attribute("data-in-stage", str(staged))
            expect(progress).to_have_attribute("data-booted", str(staged))
            a.locator("#pf-stage").select_option("prod-east")
            expect(a.locator("#pods-range")).to_have_text(shown_range(1, staged, staged))
            rows = a.locator("#pods tbody tr")
            expect(rows).to_have_count(staged)
            assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.backend)")) == {"FLASHINFER"}
            a.locator("#pf-clear").click()
            expect(a.locator("#pods-range")).to_have_text(shown_range(1, 100, 160))

            # 3. Two admins at once: B saves while A has the editor open. A's editor hears
            #    of it on the change stream and says so; A's apply, still on the version A
            #    read, is refused (412) and says so too; A sees B's version, and can take it.
            item.locator('button[data-act="edit"]').click()
            expect(a.locator("#ed-scope")).to_have_value("prod-east")
            expect(a.locator("#ed-force")).to_have_value("FLASHINFER")
            expect(a.locator("#ed-steps")).to_have_value("20, 50, 100")
            b = new_page(browser)
            errors_b = ConsoleErrors(b, set())
            b.goto(service.url + "/")
            sign_in(b, other)
            b.locator(
                '#overrides li.override[data-cluster="prod-east"] button[data-act="edit"]'
            ).click()
            b.locator("#ed-note").fill("B: tighter guard")
            b.locator("#ed-max-failures").fill("1")
            b.locator("#ed-preview-btn").click()
            expect(b.locator("#ed-apply")).to_be_enabled()
            b.locator("#ed-apply").click()
            expect(b.locator("#dialog")).to_be_hidden()
            with service.client() as api:
                theirs = api.get("/v1/overrides/prod-east").json()
            assert theirs["created_by"] == "other-admin"
            conflict = a.locator("#ed-conflict")
            expect(conflict).to_have_attribute("data-underneath", "put")
            expect(conflict).to_contain_text("Changed by other-admin")
            expect(conflict).to_contain_text("while you were editing")
            expect(conflict).to_have_attribute("data-current", str(theirs["revision"]))
            expect(conflict).not_to_contain_text("Someone else changed it")

            a.locator("#ed-note").fill("A: my own change")
            a.locator("#ed-preview-btn").click()
            expect(a.locator("#ed-apply")).to_be_enabled()
            a.locator("#ed-apply").click()
            expect(conflict).to_be_visible()
            expect(conflict).to_contain_text("Someone else changed it")
            expect(conflict).to_contain_text("nothing was applied")
            expect(conflict).not_to_have_attribute("data-underneath", re.compile(".*"))
            expect(conflict).to_contain_text(f"rev {theirs['revision']}, set by other-admin")
            expect(conflict).to_contain_text("B: tighter guard")
            expect(conflict).to_have_attribute("data-current", str(theirs["revision"]))
            expect(a.locator("#ed-apply")).to_be_disabled()
            with service.client() as api:  # nothing of A's was stored
                assert api.get("/v1/overrides/prod-east").json()["note"] == "B: tighter guard"
            a.locator("#ed-conflict-load").click()
            expect(a.locator("#ed-note")).to_have_value("B: tighter guard")
            expect(a.locator("#ed-max-failures")).to_have_value("1")
            a.locator("#dialog-close").click()
            expect(a.locator("#dialog")).to_be_hidden()

            # 4. Halt, resume, promote: each confirmed on its dry run, each audited.
            a.locator("#refresh").click()
            expect(progress.locator("li.step-current")).to_have_attribute("data-step", "20")
            progress.locator('button[data-act="halt"]').click()
            expect(dialog).to_have_attribute("data-kind", "rollout-halt")
            change = a.locator("#ra-change")
            expect(change).to_have_attribute("data-from", "active")
            expect(change).to_have_attribute("data-to", "halted")
            # B's write started a new stage: the pods that booted with it go back
            expect(a.locator("#ra-preview .preview")).to_have_attribute("data-changed", str(staged))
            a.locator("#ra-confirm").click()  # no note yet: refused on the page
            expect(a.locator("#ra-error")).to_contain_text("Note")
            a.locator("#ra-note").fill("halting to look at the canary")
            a.locator("#ra-confirm").click()
            expect(dialog).to_be_hidden()
            expect(progress).to_have_attribute("data-state", "halted")
            expect(item).to_have_attribute("data-rollout", "halted")
            expect(item.locator(".halted-reason")).to_contain_text(
                "halted by bootstrap-admin: halting to look at the canary"
            )
            expect(progress.locator('button[data-act="halt"]')).to_have_count(0)
            expect(a.locator('#audit li[data-action="rollout.halt"]')).to_have_count(1)

            progress.locator('button[data-act="resume"]').click()
            expect(change).to_have_attribute("data-to", "active")
            a.locator("#ra-note").fill("canary looked fine")
            a.locator("#ra-confirm").click()
            expect(dialog).to_be_hidden()
            expect(progress).to_have_attribute("data-state", "active")
            expect(a.locator('#audit li[data-action="rollout.resume"]')).to_have_count(1)

            # A confirmation goes stale too: B halts while A's promote is open.
            progress.locator('button[data-act="promote"]').click()
            expect(a.locator("#ra-confirm")).to_be_enabled()
            with service.client(other) as api:
                r = api.post(
                    "/v1/overrides/prod-east/rollout", json={"action": "halt", "note": "B halts"}
                )
                assert r.status_code == 200, r.text
            a.locator("#ra-note").fill("widen to half")
            a.locator("#ra-confirm").click()
            # the service refuses it (what A confirmed is no longer stored: 412) and the
            # page says what the rollout is now
            stale = a.locator("#action-conflict")
            expect(stale).to_contain_text("Someone else changed it")
            expect(stale).to_contain_text("set by other-admin, its rollout halted at 20 %")
            a.locator("#action-reload").click()  # the same confirmation, on the new version
            expect(a.locator("#ra-error")).to_contain_text("resume it before promoting it")
            expect(a.locator("#ra-confirm")).to_be_disabled()
            a.locator("#dialog-close").click()
            progress.locator('button[data-act="resume"]').click()
            a.locator("#ra-note").fill("B's halt was a false alarm")
            a.locator("#ra-confirm").click()
            expect(progress).to_have_attribute("data-state", "active")

            progress.locator('button[data-act="promote"]').click()
            expect(a.locator("#ra-percent")).to_have_value("50")  # the next step
            expect(change).to_contain_text("stage 20 % → 50 %")
            expect(a.locator("#ra-confirm")).to_have_text("Promote to 50 %")
            promoted = int(a.locator("#ra-preview .preview").get_attribute("data-changed") or -1)
            a.locator("#ra-note").fill("widen to half")
            a.locator("#ra-confirm").click()
            expect(dialog).to_be_hidden()
            expect(progress.locator("li.step-current")).to_have_attribute("data-step", "50")
            expect(progress.locator("li.step-done")).to_have_count(1)
            expect(a.locator('#audit li[data-action="rollout.promote"]')).to_have_count(1)
            expect(a.locator('#audit li[data-action="rollout.halt"]')).to_have_count(2)
            expect(a.locator('#audit li[data-action="rollout.resume"]')).to_have_count(2)
            with service.client() as api:
                r = api.get("/v1/overrides/prod-east").json()["rollout"]
            assert (r["state"], r["percent"]) == ("active", 50)
            answers = boot(service, [east(i) for i in range(120)])
            assert sum(x["backend"] == "FLASHINFER" for x in answers) == staged + promoted
            a.locator("#refresh").click()
            expect(progress).to_have_attribute("data-booted", str(staged + promoted))
            screenshot(a.locator("#rollouts-card"), "console-rollout.png")

            # 5. Failure reports of a situation, cleared by an unrestricted admin.
            pod = west(0)
            (answer,) = boot(service, [pod])
            with service.client() as api:
                r = api.post(
                    f"/v1/selections/{answer['decision_id']}/failure",
                    json={"backend": answer["backend"], "error": "CUDA error: illegal address"},
                )
                assert r.status_code == 202, r.text
            a.locator("#refresh").click()
            situation = a.locator(f'#situations li.situation[data-backend="{answer["backend"]}"]')
            expect(situation).to_contain_text("1 pod reported failures")
            situation.locator('button[data-act="clear"]').click()
            expect(dialog).to_have_attribute("data-kind", "clear")
            a.locator("#cf-note").fill("driver 580.1 fixes it")
            a.locator("#cf-confirm").click()
            expect(dialog).to_be_hidden()
            expect(a.locator("#notice")).to_contain_text("Cleared 1 failure report")
            expect(a.locator('#audit li[data-action="evidence.clear_failures"]')).to_have_count(1)
            expect(situation).to_have_count(0)

            # 6. Removing goes through its dry run too, and a stale one is refused (412).
            item.locator('button[data-act="remove"]').click()
            expect(dialog).to_have_attribute("data-kind", "remove")
            expect(a.locator("#rm-preview .preview")).to_have_attribute(
                "data-changed", str(staged + promoted)
            )
            with service.client(other) as api:  # B writes it again meanwhile
                current = api.get("/v1/overrides/prod-east").json()
                spec_b = {k: current[k] for k in ("force", "deny", "note")}
                spec_b["rollout"] = {"percent": 50, "steps": [20, 50, 100], "step_every": "1h"}
                r = api.put("/v1/overrides/prod-east", json=spec_b)
                assert r.status_code == 200, r.text
                rev_b = r.json()["override"]["revision"]
            a.locator("#rm-note").fill("done")
            a.locator("#rm-confirm").click()
            stale = a.locator("#action-conflict")
            expect(stale).to_contain_text(f"it is now rev {rev_b}, set by other-admin")
            with service.client() as api:
                assert api.get("/v1/overrides/prod-east").status_code == 200  # still there
            a.locator("#action-reload").click()
            expect(a.locator("#rm-confirm")).to_be_enabled()
            a.locator("#rm-note").fill("done")
            a.locator("#rm-confirm").click()
            expect(dialog).to_be_hidden()
            expect(item).to_have_count(0)
            expect(a.locator('#audit li[data-action="override.delete"]')).to_have_count(1)
            # every audit entry of the day, once each (the double click applied once)
            actions = Counter(
                a.locator("#audit li.audit-entry").evaluate_all(
                    "es => es.map(e => e.dataset.action)"
                )
            )
            assert actions["override.put"] == 3, actions  # A's create, B's two changes
        finally:
            browser.close()
    assert not errors, errors
    assert not errors_b, errors_b


# ---------------------------------------------------------------- who sees which controls


def test_controls_follow_the_token_refusals_and_times(
    chromium: SharedChromium, service: ThreadServer
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    viewer = token(service, "ops-viewer", "viewer")
    scoped = token(service, "prod-admin", "admin", ["prod-*"])
    boot(service, [east(i) for i in range(6)] + [body("staging", "n", "s-0", [9, 0])])
    with service.client() as api:
        for scope, spec in {
            "*": {"deny": ["CUDNN"], "note": "fleet: cuDNN hang"},
            "prod-east": {"force": "FLASHINFER", "note": "east", "rollout": {"percent": 50}},
            "staging": {"policy": "measured", "note": "staging measures"},
        }.items():
            r = api.put(f"/v1/overrides/{scope}", json=spec)
            assert r.status_code == 200, r.text
    # Pods whose agent has a wrong token: refused, counted per claimed cluster.
    for auth in ("Bearer sb_wrong", "Bearer sb_wrong", "Bearer sb_wrong", None):
        headers = {"Authorization": auth} if auth else {}
        r = httpx.post(service.url + "/v1/select", json=east(99), headers=headers)
        assert r.status_code == 401

    with chromium.contexts() as browser:
        try:
            # A viewer: everything to read, not one control.
            page = new_page(browser)
            errors = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, viewer)
            expect(page.locator("#whoami")).to_contain_text("ops-viewer (viewer)")
            expect(page.locator("#overrides li.override")).to_have_count(3)
            expect(page.locator("#rollouts li.rollout")).to_have_count(1)
            expect(page.locator("#pods tbody tr")).to_have_count(7)
            assert page.locator(".ctl").count() == 0
            assert page.locator("#new-override, button[data-act]").count() == 0

            # The refused-selects card says which cluster and why.
            card = page.locator("#refused-card")
            expect(card).to_be_visible()
            line = card.locator(
                'li[data-cluster="prod-east"][data-reason="unknown or revoked token"]'
            )
            expect(line).to_contain_text(
                "3 refused selects from prod-east in the last hour: unknown or revoked token"
            )
            expect(
                card.locator('li[data-cluster="prod-east"][data-reason="missing bearer token"]')
            ).to_contain_text(
                "1 refused select from prod-east in the last hour: missing bearer token"
            )
            screenshot(card, "console-refused.png")

            # One time format everywhere: relative, the UTC time on hover.
            times = page.locator("time").evaluate_all(
                """ts => ts.map(t => ({text: t.textContent, title: t.title,
                    datetime: t.getAttribute('datetime'), prefix: t.dataset.prefix || ''}))"""
            )
            assert len(times) >= 8, times
            for t in times:
                assert RELATIVE.search(t["text"]), t
                assert t["text"].startswith(t["prefix"]), t
                at = datetime.fromisoformat(t["datetime"])
                at = at if at.tzinfo else at.replace(tzinfo=UTC)  # zone-less is UTC
                assert t["title"] == at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"), t
            # no local date-time text (toLocaleString's "12/1/2026, 4:03:04 AM") anywhere
            assert not re.search(r"\d+/\d+/\d{4}, \d+:\d\d", page.locator("body").inner_text())
            page.context.close()

            # An admin limited to prod-*: controls for its clusters, none for * or others.
            page = new_page(browser)
            errors_scoped = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, scoped)
            expect(page.locator("#whoami")).to_contain_text("prod-admin (admin · prod-*)")
            east_item = page.locator('#overrides li.override[data-cluster="prod-east"]')
            expect(east_item.locator('button[data-act="edit"]')).to_be_visible()
            expect(east_item.locator('button[data-act="halt"]')).to_be_visible()
            expect(
                page.locator('#rollouts li.rollout[data-cluster="prod-east"] button[data-act]')
            ).to_have_count(2)  # halt, promote
            fleet = page.locator('#overrides li.override[data-cluster="*"]')
            expect(fleet).to_be_visible()  # readable by all, writable by none of them
            expect(fleet.locator(".ctl")).to_have_count(0)
            # another cluster's override is not even shown to this token
            expect(page.locator("#overrides li.override")).to_have_count(2)
            page.locator("#new-override").click()
            options = page.locator("#ed-scopes option").evaluate_all("os => os.map(o => o.value)")
            assert "*" not in options and "staging" not in options, options
            page.locator("#ed-scope").fill("*")
            page.locator("#ed-force").select_option("FLASH_ATTN")
            page.locator("#ed-note").fill("try the fleet")
            page.locator("#ed-preview-btn").click()
            expect(page.locator("#ed-error")).to_contain_text(
                "Only an admin token without a cluster limit may change the fleet override"
            )
            page.locator("#ed-scope").fill("prod-west")
            page.locator("#ed-preview-btn").click()
            expect(page.locator("#ed-preview .preview")).to_be_visible()
            page.locator("#dialog-close").click()
            # signing out takes every control and the session's data away
            page.locator("#sign-out").click()
            expect(page.locator("#signin")).to_be_visible()
            assert page.locator(".ctl, #pods tbody tr, #refused li").count() == 0
        finally:
            browser.close()
    assert not errors, errors
    assert not errors_scoped, errors_scoped


# ---------------------------------------------------------------- a fleet of pods

# Four full pages of the pager's largest size, each total with its thousands separator:
# the page's paging and filtering are the same at any size, and booting the pods is most
# of this test's time.
PODS = 2_000
PAGE = 500


def test_page_through_a_fleet_of_pods_and_filter_them(
    chromium: SharedChromium, service: ThreadServer
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    started = time.monotonic()
    # PODS pods over 8 clusters and 50 nodes; a third on B200, a fifth in vLLM pods.
    bodies = []
    for i in range(PODS):
        cluster = f"region-{i % 8}"
        b = body(cluster, f"node-{i % 50:03d}", f"pod-{i:05d}", [10, 0] if i % 3 == 0 else [9, 0])
        if i % 5 == 0:
            b["engine"] = VLLM
        bodies.append(b)
    answers = boot(service, bodies)
    print(f"\n{PODS:,} pods booted in {time.monotonic() - started:.1f} s")
    by_cluster = Counter(b["cluster"] for b in bodies)
    b200_vllm_r3 = sum(
        1
        for b in bodies
        if b["cluster"] == "region-3"
        and b["device"]["name"] == "NVIDIA B200"
        and b.get("engine") == VLLM
    )
    assert 0 < b200_vllm_r3 < 100
    trt = sum(a["backend"] == "TRTLLM_RAGGED" for a in answers)

    with chromium.contexts() as browser:
        try:
            page = new_page(browser)
            errors = ConsoleErrors(page, set())
            page.goto(service.url + "/")
            sign_in(page, ADMIN)
            expect(page.locator("#kpi-pods")).to_have_text(f"{PODS:,}")
            rng = page.locator("#pods-range")
            expect(rng).to_have_text(shown_range(1, 100, PODS))
            expect(page.locator("#pods-prev")).to_be_disabled()

            # Every pod once, in order, PAGE a page: each page from the server's cursor.
            page.locator("#pods-limit").select_option(str(PAGE))
            seen: list[str] = []
            pages = PODS // PAGE
            for n in range(pages):
                expect(rng).to_have_text(shown_range(n * PAGE + 1, (n + 1) * PAGE, PODS))
                keys = page.locator("#pods tbody tr").evaluate_all(
                    "rs => rs.map(r => r.dataset.cluster + '/' + r.dataset.pod)"
                )
                assert len(keys) == PAGE
                seen += keys
                if n < pages - 1:
                    page.locator("#pods-next").click()
            expect(page.locator("#pods-next")).to_be_disabled()
            assert len(seen) == len(set(seen)) == PODS
            assert seen == sorted(seen, key=lambda k: (k.split("/")[0],))  # clusters in order
            # back: the stack of cursors
            page.locator("#pods-prev").click()
            expect(rng).to_have_text(shown_range(PODS - 2 * PAGE + 1, PODS - PAGE, PODS))
            page.locator("#pods-limit").select_option("100")
            expect(rng).to_have_text(shown_range(1, 100, PODS))

            # Filters: each one narrows what the server lists, and the total follows.
            def label(select: str, value: str) -> str:
                return str(page.locator(f'{select} option[value="{value}"]').text_content())

            expect(page.locator('#pf-engine option[value="vllm"]')).to_have_text(
                f"vllm ({PODS // 5:,})"
            )
            page.locator("#pf-cluster").select_option("region-3")
            expect(rng).to_have_text(shown_range(1, 100, by_cluster["region-3"]))
            # each choice counts what picking it would list, the other filters kept
            vllm_r3 = sum(1 for b in bodies if b["cluster"] == "region-3" and "engine" in b)
            expect(page.locator('#pf-engine option[value="vllm"]')).to_have_text(
                f"vllm ({vllm_r3})"
            )
            assert label("#pf-cluster", "region-0") == f"region-0 ({by_cluster['region-0']:,})"
            page.locator("#pf-gpu").select_option("NVIDIA B200")
            page.locator("#pf-engine").select_option("vllm")
            expect(rng).to_have_text(shown_range(1, b200_vllm_r3, b200_vllm_r3))
            expect(page.locator('#pf-engine option[value="vllm"]')).to_have_text(
                f"vllm ({b200_vllm_r3})"
            )
            b200_vllm_r0 = sum(
                1
                for b in bodies
                if b["cluster"] == "region-0"
                and b["device"]["name"] == "NVIDIA B200"
                and "engine" in b
            )
            assert label("#pf-cluster", "region-0") == f"region-0 ({b200_vllm_r0})"
            rows = page.locator("#pods tbody tr")
            expect(rows).to_have_count(b200_vllm_r3)
            cells = rows.first.locator("td")
            expect(cells.nth(3)).to_contain_text("NVIDIA B200")
            expect(cells.nth(3)).to_contain_text("sm 10.0")
            expect(cells.nth(4)).to_contain_text("vllm")
            expect(cells.nth(4)).to_contain_text("0.33.0")
            screenshot(page.locator("#pods-card"), "console-pods.png")
            page.locator("#pf-clear").click()
            page.locator("#pf-backend").select_option("TRTLLM_RAGGED")
            expect(rng).to_have_text(shown_range(1, min(100, trt), trt))
            page.locator("#pf-clear").click()
            expect(rng).to_have_text(shown_range(1, 100, PODS))

            # Search by pod or node name prefix (debounced; the server scans a prefix).
            page.locator("#pf-q").fill("pod-0042")
            expect(rows).to_have_count(10)
            assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.pod)")) == {
                f"pod-0042{i}" for i in range(10)
            }
            page.locator("#pf-q").fill("node-007")
            expect(rng).to_have_text(shown_range(1, PODS // 50))
            assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.node)")) == {"node-007"}

            # A row opens the pod's decision: its candidates and their reasons.
            rows.first.click()
            decision = page.locator("#decision")
            expect(decision).to_have_attribute(
                "data-decision-id", rows.first.get_attribute("data-decision") or ""
            )
            expect(page.locator("#candidates tbody tr").first).to_be_visible()
        finally:
            browser.close()
    took = time.monotonic() - started
    print(f"{PODS:,}-pod test: {took:.1f} s")
    assert not errors, errors


def test_doc_images_are_small() -> None:
    """The README's console pictures stay light for the repository."""
    for name in (
        "console-editor.png",
        "console-rollout.png",
        "console-pods.png",
        "console-halted.png",
        "console-refused.png",
        *(
            f"layout-{tag}-{view}.png"
            for tag in ("desktop", "phone")
            for view in ("overview", "pods", "drawer")
        ),
    ):
        path = Path(DOC_IMAGES / name)
        if path.exists():
            assert path.stat().st_size < 300_000, (name, path.stat().st_size)
