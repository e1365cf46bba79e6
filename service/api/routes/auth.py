"""People's sign-in: the console's "Sign in with <provider>" and its session.

``GET /auth/login`` sends the browser to the identity provider, ``GET /auth/callback``
takes it back and sets the session cookie, ``POST /auth/logout`` ends the session and
``GET /auth/session`` tells the console who is signed in (and the CSRF token its
writes carry). What is checked lives in service/identity/oidc.py and
service/identity/people.py; this module reads and writes cookies and answers a person
with a page, not JSON, where their browser was sent.
"""

from __future__ import annotations

import base64
import html
import json
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from mla_switchboard.service.api.deps import PeopleDep, RelyingPartyDep, person_from
from mla_switchboard.service.api.headers import SECURITY_HEADERS
from mla_switchboard.service.api.outcomes import respond
from mla_switchboard.service.identity.oidc import Pending, RelyingParty
from mla_switchboard.service.identity.people import (
    CSRF_HEADER,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    csrf_ok,
    csrf_token,
)
from mla_switchboard.service.outcomes import Problem
from starlette.exceptions import HTTPException

router = APIRouter(prefix="/auth", include_in_schema=False)

LOGIN_MAX_AGE_S = 600
PAGE_HEADERS = {**SECURITY_HEADERS, "Cache-Control": "no-store"}


def _secure(rp: RelyingParty | None, request: Request) -> bool:
    """Secure cookies when the service is reached over https (its configured callback
    says so, or the request came in over TLS)."""
    url = rp.redirect_url if rp is not None else ""
    return url.startswith("https://") or request.url.scheme == "https"


def _page(problem: Problem) -> HTMLResponse:
    """A person's browser was sent here: say what went wrong in a page, and how back."""
    title = {400: "Sign-in failed", 403: "No access"}.get(problem.status, "Sign-in unavailable")
    body = (
        "<!doctype html><html lang=en><meta charset=utf-8>"
        f"<title>{title} - MLA Switchboard</title>"
        '<link rel="stylesheet" href="/static/dashboard.css">'
        f'<main class="signin"><div class="card signin-card"><h1>{title}</h1>'
        f'<p id="problem">{html.escape(problem.message)}</p>'
        '<p><a href="/">Back to the console</a></p></div></main></html>'
    )
    return HTMLResponse(body, status_code=problem.status, headers=PAGE_HEADERS)


@router.get("/session")
async def session(request: Request, rp: RelyingPartyDep) -> dict[str, Any]:
    """Who is signed in by cookie (``person`` null: no one), and which provider the
    console offers."""
    answer: dict[str, Any] = {
        "provider": None if rp is None else {"name": rp.provider_name, "login_url": "/auth/login"},
        "person": None,
        "csrf_header": CSRF_HEADER,
        "csrf_token": None,
    }
    session_id = request.cookies.get(SESSION_COOKIE)
    if session_id:
        try:
            person = await person_from(request, None)
        except HTTPException:
            return answer
        answer["person"] = {
            "name": person.name,
            "subject": person.subject,
            "role": person.role,
            "clusters": None if person.clusters is None else list(person.clusters),
        }
        answer["csrf_token"] = csrf_token(session_id)
    return answer


@router.get("/login")
async def login(request: Request, rp: RelyingPartyDep) -> Response:
    if rp is None:
        return _page(Problem(404, "no identity provider is configured: sign in with a token"))
    started = await rp.start()
    if isinstance(started, Problem):
        return _page(started)
    url, pending = started
    response = RedirectResponse(url, status_code=302, headers={"Cache-Control": "no-store"})
    kept = json.dumps({"s": pending.state, "n": pending.nonce, "v": pending.verifier})
    response.set_cookie(
        LOGIN_COOKIE,
        base64.urlsafe_b64encode(kept.encode()).decode(),
        max_age=LOGIN_MAX_AGE_S,
        path="/auth/callback",
        httponly=True,
        secure=_secure(rp, request),
        samesite="lax",  # the provider sends the browser back with a top-level GET
    )
    return response


def _pending(request: Request) -> Pending | None:
    raw = request.cookies.get(LOGIN_COOKIE, "")
    try:
        kept = json.loads(base64.urlsafe_b64decode(raw.encode()))
        return Pending(state=str(kept["s"]), nonce=str(kept["n"]), verifier=str(kept["v"]))
    except (ValueError, KeyError, TypeError):
        return None


@router.get("/callback")
async def callback(request: Request, rp: RelyingPartyDep, people: PeopleDep) -> Response:
    if rp is None:
        return _page(Problem(404, "no identity provider is configured: sign in with a token"))
    query = request.query_params
    if "error" in query:
        said = query.get("error_description") or query["error"]
        return _page(Problem(400, f"the identity provider said: {said[:200]}"))
    code, state = query.get("code"), query.get("state")
    if not code or not state:
        return _page(Problem(400, "code, state: the callback needs both"))
    pending = _pending(request)
    if pending is None:
        return _page(
            Problem(
                400,
                "state: this sign-in was not started in this browser, or took longer than "
                f"{LOGIN_MAX_AGE_S // 60} minutes; start again",
            )
        )
    person = await rp.finish(code, state, pending)
    if isinstance(person, Problem):
        return _page(person)
    signed = await anyio.to_thread.run_sync(people.sign_in, person)
    if isinstance(signed, Problem):
        response: Response = _page(signed)
    else:
        session_id, _ = signed
        response = RedirectResponse("/", status_code=303, headers={"Cache-Control": "no-store"})
        response.set_cookie(
            SESSION_COOKIE,
            session_id,
            max_age=int(people.lifetime.total_seconds()),
            path="/",
            httponly=True,
            secure=_secure(rp, request),
            samesite="lax",
        )
    response.delete_cookie(LOGIN_COOKIE, path="/auth/callback")
    return response


@router.post("/logout", status_code=204)
async def logout(request: Request, rp: RelyingPartyDep, people: PeopleDep) -> Response:
    """Ends the session on every replica (its row is deleted) and clears the cookie.
    Like any write a cookie authenticates, it needs the session's CSRF header: a page
    of another site must not be able to sign a person out (login CSRF's twin)."""
    session_id = request.cookies.get(SESSION_COOKIE)
    if session_id:
        if not csrf_ok(session_id, request.headers.get(CSRF_HEADER, "")):
            return respond(
                Problem(
                    403,
                    f"{CSRF_HEADER}: signing out needs the session's CSRF token "
                    "(GET /auth/session), as every write by cookie does",
                    field=CSRF_HEADER,
                )
            )
        await anyio.to_thread.run_sync(people.sign_out, session_id)
    response = Response(status_code=204, headers={"Cache-Control": "no-store"})
    response.delete_cookie(SESSION_COOKIE, path="/", secure=_secure(rp, request))
    return response
