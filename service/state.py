"""The service's shared value types: what the store hands out and the logic reads.

Auth, the live configuration, the selector, the preview and the regret work on these
plain frozen values; the store (``service.store``) builds them from rows. Neither
side imports the other's internals, so storage and decision logic depend on this
module only, never on each other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, NamedTuple

from mla_switchboard.core.schemas import Override, RulesDocument, SelectRequest
from pydantic import ValidationError


@dataclass(frozen=True)
class Conflict:
    """A write refused because the caller's If-Match no longer matches."""

    current_etag: str


@dataclass(frozen=True)
class TokenRecord:
    id: str
    name: str
    role: str
    clusters: tuple[str, ...] | None
    secret_hash: str
    created_at: datetime
    revoked: bool


@dataclass(frozen=True)
class ConfigSnapshot:
    """Everything the hot path needs, loaded in one go and swapped in atomically."""

    version: int
    rules: RulesDocument
    overrides: tuple[Override, ...]
    tokens: dict[str, TokenRecord]


@dataclass(frozen=True)
class PodState:
    cluster: str
    node: str
    pod: str
    decision_id: str
    backend: str
    source: str
    request_json: str

    @cached_property
    def request(self) -> SelectRequest | None:
        """The request the pod sent, parsed once however many readers replay it (the
        summary's regret, exclusions and rollout progress; the preview); None when it
        was recorded under an older schema and cannot be replayed."""
        try:
            return SelectRequest.model_validate_json(self.request_json)
        except ValidationError:
            return None


class Asker(NamedTuple):
    """Who asked for a decision, as it is recorded with it: the principal's id
    (``workload:<pod uid>`` for a verified pod, else the static token's id) and whether
    the pod's identity was verified (service/identity/workload.py)."""

    principal: str | None
    verified: bool


UNKNOWN_ASKER = Asker(None, False)
"""A decision made outside a request (tests, tools): no asker is recorded."""


@dataclass(frozen=True)
class DecisionRecord:
    id: str
    created_at: datetime
    cluster: str
    node: str | None
    pod: str | None
    backend: str
    source: str
    rules_revision: int
    request_json: str
    answer_id: str
    answer_json: str | None  # None when read back without its answer
    principal: str | None = None  # who asked (``rows.Decision``); None on older rows
    verified: bool = False

    @property
    def request(self) -> dict[str, Any]:
        return json.loads(self.request_json)

    @property
    def answer(self) -> dict[str, Any]:
        return {} if self.answer_json is None else json.loads(self.answer_json)


def rules_etag(revision: int) -> str:
    return f'"rules-{revision}"'


def override_etag(cluster: str, revision: int) -> str:
    return f'"override-{cluster}-{revision}"'


__all__ = [
    "ConfigSnapshot",
    "Conflict",
    "DecisionRecord",
    "PodState",
    "TokenRecord",
    "override_etag",
    "rules_etag",
]
