"""What a service operation answers, as values: the HTTP edge turns them into responses.

Operations (``service/writes/``) never raise for an expected refusal; they return a
``Problem`` with the status and the reason, so their callers (routes, the CLI, tests)
can inspect it, and only the edge decides how it looks on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Done:
    """The operation happened (or had happened: ``replayed`` for an Idempotency-Key
    already used with the same request)."""

    body: dict[str, Any]
    status: int = 200
    etag: str | None = None
    replayed: bool = False


@dataclass(frozen=True)
class Problem:
    """The operation was refused or could not finish. ``field`` names the input at
    fault (a 422 then has FastAPI's validation shape); ``extra`` goes beside the
    message (a 412's ``current_etag``)."""

    status: int
    message: str
    extra: dict[str, Any] = field(default_factory=dict)
    field: tuple[str | int, ...] | None = None


Outcome = Done | Problem
