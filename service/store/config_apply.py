"""A declarative file's changes written in one transaction: the rules and every
override it changes, each checked against the ETag its plan read (If-Match on every
resource), each with its own audit entry; all of them or none."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core import rollouts
from mla_switchboard.core.schemas import OverrideSpec, RulesDocument
from mla_switchboard.service.state import override_etag, rules_etag
from mla_switchboard.service.store.audit import add_audit
from mla_switchboard.service.store.base import Refused, admin_write
from mla_switchboard.service.store.config import _override, add_rules_revision
from mla_switchboard.service.store.models import OverrideRow, RulesRevision
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

RULES = "rules"
NONE = '"none"'
APPLY_ACTION = "overrides.apply"
APPLY_TARGET = "overrides file"


@dataclass(frozen=True)
class OverrideWrite:
    """One scope's override put (``spec``) or deleted (None), with what its audit
    entry keeps of the plan."""

    cluster: str
    spec: OverrideSpec | None
    preview: dict[str, Any] | None = None


@dataclass(frozen=True)
class Stale:
    """A resource changed since the plan: its name and its ETag now."""

    target: str
    current_etag: str


@dataclass(frozen=True)
class Applied:
    target: str
    action: str
    revision: int | None


def apply_changes(
    engine: Engine,
    *,
    rules: RulesDocument | None,
    overrides: Sequence[OverrideWrite],
    expected: Mapping[str, str],
    actor: str,
    note: str,
    applied_file: dict[str, Any],
) -> list[Applied] | Stale:
    """Write ``rules`` (None: leave them) and ``overrides`` when every resource named in
    ``expected`` (``rules`` or ``override:<scope>``) still has the ETag given there
    (``'"none"'``: absent); otherwise change nothing and say which one moved. The file
    itself (``applied_file``) is kept as the audit entry ``overrides.apply``: what drift
    is measured against."""
    try:
        with admin_write(engine) as (s, version):
            _check(s, expected)
            now = datetime.now(UTC)
            done: list[Applied] = []
            if rules is not None:
                done.append(_put_rules(s, rules, actor=actor, note=note, now=now))
            for write in overrides:
                done.append(_write_override(s, write, version, actor=actor, note=note, now=now))
            add_audit(
                s,
                actor=actor,
                action=APPLY_ACTION,
                target=APPLY_TARGET,
                before=None,
                after=applied_file,
                note=note,
                preview={"changes": len(done)},
            )
    except Refused as refused:
        return refused.result  # type: ignore[no-any-return]
    return done


def _check(s: Session, expected: Mapping[str, str]) -> None:
    for name in sorted(expected):
        if name == RULES:
            current = _current_rules(s)
            etag = rules_etag(current.revision)
        else:
            cluster = name.removeprefix("override:")
            row = s.get(OverrideRow, cluster, with_for_update=True)
            etag = NONE if row is None else override_etag(cluster, row.revision)
        if etag != expected[name]:
            raise Refused(Stale(name, etag))


def _current_rules(s: Session) -> RulesRevision:
    return s.scalars(select(RulesRevision).order_by(RulesRevision.revision.desc()).limit(1)).one()


def _put_rules(
    s: Session, rules: RulesDocument, *, actor: str, note: str, now: datetime
) -> Applied:
    current = _current_rules(s)
    new = add_rules_revision(s, current, rules, actor=actor, note=note, preview=None, now=now)
    return Applied(RULES, "update", new.revision)


def _write_override(
    s: Session, write: OverrideWrite, version: int, *, actor: str, note: str, now: datetime
) -> Applied:
    cluster, spec = write.cluster, write.spec
    row = s.get(OverrideRow, cluster, with_for_update=True)
    before = None if row is None else _override(row).model_dump(mode="json")
    target = f"override:{cluster}"
    if spec is None:
        if row is not None:
            s.delete(row)
        add_audit(
            s,
            actor=actor,
            action="override.delete",
            target=cluster,
            before=before,
            after=None,
            note=f"{note}: not in the file (--prune)",
            preview=write.preview,
        )
        return Applied(target, "delete", None)
    action = "create" if row is None else "update"
    if row is None:
        row = OverrideRow(cluster=cluster)
        s.add(row)
    row.spec = rollouts.stored_payload(cluster, spec, now)
    row.created_at, row.created_by, row.revision = now, actor, version
    s.flush()
    add_audit(
        s,
        actor=actor,
        action="override.put",
        target=cluster,
        before=before,
        after=_override(row).model_dump(mode="json"),
        note=f"{note}: {spec.note}",
        preview=write.preview,
    )
    return Applied(target, action, version)
