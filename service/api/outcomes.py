"""The HTTP edge of ``service/outcomes.py``: values into responses, with the same error
shapes as every other route (``{"detail": {"message": ...}}``; a 422 naming the
field as FastAPI's validation errors do)."""

from __future__ import annotations

from fastapi.responses import Response
from mla_switchboard.service.api.deps import fail, invalid
from mla_switchboard.service.api.json_response import EncodedJSONResponse
from mla_switchboard.service.outcomes import Done, Outcome


def respond(outcome: Outcome) -> Response:
    """``outcome`` as the HTTP answer; a problem is raised as the usual error."""
    if not isinstance(outcome, Done):
        if outcome.status == 422 and outcome.field is not None:
            invalid(outcome.field, outcome.message)
        fail(outcome.status, outcome.message, **outcome.extra)
    headers = {}
    if outcome.etag is not None:
        headers["ETag"] = outcome.etag
    if outcome.replayed:
        headers["Idempotent-Replayed"] = "true"
    if outcome.status == 204:
        return Response(status_code=204, headers=headers)
    return EncodedJSONResponse(outcome.body, status_code=outcome.status, headers=headers)
