"""What every admin write shares: its Idempotency-Key, the store call answered as
what really happened, and this replica reloading its own committed change."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.live.poller import LiveConfig
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.outcomes import Done, Outcome, Problem
from mla_switchboard.service.state import Conflict
from mla_switchboard.service.store.base import Idempotency, OutcomeUnknown, Replayed
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("switchboard.writes")

IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,200}$"
"""1-200 printable ASCII characters (a UUID, a job id): what HTTP headers carry."""


class IdempotencyKey:
    """A write's Idempotency-Key and what identifies its request (to refuse the same key
    reused for a different change)."""

    def __init__(self, key: str, *parts: Any) -> None:
        self.key = key
        text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
        self.request_hash = hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def of(cls, header: str | None, *parts: Any) -> IdempotencyKey | None:
        """The key a request's ``Idempotency-Key`` header gives (None: no header);
        ``parts`` say what the request asks, so a reused key is told apart."""
        return None if header is None else cls(header, *parts)


Recall = Callable[..., Replayed | None]
"""``recall_idempotency(owner, key, request_hash=None)`` of the store."""

Respond = Callable[[Any], tuple[int, dict[str, Any]]]
"""A write's answer (status, body) from what the store returned."""


@dataclass(eq=False)
class WriteFlow:
    """The steps every write shares (see ``service/writes/__init__.py``)."""

    live: LiveConfig
    recall: Recall

    def idempotency(
        self, principal: Principal, key: IdempotencyKey | None, respond: Respond
    ) -> Idempotency | None:
        if key is None:
            return None
        return Idempotency(principal.id, key.key, key.request_hash, respond)

    def replayed_elsewhere(self, principal: Principal, key: IdempotencyKey) -> bool:
        """Whether this key was used already (the delete it names happened)."""
        return self.recall(principal.id, key.key) is not None

    def recalled(self, principal: Principal, key: IdempotencyKey | None) -> Outcome | None:
        """The kept answer of this key, read before a write's own checks, for writes
        whose checks a retry would fail once the first request went through (None: the
        key is new, or there is none). The write's transaction recalls it again, so
        racing retries still apply once."""
        if key is None:
            return None
        found = self.recall(principal.id, key.key, key.request_hash)
        if found is None:
            return None
        if not found.same_request:
            return key_reused()
        return Done(found.body, status=found.status, replayed=True)

    def write(
        self,
        principal: Principal,
        key: IdempotencyKey | None,
        respond: Respond,
        write: Callable[[Idempotency | None], Any],
        *,
        what: str,
        missing: str | None = None,
    ) -> Outcome:
        result, answered = self.attempt(principal, key, respond, write)
        if answered is not None:
            return answered
        if isinstance(result, Conflict):
            return Problem(
                412,
                f"{what} changed since you read it (If-Match is stale); read it again and retry",
                extra={"current_etag": result.current_etag},
            )
        if result is None:
            return Problem(404, missing or f"no {what}")
        status, body = respond(result)
        return Done({**body, **self.applied()}, status=status)

    def attempt(
        self,
        principal: Principal,
        key: IdempotencyKey | None,
        respond: Respond,
        write: Callable[[Idempotency | None], Any],
    ) -> tuple[Any, Outcome | None]:
        """The store's result of ``write``, or the answer when there is nothing more
        to do: the commit's outcome is unknown, or the key was used before (the first
        answer again, or a key reused for another request)."""
        try:
            result = write(self.idempotency(principal, key, respond))
        except OutcomeUnknown as exc:
            return None, unknown(exc, key)
        if isinstance(result, Replayed):
            if not result.same_request:
                return None, key_reused()
            return None, Done(result.body, status=result.status, replayed=True)
        return result, None

    def applied(self) -> dict[str, Any]:
        """Make this replica see its own committed write now (others follow within the
        poll interval). A failed reload does not undo the commit: say so instead."""
        try:
            self.live.reload()
        except SQLAlchemyError as exc:
            return pending(exc)
        return {}


def pending(exc: Exception) -> dict[str, Any]:
    log.warning("a committed write could not be reloaded at once: %s", first_line(exc))
    return {
        "reload_pending": True,
        "message": "stored and audited; this replica could not reload its configuration "
        f"right after ({first_line(exc)}) and applies the change at its next successful "
        "poll, as every other replica does",
    }


def unknown(exc: OutcomeUnknown, key: IdempotencyKey | None) -> Problem:
    how = (
        "retry with the same Idempotency-Key: it answers what happened"
        if key is not None
        else "read it back before retrying (send an Idempotency-Key to make retries safe)"
    )
    return Problem(
        503,
        f"the database failed while committing ({first_line(str(exc))}): the change may or "
        f"may not be stored; {how}",
    )


def key_reused() -> Problem:
    return Problem(
        422,
        "this Idempotency-Key was used with a different request; use a new key per change",
        field=("header", "idempotency-key"),
    )


def out_of_scope(principal: Principal, cluster: str) -> Problem:
    return Problem(403, principal.out_of_scope(cluster))


def with_etag(outcome: Done, etag: str) -> Done:
    return Done(outcome.body, outcome.status, etag, outcome.replayed)
