"""``GET /v1/events``: the changes a console shows, as server-sent events.

One stream per open page. The hub (``service/live/events.py``) says what changed; this
route authenticates the caller as any read does (a bearer token, or a signed-in
person's session cookie), bounds the streams a replica holds, and sends each event
the caller's clusters allow, with a heartbeat while nothing happens.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from mla_switchboard.core.schemas import error_responses
from mla_switchboard.service.api.deps import EventsDep, ViewerDep, require
from mla_switchboard.service.reads import scope
from sse_starlette import EventSourceResponse

router = APIRouter(prefix="/v1/events", tags=["events"], responses=error_responses(401, 403))

RETRY_AFTER_S = 30
# A stream ends after this; the page reconnects at once with Last-Event-ID (nothing is
# lost) and is authenticated again. A revoked token or session is heard for much less:
# the stream asks every few seconds whether its caller may still read (RECHECK_S).
STREAM_LIFETIME_S = 600.0


@router.get(
    "",
    summary="Changes as they happen (server-sent events): overrides, rollouts, rules, "
    "the fleet's counts and the evidence",
    response_class=Response,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "the stream"},
        503: {"description": "this replica holds its fill of streams: poll instead"},
    },
)
async def events(
    request: Request,
    principal: ViewerDep,
    hub: EventsDep,
    last_event_id: Annotated[
        str | None,
        Header(max_length=64, description="the last event's id, to resume after it"),
    ] = None,
) -> Response:
    sub = hub.subscribe()
    if sub is None:
        return JSONResponse(
            {
                "detail": {
                    "message": f"this replica holds its limit of {hub.max_streams} change "
                    "streams (SWITCHBOARD_EVENT_STREAMS_MAX); poll instead, or try again "
                    f"in {RETRY_AFTER_S} s"
                }
            },
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return EventSourceResponse(
        hub.stream(
            sub,
            principal.may_see,
            last_event_id,
            STREAM_LIFETIME_S,
            render=partial(_rendered, principal.may_see if principal.restricted else None),
            still_valid=partial(_still_valid, request),
        ),
        ping=hub.heartbeat_s,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


_viewer = require("viewer")


async def _still_valid(request: Request) -> bool:
    """Whether the stream's caller would still be let in: the same check as at its
    start (a session signed out or revoked, a token revoked or no longer a viewer's)."""
    try:
        await _viewer(request, None)
    except HTTPException:
        return False
    return True


def _rendered(sees: scope.Sees, data: dict[str, Any]) -> dict[str, Any]:
    """A change's data as the caller may read it: a rollout's halt told from its cause
    in the words of the caller's clusters (``reads/scope.halted``)."""
    if "halted_reason" not in data:
        return data
    reason, cause = scope.halted(sees, data["halted_reason"], data.get("halted_cause"))
    return {**data, "halted_reason": reason, "halted_cause": cause}
