"""Regenerate the README's console pictures at 1440x900 and 390x844 (``docs/images/``).

Starts a real ``switchboard serve`` on a throw-away SQLite file, fills it with the
browser tests' fleet (``tests/browser/fleet.py``: a long GPU name, a staged rollout, an
override, measured evidence on a few pods), and photographs the main views in headless
Chromium. Run from the repository root::

    python scripts/screenshots.py            # writes docs/images/layout-*.png

Each picture must stay under 300 KB (``tests/browser/test_console.py`` checks the
README's); the script says which one does not.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser.fleet import fill_fleet  # noqa: E402
from tests.browser.test_dashboard_browser import launch, sign_in  # noqa: E402
from tests.conftest import ADMIN, ServiceProcess  # noqa: E402

OUT = ROOT / "docs" / "images"
LIMIT = 300_000


def shoot(page: object, name: str) -> Path:
    path = OUT / name
    page.screenshot(path=str(path))  # type: ignore[attr-defined]
    size = path.stat().st_size
    print(f"{path.relative_to(ROOT)}: {size / 1000:.0f} KB" + (" TOO BIG" if size > LIMIT else ""))
    return path


def main() -> int:
    from playwright.sync_api import expect, sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        service = ServiceProcess(f"sqlite:///{d / 'switchboard.db'}").start(d)
        try:
            fill_fleet(service)
            with sync_playwright() as p:
                browser = launch(p)
                try:
                    for width, height, tag in ((1440, 900, "desktop"), (390, 844, "phone")):
                        ctx = browser.new_context(
                            viewport={"width": width, "height": height}, locale="en-US"
                        )
                        page = ctx.new_page()
                        page.goto(service.url + "/")
                        sign_in(page, ADMIN)
                        expect(page.locator("#pods tbody tr").first).to_be_visible()
                        expect(page.locator("#fleet-chart")).to_be_visible()
                        page.wait_for_timeout(300)  # the chart's and table's final layout
                        shoot(page, f"layout-{tag}-overview.png")
                        page.locator("#pods-card").scroll_into_view_if_needed()
                        page.evaluate("document.getElementById('pods-card').scrollIntoView()")
                        shoot(page, f"layout-{tag}-pods.png")
                        rtx = page.locator('#pods tr.pod-row[data-cluster="edge-rtx"] button')
                        rtx.first.click()
                        expect(page.locator("#decision")).to_be_visible()
                        page.wait_for_timeout(300)
                        shoot(page, f"layout-{tag}-drawer.png")
                        ctx.close()
                finally:
                    browser.close()
        finally:
            service.stop()
    too_big = [p.name for p in OUT.glob("layout-*.png") if p.stat().st_size > LIMIT]
    if too_big:
        print(f"over {LIMIT // 1000} KB: {', '.join(too_big)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
