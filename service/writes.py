"""Admin writes: overrides, rules, tokens, cleared failures. Each is one transaction
with its audit entry, previewed first where it changes decisions, and answered with
what really happened:

- a stale ``If-Match`` is a 412 and changes nothing;
- with an ``Idempotency-Key``, a retry after a lost answer gets the first answer
  (kept in the write's own transaction) instead of a second change, and a key reused
  for another request is refused;
- once the commit went through, the answer says so, even when this replica cannot
  reload its configuration right after (the database went away): the change is
  stored and audited, and the replica applies it at its next poll;
- a failure *during* the commit is answered as such: the change may or may not be
  stored, and the same Idempotency-Key tells which.

Routes parse and format; this module decides and calls the store.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mla_switchboard.core import rollouts
from mla_switchboard.core.evidence import Situation
from mla_switchboard.core.rollouts import RolloutAction
from mla_switchboard.core.schemas import Override, OverrideSpec, Rollout, RulesDocument
from mla_switchboard.service.auth import OutOfScope, Principal, new_token
from mla_switchboard.service.fleet.preview import Preview
from mla_switchboard.service.fleet.reads import Proposal
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.outcomes import Done, Outcome, Problem
from mla_switchboard.service.rollouts import SERVICE_ACTOR
from mla_switchboard.service.state import Conflict, override_etag, rules_etag
from mla_switchboard.service.store.base import Idempotency, OutcomeUnknown, Replayed
from sqlalchemy.exc import SQLAlchemyError

if TYPE_CHECKING:
    from mla_switchboard.service.runtime import Runtime

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


class Writes:
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    # --------------------------------------------------------------- overrides
    def put_override(
        self,
        principal: Principal,
        cluster: str,
        spec: OverrideSpec,
        *,
        if_match: str | None,
        dry_run: bool,
        key: IdempotencyKey | None,
    ) -> Outcome:
        runtime = self._runtime
        if not principal.may_touch(cluster):
            return _out_of_scope(principal, cluster)
        now = datetime.now(UTC)
        if spec.expires_at is not None and spec.expires_at <= now:
            return Problem(422, "expires_at is in the past", field=("body", "expires_at"))
        proposed = Override.model_validate(
            {
                **rollouts.stored_payload(cluster, spec, now),
                "cluster": cluster,
                "created_at": now,
                "created_by": principal.name,
                "revision": 0,
            }
        )
        preview = self.preview(principal=principal, override_scope=cluster, override=proposed)
        if dry_run:
            return Done({"dry_run": True, "preview": preview.model_dump()})

        outcome = self._write(
            principal,
            key,
            _override_answer(preview, now),
            lambda idem: runtime.store.put_override(
                cluster,
                spec,
                actor=principal.name,
                if_match=if_match,
                preview=audit_counts(preview),
                idempotency=idem,
            ),
            what=f"override {cluster!r}",
        )
        if isinstance(outcome, Done) and not outcome.replayed:
            runtime.metrics.override_writes.labels("put").inc()
        return _with_override_etag(outcome, cluster)

    def delete_override(
        self,
        principal: Principal,
        cluster: str,
        *,
        if_match: str | None,
        dry_run: bool,
        note: str | None,
        key: IdempotencyKey | None,
    ) -> Outcome:
        runtime = self._runtime
        if not principal.may_touch(cluster):
            return _out_of_scope(principal, cluster)
        if not any(o.cluster == cluster for o in runtime.snapshot.overrides):
            runtime.live.reload()  # it may have been written on another replica just now
            if not any(o.cluster == cluster for o in runtime.snapshot.overrides):
                replayed = key is not None and self._replayed_elsewhere(principal, key)
                if not replayed:
                    return Problem(404, f"no override for {cluster!r}")
        preview = self.preview(principal=principal, override_scope=cluster, override=None)
        if dry_run:
            return Done({"dry_run": True, "preview": preview.model_dump()})

        def respond(deleted: Override) -> tuple[int, dict[str, Any]]:
            return 200, {
                "deleted": deleted.model_dump(mode="json"),
                "preview": preview.model_dump(),
            }

        outcome = self._write(
            principal,
            key,
            respond,
            lambda idem: runtime.store.delete_override(
                cluster,
                actor=principal.name,
                if_match=if_match,
                note=note,
                preview=audit_counts(preview),
                idempotency=idem,
            ),
            what=f"override {cluster!r}",
            missing=f"no override for {cluster!r}",
        )
        if isinstance(outcome, Done) and not outcome.replayed:
            runtime.metrics.override_writes.labels("delete").inc()
        return outcome

    def rollout_action(
        self,
        principal: Principal,
        cluster: str,
        action: RolloutAction,
        *,
        note: str,
        to: int | None,
        if_match: str | None,
        dry_run: bool,
        key: IdempotencyKey | None,
    ) -> Outcome:
        """Halt, resume or promote the staged override of ``cluster``, previewed first
        (``dry_run`` answers what would change and changes nothing); audited as
        ``rollout.<action>`` with the admin as actor."""
        runtime = self._runtime
        if not principal.may_touch(cluster):
            return _out_of_scope(principal, cluster)
        replayed = self._recalled(principal, key)
        if replayed is not None:
            # a retry of an action that went through: the rollout's state (or ETag) now
            # refuses the action itself, and the answer is what the first request got
            return _with_override_etag(replayed, cluster)
        current = next((o for o in runtime.snapshot.overrides if o.cluster == cluster), None)
        if current is None or current.rollout is None:
            runtime.live.reload()  # it may have been written on another replica just now
            current = next((o for o in runtime.snapshot.overrides if o.cluster == cluster), None)
        if current is None or current.rollout is None:
            return Problem(404, f"no staged override for {cluster!r}")
        etag = override_etag(cluster, current.revision)
        if if_match is not None and if_match != etag:
            runtime.live.reload()  # this replica's copy may be the older one
            current = next((o for o in runtime.snapshot.overrides if o.cluster == cluster), None)
            if current is None or current.rollout is None:
                return Problem(404, f"no staged override for {cluster!r}")
            etag = override_etag(cluster, current.revision)
        if if_match is not None and if_match != etag:
            # what the admin confirmed is not what is stored: that, not the state the
            # stored rollout happens to be in, is the answer (the store checks it again)
            return Problem(
                412,
                f"override {cluster!r} changed since you read it (If-Match is stale); "
                "read it again and retry",
                extra={"current_etag": etag},
            )
        now = datetime.now(UTC)
        changed = rollouts.acted(
            current.rollout, action, by=principal.name, note=note, now=now, to=to
        )
        if isinstance(changed, str):
            return Problem(409, changed, extra={"state": current.rollout.state})
        proposed = current.model_copy(update={"rollout": changed})
        preview = self.preview(principal=principal, override_scope=cluster, override=proposed)
        if dry_run:
            return Done({"dry_run": True, "rollout": changed.model_dump(mode="json"),
                         "preview": preview.model_dump()})  # fmt: skip

        def change(stored: Rollout) -> Rollout | None:
            again = rollouts.acted(stored, action, by=principal.name, note=note, now=now, to=to)
            return again if isinstance(again, Rollout) else None

        outcome = self._write(
            principal,
            key,
            _override_answer(preview, now),
            lambda idem: runtime.store.update_rollout(
                cluster,
                current.rollout.id,  # type: ignore[union-attr]
                change,
                actor=principal.name,
                action=f"rollout.{action}",
                note=note,
                idempotency=idem,
                if_match=if_match,
                preview=audit_counts(preview),
            ),
            what=f"override {cluster!r}",
            missing=f"the rollout of {cluster!r} changed meanwhile (read it again)",
        )
        if isinstance(outcome, Done) and not outcome.replayed:
            runtime.metrics.rollout_changes.labels(action).inc()
        return _with_override_etag(outcome, cluster)

    # ------------------------------------------------------------------- rules
    def put_rules(
        self,
        principal: Principal,
        document: RulesDocument,
        *,
        if_match: str | None,
        dry_run: bool,
        note: str | None,
        key: IdempotencyKey | None,
    ) -> Outcome:
        runtime = self._runtime
        if if_match is None and document.revision is not None:
            # the document says which revision it was read from: a stale one is a 412,
            # as with If-Match (a replica that had not seen another admin's change
            # handed it out, and writing it back would revert that change)
            if_match = rules_etag(document.revision)
        merge = scoped_merge(principal, document)
        try:
            proposed = merge(runtime.snapshot.rules)
        except OutOfScope:
            runtime.live.reload()  # this replica's copy may be behind the store's
            try:
                proposed = merge(runtime.snapshot.rules)
            except OutOfScope as exc:
                return Problem(403, str(exc))
        preview = self.preview(principal=principal, rules=proposed)
        if dry_run:
            return Done({"dry_run": True, "preview": preview.model_dump()})

        def respond(stored: RulesDocument) -> tuple[int, dict[str, Any]]:
            return 200, {"rules": stored.model_dump(mode="json"), "preview": preview.model_dump()}

        try:
            outcome = self._write(
                principal,
                key,
                respond,
                lambda idem: runtime.store.put_rules(
                    proposed,
                    actor=principal.name,
                    if_match=if_match,
                    note=note,
                    preview={k: v for k, v in preview.model_dump().items() if k != "invalid"},
                    merge=merge,
                    idempotency=idem,
                ),
                what="rules",
            )
        except OutOfScope as exc:
            return Problem(403, str(exc))
        if isinstance(outcome, Done):
            revision = outcome.body.get("rules", {}).get("revision") or 0
            outcome = _with_etag(outcome, rules_etag(revision))
        return outcome

    # ------------------------------------------------------------------ tokens
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
        runtime = self._runtime
        if principal.restricted:
            return Problem(403, "only an unrestricted admin token may create tokens")
        token_id, token, secret_hash = new_token()
        public = {"id": token_id, "name": name, "role": role, "clusters": clusters}
        idem = self._idempotency(principal, key, lambda _stored: (201, public))
        try:
            replayed = runtime.store.create_token(
                token_id=token_id,
                name=name,
                role=role,
                clusters=clusters,
                secret_hash=secret_hash,
                actor=principal.name,
                idempotency=idem,
            )
        except OutcomeUnknown as exc:
            return self._token_unknown(token_id, exc)
        if isinstance(replayed, Replayed):
            if not replayed.same_request:
                return _key_reused()
            first = replayed.body.get("id")
            return Problem(
                409,
                f"token {first} was created by the first request with this Idempotency-Key; "
                "its secret was shown only in that answer: if it was lost, revoke the token "
                f"(DELETE /v1/tokens/{first}) and create another",
                extra={"id": first},
            )
        return Done({**public, "token": token, **self._applied()}, status=201)

    def _token_unknown(self, token_id: str, exc: OutcomeUnknown) -> Problem:
        """Find out whether a token whose commit failed was stored, and revoke it if it
        was: its secret was never shown, so it must not stay usable."""
        why = first_line(str(exc))
        try:
            revoked = self._runtime.store.revoke_token(token_id, actor=SERVICE_ACTOR)
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
        runtime = self._runtime
        if principal.restricted:
            return Problem(403, "only an unrestricted admin token may revoke tokens")
        idem = self._idempotency(principal, key, lambda _stored: (204, {}))
        try:
            result = runtime.store.revoke_token(token_id, actor=principal.name, idempotency=idem)
        except OutcomeUnknown as exc:
            return _unknown(exc, key)
        if isinstance(result, Replayed):
            return Done({}, status=204, replayed=True) if result.same_request else _key_reused()
        if not result:
            return Problem(404, f"no active token {token_id!r}")
        self._applied()
        return Done({}, status=204)

    # ---------------------------------------------------------------- evidence
    def clear_failures(
        self,
        principal: Principal,
        situation: Situation,
        backend: str | None,
        *,
        note: str,
        key: IdempotencyKey | None,
    ) -> Outcome:
        """Evidence is fleet-wide per situation, so only an unrestricted admin may clear
        it. Every replica forgets those failures in place when it reads the clear (this
        one before answering)."""
        runtime = self._runtime
        if principal.restricted:
            return Problem(403, "only an unrestricted admin token may clear fleet-wide evidence")

        def respond(cleared: int) -> tuple[int, dict[str, Any]]:
            return 200, {"cleared": cleared, "situation": asdict(situation), "backend": backend}

        idem = self._idempotency(principal, key, respond)
        try:
            result = runtime.store.clear_failures(
                situation, backend, actor=principal.name, note=note, idempotency=idem
            )
        except OutcomeUnknown as exc:
            return _unknown(exc, key)
        if isinstance(result, Replayed):
            if not result.same_request:
                return _key_reused()
            return Done(result.body, status=result.status, replayed=True)
        _, body = respond(result)
        try:
            runtime.evidence_sync.catch_up()  # this replica at once, as the others will
        except SQLAlchemyError as exc:
            return Done({**body, **_pending(exc)})
        return Done(body)

    # ----------------------------------------------------------------- preview
    def preview(
        self,
        *,
        principal: Principal | None,
        rules: RulesDocument | None = None,
        override_scope: str | None = None,
        override: Override | None = None,
    ) -> Preview:
        """What a change would do; ``principal``: the caller, when it may see only some
        clusters' pods (None: all)."""
        restricted = principal is not None and principal.restricted
        scope = principal.clusters if restricted and principal is not None else None
        visible = principal.may_see if restricted and principal is not None else None
        return self._runtime.reads.preview(
            Proposal(rules, override_scope, override), scope, visible
        )

    def kept_preview(
        self,
        *,
        principal: Principal | None,
        rules: RulesDocument | None = None,
        override_scope: str | None = None,
        override: Override | None = None,
    ) -> Preview | None:
        """``preview``'s answer when it is kept and current, without I/O (the event loop
        may ask before handing a miss to a worker thread)."""
        restricted = principal is not None and principal.restricted
        scope = principal.clusters if restricted and principal is not None else None
        return self._runtime.reads.kept_preview(Proposal(rules, override_scope, override), scope)

    # ------------------------------------------------------------------ common
    def _idempotency(
        self,
        principal: Principal,
        key: IdempotencyKey | None,
        respond: Callable[[Any], tuple[int, dict[str, Any]]],
    ) -> Idempotency | None:
        if key is None:
            return None
        return Idempotency(principal.id, key.key, key.request_hash, respond)

    def _replayed_elsewhere(self, principal: Principal, key: IdempotencyKey) -> bool:
        """Whether this key was used already (the delete it names happened)."""
        return self._runtime.store.recall_idempotency(principal.id, key.key) is not None

    def _recalled(self, principal: Principal, key: IdempotencyKey | None) -> Outcome | None:
        """The kept answer of this key, read before a write's own checks, for writes
        whose checks a retry would fail once the first request went through (None: the
        key is new, or there is none). The write's transaction recalls it again, so
        racing retries still apply once."""
        if key is None:
            return None
        found = self._runtime.store.recall_idempotency(principal.id, key.key, key.request_hash)
        if found is None:
            return None
        if not found.same_request:
            return _key_reused()
        return Done(found.body, status=found.status, replayed=True)

    def _write(
        self,
        principal: Principal,
        key: IdempotencyKey | None,
        respond: Callable[[Any], tuple[int, dict[str, Any]]],
        write: Callable[[Idempotency | None], Any],
        *,
        what: str,
        missing: str | None = None,
    ) -> Outcome:
        try:
            result = write(self._idempotency(principal, key, respond))
        except OutcomeUnknown as exc:
            return _unknown(exc, key)
        if isinstance(result, Replayed):
            if not result.same_request:
                return _key_reused()
            return Done(result.body, status=result.status, replayed=True)
        if isinstance(result, Conflict):
            return Problem(
                412,
                f"{what} changed since you read it (If-Match is stale); read it again and retry",
                extra={"current_etag": result.current_etag},
            )
        if result is None:
            return Problem(404, missing or f"no {what}")
        status, body = respond(result)
        return Done({**body, **self._applied()}, status=status)

    def _applied(self) -> dict[str, Any]:
        """Make this replica see its own committed write now (others follow within the
        poll interval). A failed reload does not undo the commit: say so instead."""
        try:
            self._runtime.live.reload()
        except SQLAlchemyError as exc:
            return _pending(exc)
        return {}


def _pending(exc: Exception) -> dict[str, Any]:
    log.warning("a committed write could not be reloaded at once: %s", first_line(exc))
    return {
        "reload_pending": True,
        "message": "stored and audited; this replica could not reload its configuration "
        f"right after ({first_line(exc)}) and applies the change at its next successful "
        "poll, as every other replica does",
    }


def _unknown(exc: OutcomeUnknown, key: IdempotencyKey | None) -> Problem:
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


def _key_reused() -> Problem:
    return Problem(
        422,
        "this Idempotency-Key was used with a different request; use a new key per change",
        field=("header", "idempotency-key"),
    )


def _out_of_scope(principal: Principal, cluster: str) -> Problem:
    return Problem(403, principal.out_of_scope(cluster))


def _with_etag(outcome: Done, etag: str) -> Done:
    return Done(outcome.body, outcome.status, etag, outcome.replayed)


def _override_answer(
    preview: Preview, now: datetime
) -> Callable[[Override], tuple[int, dict[str, Any]]]:
    """The answer of a write that leaves an override stored: it, and the preview."""

    def respond(stored: Override) -> tuple[int, dict[str, Any]]:
        return 200, {"override": shown(stored, now), "preview": preview.model_dump()}

    return respond


def _with_override_etag(outcome: Outcome, cluster: str) -> Outcome:
    """An override write's answer carries the stored override's ETag (a replayed one
    too: it is read from the kept answer)."""
    if not isinstance(outcome, Done):
        return outcome
    revision = outcome.body.get("override", {}).get("revision")
    return _with_etag(outcome, override_etag(cluster, revision))


def shown(o: Override, now: datetime) -> dict[str, Any]:
    """An override as the API shows it, expired or not."""
    d = o.model_dump(mode="json")
    d["expired"] = o.expires_at is not None and o.expires_at <= now
    return d


def audit_counts(preview: Preview) -> dict[str, Any]:
    """What the audit log keeps of a preview: the counts, not every change row."""
    p = preview.model_dump()
    return {k: p[k] for k in ("pods_total", "pods_changed", "pods_invalid")} | {
        "changes": p["changes"][:20]
    }


def scoped_merge(
    principal: Principal, document: RulesDocument
) -> Callable[[RulesDocument], RulesDocument]:
    """What a PUT of ``document`` by ``principal`` makes of the rules stored now.

    An unrestricted admin replaces the document. A token limited to some clusters
    changes only the rule sets of its clusters: the stored rule sets of every other
    cluster are kept whatever the document says of them (it sees only its own in GET),
    and the fleet lists must be the stored ones. Applied by the store to the revision
    it holds, inside the write's transaction, so a replica's stale copy can never
    carry an old fleet list (or another cluster's rule set) back in.
    """

    def merge(current: RulesDocument) -> RulesDocument:
        if not principal.restricted:
            return document
        if current.default != document.default or current.by_capability != document.by_capability:
            raise OutOfScope(
                f"token {principal.name!r} is limited to clusters; the fleet lists (default, "
                "by_capability) need an unrestricted admin token"
            )
        outside = sorted(c for c in document.clusters if not principal.may_touch(c))
        if outside:
            scope = ", ".join(principal.clusters or ())
            raise OutOfScope(
                f"token {principal.name!r} is limited to clusters {scope}; not {outside[0]!r}"
            )
        kept = {c: r for c, r in current.clusters.items() if not principal.may_touch(c)}
        return document.model_copy(update={"clusters": {**kept, **document.clusters}})

    return merge
