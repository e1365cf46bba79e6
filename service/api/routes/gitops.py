"""``/v1/plan`` and ``/v1/apply``: a declarative overrides file (``switchboard
overrides plan|apply``) planned against what is in force and applied in one
transaction (``service/gitops/planning.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from mla_switchboard.core.schemas import StrictBool, error_responses
from mla_switchboard.service.api.deps import AdminDep, DriftDep, OverridesAsCodeDep, ViewerDep
from mla_switchboard.service.api.outcomes import respond
from mla_switchboard.service.gitops.document import OverridesFile
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

FILE_PATHS = ("/v1/plan", "/v1/apply")
"""Paths whose body is a whole file: their size limit is SWITCHBOARD_MAX_FILE_BYTES."""

router = APIRouter(prefix="/v1", tags=["overrides as code"], responses=error_responses(401, 403))

Revision = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._/+-]{1,64}$")]
ETag = Annotated[str, StringConstraints(pattern=r'^"[\x21\x23-\x7e]{1,200}"$')]
ResourceName = Annotated[
    str, StringConstraints(pattern=r"^(rules|override:(\*|[a-z0-9._-]{1,63}))$", max_length=80)
]


class PlanBody(BaseModel):
    """The file's content (as JSON) and whether overrides it does not list are removed."""

    model_config = ConfigDict(extra="forbid")
    file: OverridesFile
    prune: StrictBool = Field(
        default=False, description="remove the overrides (within your scope) the file omits"
    )


class ApplyBody(PlanBody):
    revision: Revision | None = Field(
        default=None,
        description="the file's revision, named in every audit entry (a commit); default: "
        "the sha256 of its content, 12 hex digits",
    )
    etags: dict[ResourceName, ETag] = Field(
        max_length=10_000,
        json_schema_extra={"additionalProperties": False},  # keys: the pattern's only
        description="the plan's etags: each resource must still have it, and every change "
        "apply makes must be named here (otherwise 412: plan again)",
    )


@router.post(
    "/plan",
    summary="What a declarative overrides file changes, and does to the fleet",
    responses=error_responses(413),
)
def plan(body: PlanBody, service: OverridesAsCodeDep, principal: ViewerDep) -> Response:
    """Every override created, changed or removed (with the live resource's ETag) and
    the combined preview of them all: per cluster, pods moving from one backend to
    another and why. Changes nothing; a viewer may ask."""
    return respond(service.plan(principal, body.file, prune=body.prune))


@router.post(
    "/apply",
    summary="Apply a declarative overrides file, all or nothing",
    responses=error_responses(409, 412, 413, 503),
)
def apply(body: ApplyBody, service: OverridesAsCodeDep, principal: AdminDep) -> Response:
    """One transaction, one audit entry per change naming the file's revision and you;
    412 when a resource moved since the plan whose ``etags`` are sent back."""
    return respond(
        service.apply(
            principal, body.file, prune=body.prune, revision=body.revision, etags=body.etags
        )
    )


@router.get("/drift", summary="How live state differs from the last applied overrides file")
def drift(service: DriftDep, principal: ViewerDep) -> Response:
    """The last file applied (revision, when, by whom), each resource that differs from
    it now (what applying it again would change) and the hand changes since, of the
    clusters you may see; ``managed`` false when no file was applied yet."""
    return JSONResponse(service.report(principal))
