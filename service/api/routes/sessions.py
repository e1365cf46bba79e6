"""``/v1/sessions``: the people signed in, for admins to see and end.

A session ends on every replica at once (its row is deleted), and the person's open
change streams close within seconds (``GET /v1/events`` checks its caller again every
few seconds). Only an admin of the whole fleet lists or revokes: a session is a
person, not a cluster, and a scoped admin must not learn who else signed in.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from mla_switchboard.core.schemas import error_responses
from mla_switchboard.service.api.deps import AdminDep, PeopleDep, fail
from starlette.concurrency import run_in_threadpool


def fleet_admin_only(name: str, what: str) -> str:
    return f"token {name!r} is limited to some clusters; only a fleet admin may {what}"


router = APIRouter(prefix="/v1/sessions", tags=["admin"], responses=error_responses(401, 403))

SessionId = Annotated[
    str,
    Path(
        pattern=r"^[0-9a-f]{12,64}$",
        description="the session's id as GET /v1/sessions shows it (12 hex digits or more)",
    ),
]


@router.get("", summary="Signed-in people's sessions (never a token)")
async def list_sessions(principal: AdminDep, people: PeopleDep) -> dict[str, Any]:
    if principal.restricted:
        fail(403, fleet_admin_only(principal.name, "list sessions"))
    return {"items": await run_in_threadpool(people.list_sessions)}


@router.delete(
    "/{session}",
    summary="End a session (the person is signed out everywhere)",
    responses=error_responses(404),
)
async def revoke_session(session: SessionId, principal: AdminDep, people: PeopleDep) -> Any:
    if principal.restricted:
        fail(403, fleet_admin_only(principal.name, "revoke sessions"))
    ended = await run_in_threadpool(lambda: people.revoke(session=session))
    if ended == 0:
        fail(404, f"no session {session}: it ended already, or the id is mistyped")
    return JSONResponse({"ended": ended})


@router.delete("", summary="End every session of one person (by subject)")
async def revoke_person(
    principal: AdminDep,
    people: PeopleDep,
    subject: Annotated[str, Query(min_length=1, max_length=255, description="the subject")],
) -> Any:
    if principal.restricted:
        fail(403, fleet_admin_only(principal.name, "revoke sessions"))
    ended = await run_in_threadpool(lambda: people.revoke(subject=subject))
    return JSONResponse({"ended": ended})
