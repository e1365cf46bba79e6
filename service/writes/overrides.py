"""Override writes: put, delete, and a staged rollout's halt / resume / promote.
Each is previewed first (``dry_run`` answers the preview and changes nothing), then
written with its audit entry in one transaction (``service/writes/flow.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core import rollouts
from mla_switchboard.core.rollouts import RolloutAction
from mla_switchboard.core.schemas import Override, OverrideSpec, Rollout
from mla_switchboard.service.fleet.preview import Preview
from mla_switchboard.service.fleet.reads import Proposal
from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.live.poller import LiveConfig
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.outcomes import Done, Outcome, Problem
from mla_switchboard.service.reads.overrides import shown
from mla_switchboard.service.reads.previews import Previews
from mla_switchboard.service.state import override_etag
from mla_switchboard.service.store.config import ConfigStore
from mla_switchboard.service.writes.flow import (
    IdempotencyKey,
    WriteFlow,
    out_of_scope,
    with_etag,
)
from mla_switchboard.service.writes.managed import ManagedScopes


@dataclass(eq=False)
class OverrideWrites:
    config: ConfigStore
    live: LiveConfig
    previews: Previews
    flow: WriteFlow
    metrics: Metrics
    managed: ManagedScopes = field(default_factory=ManagedScopes)
    """Scopes a file synced in declarative mode owns: their writes are refused."""

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
        if not principal.may_touch(cluster):
            return out_of_scope(principal, cluster)
        if (owned := self.managed.override(cluster)) is not None:
            return Problem(409, owned)
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
        preview = self.previews.preview(
            principal, Proposal(override_scope=cluster, override=proposed)
        )
        if dry_run:
            return Done({"dry_run": True, "preview": preview.model_dump()})

        outcome = self.flow.write(
            principal,
            key,
            _override_answer(preview, now),
            lambda idem: self.config.put_override(
                cluster,
                spec,
                actor=principal.actor,
                if_match=if_match,
                preview=audit_counts(preview),
                idempotency=idem,
            ),
            what=f"override {cluster!r}",
        )
        if isinstance(outcome, Done) and not outcome.replayed:
            self.metrics.override_writes.labels("put").inc()
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
        if not principal.may_touch(cluster):
            return out_of_scope(principal, cluster)
        if (owned := self.managed.override(cluster)) is not None:
            return Problem(409, owned)
        if not any(o.cluster == cluster for o in self.live.current().overrides):
            self.live.reload()  # it may have been written on another replica just now
            if not any(o.cluster == cluster for o in self.live.current().overrides):
                replayed = key is not None and self.flow.replayed_elsewhere(principal, key)
                if not replayed:
                    return Problem(404, f"no override for {cluster!r}")
        preview = self.previews.preview(principal, Proposal(override_scope=cluster, override=None))
        if dry_run:
            return Done({"dry_run": True, "preview": preview.model_dump()})

        def respond(deleted: Override) -> tuple[int, dict[str, Any]]:
            return 200, {
                "deleted": deleted.model_dump(mode="json"),
                "preview": preview.model_dump(),
            }

        outcome = self.flow.write(
            principal,
            key,
            respond,
            lambda idem: self.config.delete_override(
                cluster,
                actor=principal.actor,
                if_match=if_match,
                note=note,
                preview=audit_counts(preview),
                idempotency=idem,
            ),
            what=f"override {cluster!r}",
            missing=f"no override for {cluster!r}",
        )
        if isinstance(outcome, Done) and not outcome.replayed:
            self.metrics.override_writes.labels("delete").inc()
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
        if not principal.may_touch(cluster):
            return out_of_scope(principal, cluster)
        replayed = self.flow.recalled(principal, key)
        if replayed is not None:
            # a retry of an action that went through: the rollout's state (or ETag) now
            # refuses the action itself, and the answer is what the first request got
            return _with_override_etag(replayed, cluster)
        current = self._staged(cluster, if_match)
        if isinstance(current, Problem):
            return current
        assert current.rollout is not None
        now = datetime.now(UTC)
        changed = rollouts.acted(
            current.rollout, action, by=principal.name, note=note, now=now, to=to
        )
        if isinstance(changed, str):
            return Problem(409, changed, extra={"state": current.rollout.state})
        proposed = current.model_copy(update={"rollout": changed})
        preview = self.previews.preview(
            principal, Proposal(override_scope=cluster, override=proposed)
        )
        if dry_run:
            return Done({"dry_run": True, "rollout": changed.model_dump(mode="json"),
                         "preview": preview.model_dump()})  # fmt: skip

        def change(stored: Rollout) -> Rollout | None:
            again = rollouts.acted(stored, action, by=principal.name, note=note, now=now, to=to)
            return again if isinstance(again, Rollout) else None

        outcome = self.flow.write(
            principal,
            key,
            _override_answer(preview, now),
            lambda idem: self.config.update_rollout(
                cluster,
                current.rollout.id,  # type: ignore[union-attr]
                change,
                actor=principal.actor,
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
            self.metrics.rollout_changes.labels(action).inc()
        return _with_override_etag(outcome, cluster)

    def _staged(self, cluster: str, if_match: str | None) -> Override | Problem:
        """The staged override of ``cluster`` an action applies to, read again from the
        store when this replica's copy lacks it or is older than ``if_match``: a 404
        when there is none, a 412 when what the admin confirmed is not what is stored
        (that, not the state the stored rollout happens to be in, is the answer; the
        store checks it again)."""
        current = self._override(cluster)
        if current is None or current.rollout is None:
            self.live.reload()  # it may have been written on another replica just now
            current = self._override(cluster)
        if current is None or current.rollout is None:
            return Problem(404, f"no staged override for {cluster!r}")
        etag = override_etag(cluster, current.revision)
        if if_match is not None and if_match != etag:
            self.live.reload()  # this replica's copy may be the older one
            current = self._override(cluster)
            if current is None or current.rollout is None:
                return Problem(404, f"no staged override for {cluster!r}")
            etag = override_etag(cluster, current.revision)
        if if_match is not None and if_match != etag:
            return Problem(
                412,
                f"override {cluster!r} changed since you read it (If-Match is stale); "
                "read it again and retry",
                extra={"current_etag": etag},
            )
        return current

    def _override(self, cluster: str) -> Override | None:
        return next((o for o in self.live.current().overrides if o.cluster == cluster), None)


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
    return with_etag(outcome, override_etag(cluster, revision))


def audit_counts(preview: Preview) -> dict[str, Any]:
    """What the audit log keeps of a preview: the counts, not every change row."""
    p = preview.model_dump()
    return {k: p[k] for k in ("pods_total", "pods_changed", "pods_invalid")} | {
        "changes": p["changes"][:20]
    }
