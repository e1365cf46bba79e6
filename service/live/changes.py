"""What changed between two configuration snapshots, as events a console can show.

The service already learns of every admin write the same way, whichever replica made
it: this replica's own writes reload the snapshot at once, others' arrive through the
config poller (``service/live/poller.py``). So the changes are found by comparing the snapshot
in force with the one before it, never by each write announcing itself: nothing a
replica misses, and nothing another replica has to send.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mla_switchboard.core.schemas import Override
from mla_switchboard.service.state import ConfigSnapshot


@dataclass(frozen=True)
class Change:
    """One change as the stream sends it. ``cluster``: whose change it is (``*`` for
    the fleet's; None for one that concerns every reader, such as the fleet's counts),
    so that a caller limited to some clusters gets only theirs."""

    kind: str  # "override", "rollout", "rules", "counts", "evidence"
    cluster: str | None
    data: dict[str, Any] = field(default_factory=dict)


def _override_data(o: Override, action: str) -> dict[str, Any]:
    return {
        "action": action,
        "cluster": o.cluster,
        "revision": o.revision,
        "by": o.created_by,
        "at": o.created_at.isoformat(),
    }


def _rollout_action(before: Override, after: Override) -> str | None:
    """How a rollout moved between two revisions of its override: ``halt``,
    ``resume``, ``step`` (its share or stage moved), ``start`` or ``stop``; None when
    it did not."""
    old, new = before.rollout, after.rollout
    if old is None and new is None:
        return None
    if old is None:
        return "start"
    if new is None:
        return "stop"
    if old.state != new.state:
        return "halt" if new.state == "halted" else "resume" if old.state == "halted" else "state"
    if old.percent != new.percent or old.stage_started_at != new.stage_started_at:
        return "step"
    return None


def config_changes(before: ConfigSnapshot | None, after: ConfigSnapshot) -> list[Change]:
    """The overrides put, deleted and their rollouts moved, and a new rules revision,
    from ``before`` to ``after`` (nothing when there was no snapshot before: a start
    is not a change anyone made)."""
    if before is None or before.version == after.version:
        return []
    out: list[Change] = []
    old = {o.cluster: o for o in before.overrides}
    new = {o.cluster: o for o in after.overrides}
    for cluster, o in new.items():
        prior = old.get(cluster)
        if prior is not None and prior.revision == o.revision:
            continue
        out.append(Change("override", cluster, _override_data(o, "put")))
        action = _rollout_action(prior, o) if prior is not None else None
        if prior is None and o.rollout is not None:
            action = "start"
        if action is not None and o.rollout is not None:
            data = {**_override_data(o, action), "state": o.rollout.state}
            data["percent"] = o.rollout.percent
            data["halted_reason"] = o.rollout.halted_reason
            cause = o.rollout.halted_cause
            data["halted_cause"] = None if cause is None else cause.model_dump(mode="json")
            out.append(Change("rollout", cluster, data))
        elif action == "stop":
            out.append(Change("rollout", cluster, {**_override_data(o, "stop")}))
    for cluster, o in old.items():
        if cluster not in new:
            out.append(Change("override", cluster, {**_override_data(o, "delete"), "by": None}))
    if before.rules.revision != after.rules.revision:
        out.append(Change("rules", "*", {"revision": after.rules.revision}))
    return out


def expired_since(
    snapshot: ConfigSnapshot, seen: set[tuple[str, int]], now: datetime
) -> list[Change]:
    """Overrides of ``snapshot`` whose expiry time passed and that ``seen`` (the
    (cluster, revision) pairs already told, updated here) does not hold yet: an
    override expires by the clock, with no write to notice."""
    out = []
    for o in snapshot.overrides:
        if o.expires_at is None or o.expires_at > now or (o.cluster, o.revision) in seen:
            continue
        seen.add((o.cluster, o.revision))
        data = {**_override_data(o, "expire"), "at": o.expires_at.isoformat()}
        out.append(Change("override", o.cluster, data))
    return out
