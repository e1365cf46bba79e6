"""The dashboard in a real headless Chromium, against a real service process.

What it proves: the page shell asks for a token and rejects a wrong one; with a
viewer token the fleet chart shows exactly the pods seeded through ``POST /v1/select``
(each pod's latest decision, per cluster and backend, read back from the SVG's data
attributes); the chart refreshes itself; a pod's decision detail shows its candidates
and reasons; the overrides and audit panels show an override written through the API
(or say "not available" on a server without those endpoints); hostile pod names stay
text; and the page logs no console errors beyond the HTTP errors the test provokes.
A full-page screenshot lands in ``test-artifacts/dashboard.png``.
"""

from __future__ import annotations

import re
import shutil
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from mla_switchboard.core.specs import SPECS, Backend

from tests.chromium import ARGS, CHROMIUM, SharedChromium
from tests.conftest import ADMIN, ROOT
from tests.served import Server, ThreadServer

pytestmark = pytest.mark.browser

ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOT = ARTIFACTS / "dashboard.png"
TIMEOUT_MS = 10_000

R1 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_heads": 128}
ALL = {"torch": "2.11.0", "flashinfer": "0.7.2", "cudnn": "1.32.0", "flash_attn": "2.8.3"}
# A pod name that would run script if the page ever parsed API strings as HTML.
HOSTILE_POD = '<img src=x onerror="window.__xss=1">-ü'


def _requirements() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} not found (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "python package playwright not installed (pip install playwright)"
    return None


def _skip_if_missing() -> None:
    reason = _requirements()
    if reason:
        print(f"SKIP browser test: {reason}")
        pytest.skip(reason)


def body(
    cluster: str,
    node: str,
    pod: str,
    cap: list[int] | None,
    packages: dict[str, str] | None = ALL,  # type: ignore[assignment]
    **kw: Any,
) -> dict[str, Any]:
    name = {10: "NVIDIA B200", 9: "NVIDIA H200"}.get(cap[0] if cap else -1, "cpu")
    return {
        "cluster": cluster,
        "node": node,
        "pod": pod,
        "device": {"name": name, "capability": cap},
        "model": {"name": "deepseek-ai/DeepSeek-R1", **R1},
        "dtype": "bfloat16",
        "packages": packages,
        **kw,
    }


# (cluster, node, pod, capability, packages, extra) in sending order; a pod sent twice
# counts once, with its latest answer.
SEED: list[tuple[str, str, str, list[int] | None, dict[str, str] | None, dict[str, Any]]] = [
    *[("prod-east", "h-1", f"r1-{i}", [9, 0], ALL, {}) for i in range(5)],
    *[("prod-east", "b-1", f"r1-b{i}", [10, 0], ALL, {}) for i in range(3)],
    ("prod-east", "b-2", "r1-cudnn", [10, 0], {"torch": "2", "cudnn": "1"}, {}),
    # asks for FLASHINFER without having it: falls back, with the reason on record
    ("prod-east", "h-2", "r1-asks-fi", [9, 0], {"torch": "2"}, {"requested_backend": "FLASHINFER"}),
    *[("prod-west", "b-7", f"v3-{i}", [10, 0], ALL, {}) for i in range(7)],
    ("prod-west", "b-8", "v3-fi", [10, 0], ALL, {"requested_backend": "FLASHINFER"}),
    ("prod-west", "cpu-1", "v3-cpu", None, ALL, {}),
    # decided twice: first as Hopper, then on a Blackwell node; only the latter counts
    ("staging", "n-1", "moved", [9, 0], ALL, {}),
    ("staging", "n-1", "moved", [10, 0], ALL, {}),
    ("staging", "n-2", HOSTILE_POD, [9, 0], ALL, {}),
    ("lab.gpu-research-cluster-01", "a-1", "turing-0", [7, 5], ALL, {}),
]


def seed(service: Server) -> dict[str, Counter[str]]:
    """Send the seed decisions; return the expected summary from their answers."""
    latest: dict[tuple[str, str, str], tuple[str, str]] = {}
    with service.client() as api:
        for cluster, node, pod, cap, packages, extra in SEED:
            r = api.post("/v1/select", json=body(cluster, node, pod, cap, packages, **extra))
            assert r.status_code == 200, r.text
            latest[(cluster, node, pod)] = (cluster, r.json()["backend"])
    expected: dict[str, Counter[str]] = defaultdict(Counter)
    for cluster, backend in latest.values():
        expected[cluster][backend] += 1
    return dict(expected)


def chart_counts(page: Any) -> dict[str, Counter[str]]:
    """Pods per cluster and backend as the SVG draws them (data attributes)."""
    rows = page.eval_on_selector_all(
        "#fleet-chart g.row",
        """rows => rows.map(r => ({
            cluster: r.dataset.cluster,
            total: Number(r.dataset.total),
            segs: [...r.querySelectorAll('rect.seg')].map(s =>
                [s.dataset.backend, Number(s.dataset.pods)]),
        }))""",
    )
    counts: dict[str, Counter[str]] = {}
    for row in rows:
        c = Counter({b: n for b, n in row["segs"]})
        assert row["total"] == sum(c.values()), row
        counts[row["cluster"]] = c
    return counts


def make_token(service: Server, role: str) -> str | None:
    """A token of ``role`` through POST /v1/tokens; None on a server without it."""
    with service.client() as api:
        r = api.post("/v1/tokens", json={"name": f"dash-{role}", "role": role, "clusters": None})
    if r.status_code == 404:
        return None
    assert r.status_code in (200, 201), r.text
    return r.json()["token"]


def launch(p: Any) -> Any:
    """A Chromium of its own, for a test that must not share the worker's (timing)."""
    return p.chromium.launch(executable_path=CHROMIUM, args=ARGS)


class ConsoleErrors(list[str]):
    """Console errors and uncaught page errors, minus the HTTP errors a test provokes on
    purpose (Chromium logs each as "Failed to load resource: ... status of 401 ...")."""

    def __init__(self, page: Any, allowed_statuses: set[int]) -> None:
        super().__init__()
        self.allowed = allowed_statuses
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.append(f"page error: {exc}"))

    def _console(self, msg: Any) -> None:
        if msg.type != "error":
            return
        text = msg.text
        if text.startswith("Failed to load resource") and any(
            f"status of {s} " in text for s in self.allowed
        ):
            return
        self.append(f"{text} @ {msg.location.get('url')}")


def sign_in(page: Any, token: str) -> None:
    page.locator("#token-input").fill(token)
    page.locator("#signin-form button[type=submit]").click()


def test_dashboard_in_chromium(
    chromium: SharedChromium, service: ThreadServer, tmp_path: Path
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    expected = seed(service)
    assert len(expected) == 4

    # The shell is open and strict; the data is not.
    shell = httpx.get(service.url + "/")
    assert shell.status_code == 200
    assert "default-src 'self'" in shell.headers["content-security-policy"]
    assert shell.headers["x-content-type-options"] == "nosniff"
    assert "lab.gpu-research" not in shell.text and "r1-asks-fi" not in shell.text
    assert httpx.get(service.url + "/v1/selections/summary").status_code == 401
    assert httpx.get(service.url + "/static/..%2Fcli.py").status_code == 404

    viewer = make_token(service, "viewer") or ADMIN
    with service.client() as api:
        has_overrides = api.get("/v1/overrides").status_code != 404
        has_audit = api.get("/v1/audit?limit=1").status_code != 404

    allowed_statuses = {401}  # the wrong token below
    if not has_overrides or not has_audit:
        allowed_statuses.add(404)
    stopped_at: int | None = None  # how many errors were logged before step 8's stop

    with chromium.contexts() as browser:
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            # Fake timers (time still flows) so the 10 s auto-refresh can be fast-forwarded.
            context.clock.install()
            page = context.new_page()
            console_errors = ConsoleErrors(page, allowed_statuses)

            page.goto(service.url + "/")

            # 1. The token prompt; a wrong token is rejected and we stay on the form.
            expect(page.locator("#signin")).to_be_visible()
            expect(page.locator("#app")).to_be_hidden()
            sign_in(page, "sb_000000000000_not-a-real-token")
            expect(page.locator("#signin-error")).to_contain_text("Token rejected")
            expect(page.locator("#app")).to_be_hidden()

            # 2. The right token: the chart shows exactly what was seeded.
            sign_in(page, viewer)
            expect(page.locator("#app")).to_be_visible()
            expect(page.locator("#fleet-chart g.row")).to_have_count(len(expected))
            assert chart_counts(page) == expected
            total = sum(sum(c.values()) for c in expected.values())
            expect(page.locator("#kpi-pods")).to_have_text(str(total))
            expect(page.locator("#kpi-clusters")).to_have_text(str(len(expected)))
            east = page.locator('#fleet-chart g.row[data-cluster="prod-east"]')
            expect(east.locator("text.row-total")).to_have_text(
                f"{sum(expected['prod-east'].values())} pods"
            )
            # Every backend has a legend entry, with its fleet-wide count.
            fleet = sum(expected.values(), Counter())
            for backend in Backend:
                item = page.locator(f'#legend li[data-backend="{backend}"]')
                expect(item.locator(".legend-count")).to_have_text(str(fleet[backend]))
                # its colour is its registry slot (from GET /v1/backends), as in the chart
                slot = re.compile(rf"\bbc-{SPECS[backend].colour}\b")
                expect(item.locator(".swatch")).to_have_class(slot)
            # found and read in one task of the page: a live redraw between finding the
            # swatches and reading them would leave detached elements (no style)
            colours = page.evaluate(
                """() => [...document.querySelectorAll("#legend .swatch")]
                    .map((e) => getComputedStyle(e).backgroundColor)"""
            )
            assert len(set(colours)) == len(Backend), colours  # no two alike, none the fallback
            segment = page.locator("#fleet-chart rect.seg").first
            backend = Backend(segment.get_attribute("data-backend"))
            expect(segment).to_have_class(re.compile(rf"\bbc-{SPECS[backend].colour}\b"))
            expect(page.locator("#last-updated")).to_contain_text("Last updated")
            assert page.evaluate("sessionStorage.length") == 1

            # 3. Auto-refresh: a new pod shows up after 10 s without a click.
            with service.client() as api:
                r = api.post("/v1/select", json=body("prod-west", "b-9", "late", [10, 0]))
                assert r.status_code == 200, r.text
            expected["prod-west"][r.json()["backend"]] += 1
            page.clock.fast_forward(10_500)
            west = page.locator('#fleet-chart g.row[data-cluster="prod-west"]')
            expect(west).to_have_attribute("data-total", str(sum(expected["prod-west"].values())))
            assert chart_counts(page) == expected

            # 4. Overrides and audit: written through the API, read by the page.
            if has_overrides:
                now = datetime.now(UTC)
                # The API refuses an expiry in the past: give staging one that is
                # over by the time the page looks.
                writes = {
                    "staging": {
                        "force": "FLASH_ATTN",
                        "expires_at": (now + timedelta(seconds=1)).isoformat(),
                        "note": "FA3 canary <b>finished</b>",
                    },
                    "prod-east": {
                        "force": "TORCH_SDPA",
                        "deny": [],
                        "model": None,
                        "expires_at": (now + timedelta(hours=1)).isoformat(),
                        "note": "incident 123",
                    },
                    "*": {
                        "deny": ["CUDNN"],
                        "model": "deepseek-ai/*",
                        "note": "cuDNN frontend hang on long prefills, see INC-482",
                    },
                }
                with service.client() as api:
                    for scope, spec in writes.items():
                        r = api.put(f"/v1/overrides/{scope}", json=spec)
                        assert r.status_code in (200, 201), r.text
                time.sleep(max(0.0, (now - datetime.now(UTC)).total_seconds() + 1.2))
                page.locator("#refresh").click()
                item = page.locator('#overrides li.override[data-cluster="prod-east"]')
                expect(item).to_be_visible()
                expect(item).to_contain_text("TORCH_SDPA")
                expect(item).to_contain_text("incident 123")
                expect(item).to_contain_text("expires in")
                expect(item).to_have_attribute("data-expired", "false")
                fleet_item = page.locator('#overrides li.override[data-cluster="*"]')
                expect(fleet_item).to_contain_text("whole fleet")
                expect(fleet_item).to_contain_text("no expiry")
                expired = page.locator('#overrides li.override[data-cluster="staging"]')
                expect(expired).to_have_attribute("data-expired", "true")
                expect(expired).to_have_class("override expired")
                expect(expired).to_contain_text(re.compile(r"expired \d+ s ago"))
                expect(expired).to_contain_text("FA3 canary <b>finished</b>")  # as text
                expect(page.locator("#kpi-overrides")).to_have_text("2")

                # A pod that boots now gets the override, and its detail says which.
                with service.client() as api:
                    r = api.post("/v1/select", json=body("prod-east", "h-3", "r1-late", [9, 0]))
                    assert r.status_code == 200, r.text
                assert (r.json()["backend"], r.json()["source"]) == ("TORCH_SDPA", "override")
                expected["prod-east"]["TORCH_SDPA"] += 1
                page.locator("#lookup-cluster").fill("prod-east")
                page.locator("#lookup-pod").fill("r1-late")
                page.locator("#lookup button[type=submit]").click()
                decision = page.locator("#decision")
                expect(decision).to_have_attribute("data-source", "override")
                expect(decision).to_have_attribute("data-backend", "TORCH_SDPA")
                applied = page.locator("#decision-overrides")
                expect(applied).to_contain_text("incident 123")
                expect(applied).to_contain_text("whole fleet")
                page.locator("#refresh").click()
                expect(east).to_have_attribute(
                    "data-total", str(sum(expected["prod-east"].values()))
                )
            else:
                expect(page.locator("#overrides")).to_contain_text("not available")
            if has_audit:
                entry = page.locator('#audit li.audit-entry[data-action="override.put"]')
                if has_overrides:
                    expect(entry).to_have_count(3)
                    east_entry = entry.filter(has_text="incident 123")
                    expect(east_entry).to_contain_text("prod-east")
                    expect(east_entry).to_contain_text("by bootstrap-admin")
                    expect(entry.filter(has_text="INC-482")).to_contain_text("whole fleet")
            else:
                expect(page.locator("#audit")).to_contain_text("not available")

            # 5. Decision detail: candidates with validity and reasons.
            page.locator("#lookup-cluster").fill("prod-east")
            page.locator("#lookup-pod").fill("r1-asks-fi")
            page.locator("#lookup button[type=submit]").click()
            decision = page.locator("#decision")
            expect(decision).to_have_attribute("data-backend", "FLASH_ATTN")
            expect(decision).to_have_attribute("data-source", "priority")
            expect(page.locator("#decision-messages")).to_contain_text(
                "Requested MLA prefill backend FLASHINFER is not valid"
            )
            rows = page.locator("#candidates tbody tr")
            expect(rows).to_have_count(len(Backend))  # every backend, valid or not
            fi = page.locator('#candidates tr[data-backend="FLASHINFER"]')
            expect(fi).to_have_attribute("data-valid", "false")
            expect(fi).to_contain_text("✗")
            expect(fi).to_contain_text("required package flashinfer not installed")
            trt = page.locator('#candidates tr[data-backend="TRTLLM_RAGGED"]')
            expect(trt).to_contain_text("compute capability 9.0 not supported (needs 10.x)")
            fa = page.locator('#candidates tr[data-backend="FLASH_ATTN"]')
            expect(fa).to_have_attribute("data-valid", "true")
            expect(fa).to_contain_text("✓")

            # A pod that was never seen says so.
            page.locator("#lookup-pod").fill("no-such-pod")
            page.locator("#lookup button[type=submit]").click()
            expect(page.locator("#detail-empty")).to_contain_text("no-such-pod")

            # 6. Choosing a cluster bar filters the pod table to it (the server-paged
            # table replaced the list of a cluster's 50 latest decisions); hostile names
            # stay text. (by keyboard: the rows are focusable buttons)
            page.locator('#fleet-chart g.row[data-cluster="staging"]').press("Enter")
            expect(page.locator("#pf-cluster")).to_have_value("staging")
            pods = page.locator("#pods-table")
            expect(pods.locator("tbody tr")).to_have_count(2)  # "moved" once: latest only
            expect(pods.locator("tbody tr[data-cluster=staging]")).to_have_count(2)
            expect(pods).to_contain_text(HOSTILE_POD)
            assert page.evaluate("window.__xss") is None
            assert page.locator("#pods-table img").count() == 0
            # ... and its detail button opens the decision.
            pods.locator('tr[data-pod="moved"] button').click()
            expect(page.locator("#decision")).to_have_attribute("data-backend", "TRTLLM_RAGGED")

            # Back to the top for the picture: the whole page, everything loaded.
            page.locator('#fleet-chart g.row[data-cluster="prod-east"]').click()
            expect(pods.locator("tbody tr")).to_have_count(sum(expected["prod-east"].values()))
            page.locator("#lookup-cluster").fill("prod-east")
            page.locator("#lookup-pod").fill("r1-asks-fi")
            page.locator("#lookup button[type=submit]").click()
            expect(page.locator("#decision")).to_have_attribute("data-backend", "FLASH_ATTN")
            page.evaluate("window.scrollTo(0, 0)")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            print(f"\ndashboard screenshot: {SCREENSHOT}")

            # 7. A token without the viewer role is told so.
            agent = make_token(service, "agent")
            if agent is not None:
                allowed_statuses.add(403)
                page.locator("#sign-out").click()
                expect(page.locator("#signin")).to_be_visible()
                assert page.evaluate("sessionStorage.length") == 0
                sign_in(page, agent)
                expect(page.locator("#signin-error")).to_contain_text("lacks the viewer role")

            # 8. The service goes away: a banner, and the last data stays.
            page.locator("#token-input").fill(viewer)
            page.locator("#signin-form button[type=submit]").click()
            expect(page.locator("#fleet-chart g.row")).to_have_count(len(expected))
            stopped_at = len(console_errors)
            service.stop()
            page.locator("#refresh").click()
            expect(page.locator("#banner")).to_contain_text("Cannot reach the service")
            # since when the page shows older data: the page's one time format
            expect(page.locator("#banner")).to_contain_text("Showing data loaded")
            loaded = page.locator("#banner time")
            expect(loaded).to_have_text(re.compile(r"^(\d+ s ago|just now)$"))
            at = datetime.fromisoformat(loaded.get_attribute("datetime") or "")
            expect(loaded).to_have_attribute(
                "title", at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            )
            expect(page.locator("#fleet-chart g.row")).to_have_count(len(expected))
            assert chart_counts(page) == expected
        finally:
            browser.close()

    # Chromium logs the refused connections, and those the stop cut off mid-answer (the
    # change stream, a read in flight): step 8's doing, until the page is closed (the
    # stream's reconnects and the refreshes after it keep trying). A stop whose graceful
    # end outlasts its timeout (a loaded machine) cuts the change stream between two
    # chunks: INCOMPLETE_CHUNKED_ENCODING. Errors logged before the stop all count.
    provoked = (
        "ERR_CONNECTION_REFUSED",
        "ERR_CONNECTION_RESET",
        "ERR_CONNECTION_CLOSED",
        "ERR_EMPTY_RESPONSE",
        "ERR_SOCKET_NOT_CONNECTED",
        "ERR_INCOMPLETE_CHUNKED_ENCODING",
    )
    if stopped_at is not None:
        console_errors[stopped_at:] = [
            e for e in console_errors[stopped_at:] if not any(p in e for p in provoked)
        ]
    assert not console_errors, "console errors:\n" + "\n".join(console_errors)


def test_dashboard_without_overrides_and_audit(
    chromium: SharedChromium, service: ThreadServer
) -> None:
    """A server without /v1/overrides and /v1/audit (404): those panels say so and the
    rest of the page works; no error banner, since nothing is broken."""
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    with service.client() as api:
        r = api.post("/v1/select", json=body("solo", "n-1", "p-0", [9, 0]))
        assert r.status_code == 200, r.text

    with chromium.contexts() as browser:
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            console_errors = ConsoleErrors(page, {404})
            not_found = {
                "status": 404,
                "content_type": "application/json",
                "body": '{"detail": "Not Found"}',
            }
            for path in ("/v1/overrides", "/v1/audit"):
                page.route(
                    re.compile(re.escape(service.url + path) + r"(\?.*)?$"),
                    lambda route: route.fulfill(**not_found),
                )
            page.goto(service.url + "/")
            sign_in(page, ADMIN)
            expect(page.locator("#fleet-chart g.row")).to_have_count(1)
            expect(page.locator("#overrides")).to_contain_text("not available")
            expect(page.locator("#audit")).to_contain_text("not available")
            expect(page.locator("#kpi-overrides")).to_have_text("\u2013")  # an en dash: unknown
            expect(page.locator("#banner")).to_be_hidden()
            assert chart_counts(page) == {"solo": Counter({"FLASH_ATTN": 1})}
        finally:
            browser.close()
    assert not console_errors, "console errors:\n" + "\n".join(console_errors)


def test_screenshot_dir_is_ignored() -> None:
    """The screenshot must never be committed by accident."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    import subprocess

    r = subprocess.run(
        ["git", "check-ignore", "-q", str(SCREENSHOT)], cwd=ROOT, capture_output=True
    )
    assert r.returncode == 0, "test-artifacts/ should be git-ignored"
