"""The request parameters several routes share, declared once so that every route
reads, checks and documents them alike: ``If-None-Match`` on the reads, and on the
admin writes ``?dry_run``, ``If-Match``, ``Idempotency-Key`` and ``?note``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Query
from mla_switchboard.core.schemas import NO_NUL
from mla_switchboard.service.writes import IDEMPOTENCY_KEY_PATTERN, IdempotencyKey

IfNoneMatch = Annotated[str | None, Header()]
"""The ETag(s) the caller holds: a read that would answer the same gets 304."""

IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="makes a retry safe: a second request with the same key gets the first "
        "one's answer instead of a second change (kept 24 h, per token); 1-200 printable "
        "ASCII characters, e.g. a UUID",
    ),
]

DryRun = Annotated[bool, Query(description="answer the preview and change nothing")]

IfMatch = Annotated[str | None, Header(description="ETag from a GET; stale -> 412")]

AuditNote = Annotated[
    str | None, Query(max_length=2000, pattern=NO_NUL, description="why, for the audit log")
]


@dataclass(frozen=True)
class WriteControls:
    """How an admin write that changes what pods run is sent, besides its body: tried
    first (``?dry_run=true``: the preview, nothing changed), guarded against a stale
    read (``If-Match``) and made safe to retry (``Idempotency-Key``)."""

    dry_run: bool
    if_match: str | None
    idempotency_key: str | None

    def key(self, *parts: Any) -> IdempotencyKey | None:
        """The write's idempotency key (None: no header); ``parts`` say what it asks."""
        return IdempotencyKey.of(self.idempotency_key, *parts)


async def _write_controls(
    dry_run: DryRun = False,
    if_match: IfMatch = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> WriteControls:
    """Async: a sync dependency would cost a thread-pool hop on every request."""
    return WriteControls(dry_run, if_match, idempotency_key)


WriteControlsDep = Annotated[WriteControls, Depends(_write_controls)]
