"""``/docs`` renders in headless Chromium with no network beyond the service.

Before, Swagger UI came from a CDN: on an air-gapped GPU cluster ``/docs`` was a blank
page. Every request the page makes to anything but the service's loopback address is
blocked here (and recorded), and the page must still list every operation of the
service's OpenAPI document. It does so under its Content-Security-Policy
(service/api/headers.py): opening an operation and running it ("Try it out") breaks no
rule of the policy.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.browser.test_dashboard_browser import (
    ARTIFACTS,
    TIMEOUT_MS,
    ConsoleErrors,
    _skip_if_missing,
)
from tests.chromium import SharedChromium
from tests.served import Server

pytestmark = pytest.mark.browser

LOOPBACK = {"127.0.0.1", "localhost", "[::1]", "::1"}


def _operations(service: Server) -> list[tuple[str, str]]:
    spec = httpx.get(service.url + "/openapi.json").json()
    return [
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if method in {"get", "put", "post", "delete", "patch"}
    ]


def test_docs_pages_name_no_external_url(service: Server) -> None:
    html = httpx.get(service.url + "/docs").text
    assert re.findall(r"""(?:src|href)=["']?(https?:)?//""", html) == []
    assert "cdn.jsdelivr.net" not in html and "fonts.googleapis.com" not in html
    # ReDoc is gone rather than half offline (its bundle fetches a logo from a CDN)
    assert httpx.get(service.url + "/redoc").status_code == 404
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        r = httpx.get(f"{service.url}/docs-assets/{asset}")
        assert r.status_code == 200 and len(r.content) > 10_000, asset
    assert httpx.get(service.url + "/docs-assets/core.py").status_code == 404
    assert httpx.get(service.url + "/docs-assets/..%2Fapp.py").status_code == 404


def test_docs_render_offline_in_chromium(
    chromium: SharedChromium, service: Server, tmp_path: Path
) -> None:
    _skip_if_missing()
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    operations = _operations(service)
    assert ("POST", "/v1/select") in operations and len(operations) > 10
    blocked: list[str] = []

    def only_loopback(route: object) -> None:
        url = route.request.url  # type: ignore[attr-defined]
        if urlsplit(url).hostname in LOOPBACK or url.startswith(("data:", "blob:")):
            route.continue_()  # type: ignore[attr-defined]
        else:
            blocked.append(url)
            route.abort("internetdisconnected")  # type: ignore[attr-defined]

    with chromium.contexts() as browser:
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.route("**/*", only_loopback)
            page = context.new_page()
            page.add_init_script(
                "window.violations = [];"
                "document.addEventListener('securitypolicyviolation', e =>"
                " window.violations.push(e.violatedDirective + ' ' + e.blockedURI));"
            )
            # running the operation with Swagger UI's example body is refused (422)
            console_errors = ConsoleErrors(page, {401, 422})

            page.goto(service.url + "/docs")
            blocks = page.locator(".opblock")
            expect(blocks).to_have_count(len(operations))
            shown = {
                (
                    block.locator(".opblock-summary-method").inner_text().strip().upper(),
                    block.locator(".opblock-summary-path").get_attribute("data-path"),
                )
                for block in blocks.all()
            }
            assert shown == set(operations)
            expect(
                page.locator(".opblock-post").filter(has_text="/v1/select").first
            ).to_be_visible()
            expect(page.locator(".info .title")).to_contain_text("MLA Switchboard")
            select = page.locator(".opblock-post").filter(has_text="/v1/select").first
            select.locator(".opblock-summary").click()
            select.locator(".try-out__btn").click()
            select.locator(".execute").click()
            expect(
                select.locator(".live-responses-table td.response-col_status").last
            ).to_have_text("422")
            assert page.evaluate("window.violations") == []
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "docs.png"))
        finally:
            browser.close()

    assert blocked == [], f"the docs pages reached out: {blocked}"
    assert not console_errors, "console errors:\n" + "\n".join(console_errors)
