"""Response headers that belong to a family of paths rather than to a route: set in one
place, as each answer starts, so no route, error handler or middleware answer can miss
them.

- Every API answer (``/v1/*``, ``/metrics``, ``/healthz``, ``/readyz``), errors, 304s and
  the 500 of an unexpected exception included, carries ``Cache-Control: no-store``: they
  hold tokens (``POST /v1/tokens`` answers a secret), pod names and error text, which no
  browser cache or shared proxy should keep. The lean ``POST /v1/select`` handler adds
  the same precomputed header to its own answers (service/api/select_asgi.py), and the
  refusals written on the connection before any route (431, 408, 503 at the connection
  cap: service/api/conn_limits.py ``raw_answer``) carry it in their fixed head.
- The API docs (``/docs``, its assets under ``/docs-assets/``, ``/openapi.json``) carry
  the dashboard's security headers (:data:`SECURITY_HEADERS`: nosniff, no framing, no
  referrer) with a Content-Security-Policy of their own (:func:`docs_csp`).

The dashboard's shell and assets set :data:`SECURITY_HEADERS` themselves
(service/api/routes/dashboard.py), with the dashboard's CSP.
"""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.types import Message, Scope, Send

Header = tuple[bytes, bytes]

NO_STORE: Header = (b"cache-control", b"no-store")

API_PREFIX = "/v1/"
API_PATHS = frozenset({"/v1", "/metrics", "/healthz", "/readyz", "/auth/session"})
DOCS_PATHS = frozenset({"/docs", "/openapi.json"})
DOCS_ASSETS_PREFIX = "/docs-assets/"

DASHBOARD_CSP: dict[str, str] = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self'",
    "connect-src": "'self'",
    "font-src": "'none'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
"""The dashboard's policy: scripts and styles only from this origin, no inline script,
no framing, fetches only to this origin."""


def csp(directives: dict[str, str]) -> str:
    return "; ".join(f"{name} {value}" for name, value in directives.items())


SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": csp(DASHBOARD_CSP),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
"""What every page the service serves to a browser carries (the dashboard's policy;
``/docs`` replaces the Content-Security-Policy with :func:`docs_csp`)."""

_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def docs_csp(page: str) -> str:
    """The dashboard's policy, loosened only where Swagger UI needs it, for the
    ``/docs`` page whose HTML is ``page`` (served as it is, from this process):

    - its one inline ``<script>`` (FastAPI's page starts Swagger UI from it) is allowed
      by its SHA-256, not by ``'unsafe-inline'``: no other inline script can run;
    - styles stay ``'self'``: Swagger UI sets its inline styles through the DOM
      (``element.style``), which a policy does not govern, so no ``'unsafe-inline'``
      (checked in Chromium: tests/browser/test_api_docs_offline.py expands and runs an
      operation under this policy with no violation);
    - ``img-src`` adds ``data:``: swagger-ui.css draws its icons as ``data:`` SVGs.

    Every asset comes from this origin (service/api/app.py serves them offline), so
    no CDN is allowed.
    """
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in _INLINE_SCRIPT.findall(page)
    )
    return csp(
        {
            **DASHBOARD_CSP,
            "script-src": f"'self' {hashes}".strip(),
            "img-src": "'self' data:",
        }
    )


def _encoded(headers: dict[str, str]) -> list[Header]:
    return [
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()
    ]


class EdgeHeaders:
    """Sets the headers of each path family on every answer as it starts (replacing a
    route's own header of the same name). Called by the app for every HTTP request
    FastAPI answers (``SwitchboardAPI.__call__``), outside Starlette's own error
    middleware, so a 500 carries them too."""

    def __init__(self, docs_page: str) -> None:
        self.api: list[Header] = [NO_STORE]
        self.docs: list[Header] = _encoded(
            {**SECURITY_HEADERS, "Content-Security-Policy": docs_csp(docs_page)}
        )

    def headers_for(self, path: str) -> list[Header] | None:
        if path.startswith(API_PREFIX) or path in API_PATHS:
            return self.api
        if path in DOCS_PATHS or path.startswith(DOCS_ASSETS_PREFIX):
            return self.docs
        return None

    def wrap(self, scope: Scope, send: Send) -> Send:
        """``send``, setting the headers of ``scope``'s path (``send`` itself when it
        has none)."""
        extra = self.headers_for(scope["path"])
        if extra is None:
            return send
        names = {name for name, _ in extra}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [h for h in message.get("headers", ()) if h[0].lower() not in names]
                message = {**message, "headers": [*kept, *extra]}
            await send(message)

        return sending
