"""Rules and overrides: the configuration every replica holds in memory.

Admin writes run in one transaction each together with their audit entry and a bump
of ``config_version`` (how other replicas notice them). Conflicts come back as
values (``Conflict``), never as exceptions the HTTP layer has to guess about.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core import rollouts
from mla_switchboard.core.schemas import SEED_RULES, Override, OverrideSpec, Rollout, RulesDocument
from mla_switchboard.service.state import ConfigSnapshot, Conflict, override_etag, rules_etag
from mla_switchboard.service.store.audit import add_audit
from mla_switchboard.service.store.base import (
    Idempotency,
    Refused,
    Replayed,
    admin_write,
    aware,
)
from mla_switchboard.service.store.models import Meta, OverrideRow, RulesRevision
from mla_switchboard.service.store.tokens import load_tokens
from sqlalchemy import Engine, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session


def _override(row: OverrideRow) -> Override:
    return Override.model_validate(
        {
            **row.spec,
            "cluster": row.cluster,
            "created_at": aware(row.created_at),
            "created_by": row.created_by,
            "revision": row.revision,
        }
    )


@dataclass(eq=False)
class ConfigStore:
    engine: Engine

    def ensure_seeded(self) -> None:
        """Revision 1 of the rules and the version counters, unless already there.

        ``INSERT ... ON CONFLICT DO NOTHING`` (same SQL on both dialects), not
        read-then-insert: replicas starting together on an empty database would both
        read "nothing there" and the second would fail on the primary key.
        """
        insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert
        with Session(self.engine) as s, s.begin():
            s.execute(
                insert(RulesRevision)
                .values(
                    revision=1,
                    document=SEED_RULES.rules_only(),
                    created_at=datetime.now(UTC),
                    created_by="seed",
                )
                .on_conflict_do_nothing(index_elements=["revision"])
            )
            for key in ("config_version", "evidence_version", "evidence_epoch", "fleet_version"):
                s.execute(
                    insert(Meta)
                    .values(key=key, value=1)
                    .on_conflict_do_nothing(index_elements=["key"])
                )

    def config_version(self) -> int:
        return self.versions().get("config_version", 0)

    def versions(self) -> dict[str, int]:
        """``config_version``, ``evidence_version`` (bumped by every new evidence row) and
        ``evidence_epoch`` (bumped when evidence is cleared) in one round trip (the
        poller's)."""
        with Session(self.engine) as s:
            return {row.key: row.value for row in s.execute(select(Meta.key, Meta.value))}

    def load_config(self, previous: ConfigSnapshot | None = None) -> ConfigSnapshot:
        """The configuration as stored now. ``previous``: the snapshot this replica holds;
        its overrides whose stored revision has not moved are kept as they are (every
        change of an override moves its revision), so a reload after one cluster's
        override changed parses that one, not every cluster's, and readers that key
        their work by override (``service/fleet/parts.py``) see the others unchanged."""
        with Session(self.engine) as s:
            version = s.scalar(select(Meta.value).where(Meta.key == "config_version")) or 0
            row = s.scalars(
                select(RulesRevision).order_by(RulesRevision.revision.desc()).limit(1)
            ).one()
            rules = RulesDocument.model_validate(
                {**row.document, "revision": row.revision, "updated_at": aware(row.created_at)}
            )
            overrides = self._overrides(s, previous)
            tokens = load_tokens(s)
        return ConfigSnapshot(version=version, rules=rules, overrides=overrides, tokens=tokens)

    def _overrides(self, s: Session, previous: ConfigSnapshot | None) -> tuple[Override, ...]:
        if previous is None:
            return tuple(_override(o) for o in s.scalars(select(OverrideRow)))
        kept = {(o.cluster, o.revision): o for o in previous.overrides}
        stored = s.execute(select(OverrideRow.cluster, OverrideRow.revision)).all()
        changed = [cluster for cluster, revision in stored if (cluster, revision) not in kept]
        fresh: dict[str, Override] = {}
        for i in range(0, len(changed), 500):
            rows = s.scalars(
                select(OverrideRow).where(OverrideRow.cluster.in_(changed[i : i + 500]))
            )
            fresh.update((o.cluster, _override(o)) for o in rows)
        out = []
        for cluster, revision in stored:
            found = kept.get((cluster, revision)) or fresh.get(cluster)
            if found is not None:  # None: deleted between the two reads (the next has it)
                out.append(found)
        return tuple(out)

    # ------------------------------------------------------------------- rules
    def put_rules(
        self,
        document: RulesDocument,
        *,
        actor: str,
        if_match: str | None,
        note: str | None,
        preview: dict[str, Any] | None,
        merge: Callable[[RulesDocument], RulesDocument] | None = None,
        idempotency: Idempotency | None = None,
    ) -> RulesDocument | Conflict | Replayed:
        """``merge``: what the write makes of the stored document (a token limited to
        some clusters changes only theirs); it runs here, in the write's transaction on
        the revision stored now, not on a replica's copy, and may raise to refuse."""
        try:
            with admin_write(self.engine, idempotency) as (s, _):
                current = s.scalars(
                    select(RulesRevision).order_by(RulesRevision.revision.desc()).limit(1)
                ).one()
                if if_match is not None and if_match != rules_etag(current.revision):
                    raise Refused(Conflict(rules_etag(current.revision)))
                if merge is not None:
                    document = merge(
                        RulesDocument.model_validate(
                            {**current.document, "revision": current.revision}
                        )
                    )
                now = datetime.now(UTC)
                new = add_rules_revision(
                    s, current, document, actor=actor, note=note, preview=preview, now=now
                )
                stored = RulesDocument.model_validate(
                    {**new.document, "revision": new.revision, "updated_at": now}
                )
                if idempotency is not None:
                    idempotency.keep(s, stored)
        except Refused as refused:
            return refused.result
        except IntegrityError:
            # Another writer took the same revision number first (cannot happen while
            # admin_write serialises writers; kept as the answer if it ever does).
            return Conflict(rules_etag(self.load_config().rules.revision or 0))
        return stored

    # --------------------------------------------------------------- overrides
    def get_override(self, cluster: str) -> Override | None:
        with Session(self.engine) as s:
            row = s.get(OverrideRow, cluster)
            return None if row is None else _override(row)

    def put_override(
        self,
        cluster: str,
        spec: OverrideSpec,
        *,
        actor: str,
        if_match: str | None,
        preview: dict[str, Any] | None,
        idempotency: Idempotency | None = None,
    ) -> Override | Conflict | Replayed:
        try:
            with admin_write(self.engine, idempotency) as (s, version):
                row = s.get(OverrideRow, cluster, with_for_update=True)
                current_etag = None if row is None else override_etag(cluster, row.revision)
                if if_match is not None and if_match != (current_etag or '"none"'):
                    raise Refused(Conflict(current_etag or '"none"'))
                before = None if row is None else _override(row).model_dump(mode="json")
                now = datetime.now(UTC)
                payload = rollouts.stored_payload(cluster, spec, now)
                if row is None:
                    row = OverrideRow(cluster=cluster)
                    s.add(row)
                row.spec, row.created_at, row.created_by = payload, now, actor
                row.revision = version
                s.flush()
                after = _override(row)
                add_audit(
                    s,
                    actor=actor,
                    action="override.put",
                    target=cluster,
                    before=before,
                    after=after.model_dump(mode="json"),
                    note=spec.note,
                    preview=preview,
                )
                if idempotency is not None:
                    idempotency.keep(s, after)
        except Refused as refused:
            return refused.result
        return after

    def update_rollout(
        self,
        cluster: str,
        rollout_id: str,
        change: Callable[[Rollout], Rollout | None],
        *,
        actor: str,
        action: str,
        note: str,
        idempotency: Idempotency | None = None,
        if_match: str | None = None,
        preview: dict[str, Any] | None = None,
        cause: dict[str, Any] | None = None,
    ) -> Override | Replayed | Conflict | None:
        """Change the rollout of ``cluster``'s override in one transaction against what
        is stored, audited (``cause``: what a guard's entry is about, as data):
        ``change`` gets the stored rollout and returns its new state,
        or None when there is nothing to do (another replica got there first, or the
        override changed). Returns the new override, or None when nothing changed; a
        stale ``if_match`` (an admin's action on what they saw) is a ``Conflict``."""
        try:
            with admin_write(self.engine, idempotency) as (s, version):
                row = s.get(OverrideRow, cluster, with_for_update=True)
                current = None if row is None else _override(row)
                stale = row is not None and if_match not in (
                    None,
                    override_etag(cluster, row.revision),
                )
                if stale and row is not None:
                    raise Refused(Conflict(override_etag(cluster, row.revision)))
                if current is None or current.rollout is None or current.rollout.id != rollout_id:
                    raise Refused(None)
                changed = change(current.rollout)
                if changed is None:
                    raise Refused(None)
                assert row is not None
                row.spec = {**row.spec, "rollout": changed.model_dump(mode="json")}
                row.revision = version
                s.flush()
                after = _override(row)
                add_audit(
                    s,
                    actor=actor,
                    action=action,
                    target=cluster,
                    before=current.model_dump(mode="json"),
                    after=after.model_dump(mode="json"),
                    note=note,
                    preview=preview,
                    cause=cause,
                )
                if idempotency is not None:
                    idempotency.keep(s, after)
        except Refused as refused:
            result = refused.result
            return result if isinstance(result, Replayed | Conflict) else None
        return after

    def delete_override(
        self,
        cluster: str,
        *,
        actor: str,
        if_match: str | None,
        note: str | None,
        preview: dict[str, Any] | None,
        idempotency: Idempotency | None = None,
    ) -> Override | Conflict | Replayed | None:
        try:
            with admin_write(self.engine, idempotency) as (s, _):
                row = s.get(OverrideRow, cluster, with_for_update=True)
                if row is None:
                    raise Refused(None)
                if if_match is not None and if_match != override_etag(cluster, row.revision):
                    raise Refused(Conflict(override_etag(cluster, row.revision)))
                before = _override(row)
                s.delete(row)
                add_audit(
                    s,
                    actor=actor,
                    action="override.delete",
                    target=cluster,
                    before=before.model_dump(mode="json"),
                    after=None,
                    note=note,
                    preview=preview,
                )
                if idempotency is not None:
                    idempotency.keep(s, before)
        except Refused as refused:
            return refused.result
        return before


def add_rules_revision(
    s: Session,
    current: RulesRevision,
    document: RulesDocument,
    *,
    actor: str,
    note: str | None,
    preview: dict[str, Any] | None,
    now: datetime,
) -> RulesRevision:
    """The rule set's next revision after ``current``, with its ``rules.replace`` audit
    entry, in the caller's transaction (an admin's PUT, or a file's apply)."""
    new = RulesRevision(
        revision=current.revision + 1,
        document=document.rules_only(),
        created_at=now,
        created_by=actor,
    )
    s.add(new)
    add_audit(
        s,
        actor=actor,
        action="rules.replace",
        target="rules",
        before={**current.document, "revision": current.revision},
        after={**new.document, "revision": new.revision},
        note=note,
        preview=preview,
    )
    return new
