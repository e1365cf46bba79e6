"""API tokens: created and revoked as audited admin writes (secrets stored hashed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from mla_switchboard.service.state import TokenRecord
from mla_switchboard.service.store.audit import add_audit
from mla_switchboard.service.store.base import (
    Idempotency,
    Refused,
    Replayed,
    admin_write,
    aware,
)
from mla_switchboard.service.store.models import TokenRow
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session


def token_record(t: TokenRow) -> TokenRecord:
    return TokenRecord(
        id=t.id,
        name=t.name,
        role=t.role,
        clusters=None if t.clusters is None else tuple(t.clusters),
        secret_hash=t.secret_hash,
        created_at=aware(t.created_at),
        revoked=t.revoked_at is not None,
    )


def load_tokens(s: Session) -> dict[str, TokenRecord]:
    """Every token by id (part of the configuration snapshot)."""
    return {t.id: token_record(t) for t in s.scalars(select(TokenRow))}


@dataclass(eq=False)
class TokenStore:
    engine: Engine

    def create_token(
        self,
        *,
        token_id: str,
        name: str,
        role: str,
        clusters: Sequence[str] | None,
        secret_hash: str,
        actor: str,
        idempotency: Idempotency | None = None,
    ) -> Replayed | None:
        """Create a token; a retry with the same ``idempotency`` key is answered with
        what the first request stored (never the secret: it is not stored)."""
        try:
            with admin_write(self.engine, idempotency) as (s, _):
                s.add(
                    TokenRow(
                        id=token_id,
                        name=name,
                        role=role,
                        clusters=None if clusters is None else list(clusters),
                        secret_hash=secret_hash,
                        created_at=datetime.now(UTC),
                        created_by=actor,
                    )
                )
                add_audit(
                    s,
                    actor=actor,
                    action="token.create",
                    target=name,
                    before=None,
                    after={"id": token_id, "name": name, "role": role, "clusters": clusters},
                    note=None,
                    preview=None,
                )
                if idempotency is not None:
                    idempotency.keep(s, token_id)
        except Refused as refused:
            return refused.result  # type: ignore[no-any-return]
        return None

    def revoke_token(
        self, token_id: str, *, actor: str, idempotency: Idempotency | None = None
    ) -> bool | Replayed:
        try:
            with admin_write(self.engine, idempotency) as (s, _):
                row = s.get(TokenRow, token_id, with_for_update=True)
                if row is None or row.revoked_at is not None:
                    raise Refused(False)
                row.revoked_at = datetime.now(UTC)
                add_audit(
                    s,
                    actor=actor,
                    action="token.revoke",
                    target=row.name,
                    before={"id": row.id, "name": row.name, "role": row.role},
                    after=None,
                    note=None,
                    preview=None,
                )
                if idempotency is not None:
                    idempotency.keep(s, token_id)
        except Refused as refused:
            result = refused.result
            return result if isinstance(result, Replayed) else bool(result)
        return True

    def count_tokens(self) -> int:
        with Session(self.engine) as s:
            return s.scalar(select(func.count()).select_from(TokenRow)) or 0
