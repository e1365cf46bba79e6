"""Token writes: create (the secret shown once) and revoke; only an unrestricted
admin token may do either."""

from __future__ import annotations

from dataclasses import dataclass

from mla_switchboard.service.identity.auth import Principal, new_token
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.outcomes import Done, Outcome, Problem
from mla_switchboard.service.rollouts import SERVICE_ACTOR
from mla_switchboard.service.store.base import OutcomeUnknown, Replayed
from mla_switchboard.service.store.tokens import TokenStore
from mla_switchboard.service.writes.flow import IdempotencyKey, WriteFlow, key_reused, unknown


@dataclass(eq=False)
class TokenWrites:
    tokens: TokenStore
    flow: WriteFlow

    def create_token(
        self,
        principal: Principal,
        *,
        name: str,
        role: str,
        clusters: list[str] | None,
        key: IdempotencyKey | None,
    ) -> Outcome:
        """The secret is in the answer of the request that committed it, and nowhere
        else: not in the store (only its hash), not in the kept answer of an
        Idempotency-Key. A retry with that key learns the token exists; a commit whose
        outcome is unknown revokes the token again, so no usable token stays unseen."""
        if principal.restricted:
            return Problem(403, "only an unrestricted admin token may create tokens")
        token_id, token, secret_hash = new_token()
        public = {"id": token_id, "name": name, "role": role, "clusters": clusters}
        idem = self.flow.idempotency(principal, key, lambda _stored: (201, public))
        try:
            replayed = self.tokens.create_token(
                token_id=token_id,
                name=name,
                role=role,
                clusters=clusters,
                secret_hash=secret_hash,
                actor=principal.actor,
                idempotency=idem,
            )
        except OutcomeUnknown as exc:
            return self._token_unknown(token_id, exc)
        if isinstance(replayed, Replayed):
            if not replayed.same_request:
                return key_reused()
            first = replayed.body.get("id")
            return Problem(
                409,
                f"token {first} was created by the first request with this Idempotency-Key; "
                "its secret was shown only in that answer: if it was lost, revoke the token "
                f"(DELETE /v1/tokens/{first}) and create another",
                extra={"id": first},
            )
        return Done({**public, "token": token, **self.flow.applied()}, status=201)

    def _token_unknown(self, token_id: str, exc: OutcomeUnknown) -> Problem:
        """Find out whether a token whose commit failed was stored, and revoke it if it
        was: its secret was never shown, so it must not stay usable."""
        why = first_line(str(exc))
        try:
            revoked = self.tokens.revoke_token(token_id, actor=SERVICE_ACTOR)
        except Exception:  # the database is still away: say which token to revoke
            return Problem(
                503,
                f"the database failed while storing the token ({why}): token {token_id} may "
                "exist although its secret was never shown; revoke it "
                f"(DELETE /v1/tokens/{token_id}) once the service answers again, and retry",
                extra={"id": token_id},
            )
        done = (
            "it was stored, and is revoked again: its secret was never shown"
            if revoked
            else "it was not stored"
        )
        return Problem(503, f"the database failed while storing the token ({why}); {done}: retry")

    def revoke_token(
        self, principal: Principal, token_id: str, *, key: IdempotencyKey | None
    ) -> Outcome:
        if principal.restricted:
            return Problem(403, "only an unrestricted admin token may revoke tokens")
        idem = self.flow.idempotency(principal, key, lambda _stored: (204, {}))
        try:
            result = self.tokens.revoke_token(token_id, actor=principal.actor, idempotency=idem)
        except OutcomeUnknown as exc:
            return unknown(exc, key)
        if isinstance(result, Replayed):
            return Done({}, status=204, replayed=True) if result.same_request else key_reused()
        if not result:
            return Problem(404, f"no active token {token_id!r}")
        self.flow.applied()
        return Done({}, status=204)
