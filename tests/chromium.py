"""One Chromium for a run of browser tests, a fresh browser context for each test.

Starting Playwright's driver and Chromium costs about 0.7 s of CPU and 1.5 s of wall
time; the browser tests used to pay it once or more per test. A browser context is
Chromium's own unit of isolation (cookies, storage, cache, permissions: what a new
incognito profile has), so tests that each open their own contexts share nothing
through the browser they run in.

Playwright's sync API keeps an event loop running on the thread that started it, and
``asyncio.run`` refuses to run beside it: the browser is therefore stopped when the
next test's file has no test that asks for it (tests/conftest.py), and started again
by the next that does. Browser files go first (tests/conftest.py's order), so a
worker's browser tests mostly run one after the other, on one Chromium.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


class Contexts:
    """What a test sees of the shared browser: ``new_page`` and ``new_context`` as on a
    Playwright ``Browser`` (every page in a context of its own), and ``close``, which
    closes the contexts this test opened and leaves the browser running."""

    def __init__(self, browser: Any) -> None:
        self._browser = browser
        self._opened: list[Any] = []

    def new_context(self, **options: Any) -> Any:
        context = self._browser.new_context(**options)
        self._opened.append(context)
        return context

    def new_page(self, **options: Any) -> Any:
        return self.new_context(**options).new_page()

    def close(self) -> None:
        while self._opened:
            with contextlib.suppress(Exception):  # already closed by the test
                self._opened.pop().close()


class SharedChromium:
    """The worker's Chromium, started on first use and stopped by :meth:`stop`."""

    def __init__(self) -> None:
        self._playwright: Any = None
        self._browser: Any = None

    def _started(self) -> Any:
        if self._browser is None or not self._browser.is_connected():
            self.stop()
            from playwright.sync_api import sync_playwright

            self._playwright = sync_playwright().start()
            self._browser = self._playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        return self._browser

    @contextlib.contextmanager
    def contexts(self) -> Iterator[Contexts]:
        """Contexts of the running browser for one test; all closed on the way out."""
        opened = Contexts(self._started())
        try:
            yield opened
        finally:
            opened.close()

    @property
    def running(self) -> bool:
        return self._playwright is not None

    def stop(self) -> None:
        """Close the browser and Playwright's driver; safe when none runs."""
        browser, playwright = self._browser, self._playwright
        self._browser = self._playwright = None
        if browser is not None:
            with contextlib.suppress(Exception):
                browser.close()
        if playwright is not None:
            playwright.stop()


SHARED = SharedChromium()
