"""What the change stream says, from the snapshots a replica takes into force
(``service/live/changes.py``, ``service/live/events.py``), without a server: a rollout's halt,
resume and step; an override that expires by the clock, told once; resuming from an
id, and ``resync`` for one the ring no longer keeps."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from mla_switchboard.core.schemas import Override, RulesDocument
from mla_switchboard.service.live.changes import config_changes
from mla_switchboard.service.live.events import EventHub
from mla_switchboard.service.state import ConfigSnapshot

T0 = datetime(2026, 12, 1, tzinfo=UTC)
RULES = RulesDocument.model_validate({"revision": 1})


def override(cluster: str, revision: int, **extra: Any) -> Override:
    fields = {"cluster": cluster, "created_at": T0, "created_by": "alice", "revision": revision}
    return Override.model_validate({"force": "FLASHINFER", "note": "n", **fields, **extra})


def rollout(state: str = "active", percent: int = 10) -> dict[str, Any]:
    return {"percent": percent, "id": "r1", "state": state, "stage_started_at": T0.isoformat()}


def snap(version: int, *overrides: Override) -> ConfigSnapshot:
    return ConfigSnapshot(version=version, rules=RULES, overrides=overrides, tokens={})


def actions(before: ConfigSnapshot, after: ConfigSnapshot) -> list[tuple[str, str]]:
    return [(c.kind, c.data["action"]) for c in config_changes(before, after)]


def test_rollout_moves_are_named() -> None:
    active = snap(1, override("east", 1, rollout=rollout()))
    halted = snap(2, override("east", 2, rollout=rollout("halted")))
    stepped = snap(3, override("east", 3, rollout=rollout(percent=50)))
    assert actions(active, halted) == [("override", "put"), ("rollout", "halt")]
    assert actions(halted, active) == [("override", "put"), ("rollout", "resume")]
    assert actions(active, stepped) == [("override", "put"), ("rollout", "step")]
    assert actions(active, snap(4)) == [("override", "delete")]
    assert config_changes(None, active) == []  # a start is nobody's change


def test_expiry_is_told_once_and_resume_and_resync() -> None:
    now = [T0]
    hub = EventHub(ring_size=3, max_streams=5, now=lambda: now[0])
    hub.config_changed(snap(1))
    hub.versions_read({"config_version": 1, "fleet_version": 1})
    start = hub.resume_point(None)
    hub.config_changed(snap(2, override("east", 1, expires_at=T0 + timedelta(hours=1))))
    now[0] = T0 + timedelta(hours=2)
    hub.versions_read({"config_version": 2, "fleet_version": 1})
    hub.versions_read({"config_version": 2, "fleet_version": 2})  # a pod booted
    kinds = [(e.change.kind, e.change.data.get("action")) for e in hub._after(start or 0)]
    assert kinds == [("override", "put"), ("override", "expire"), ("counts", None)]

    async def first_events(last_id: str | None, n: int) -> list[str]:
        sub = hub.subscribe()
        assert sub is not None
        out = []
        async for event in hub.stream(sub, lambda c: c == "east", last_id):
            out.append(event["event"])
            if len(out) == n:
                break
        return out

    assert asyncio.run(first_events(f"{hub.boot}-{start}", 4)) == [
        "hello", "override", "override", "counts",
    ]  # fmt: skip
    hub.versions_read({"config_version": 2, "fleet_version": 3})  # the ring keeps 3
    assert asyncio.run(first_events(f"{hub.boot}-{start}", 2)) == ["hello", "resync"]
    assert asyncio.run(first_events("another-process-1", 2)) == ["hello", "resync"]


def test_a_stream_ends_after_its_lifetime() -> None:
    """So that the caller comes back and is authenticated again."""
    hub = EventHub(ring_size=3, max_streams=1)

    async def whole_stream() -> list[str]:
        sub = hub.subscribe()
        assert sub is not None and hub.subscribe() is None  # the limit: one
        return [e["event"] async for e in hub.stream(sub, lambda c: True, None, 0.05)]

    assert asyncio.run(whole_stream()) == ["hello"]
    assert hub.open_streams == 0


def test_a_last_event_id_of_other_digits_reads_everything_again() -> None:
    """Unicode digits ("²", "٣") pass str.isdigit() but not int(): such an id is
    malformed, answered by a resync, never an exception in the stream."""
    hub = EventHub(ring_size=3, max_streams=5)
    for seq_text in ("²", "٣", "1²", "", "-1", " 1"):
        assert hub.resume_point(f"{hub.boot}-{seq_text}") is None, seq_text
    assert hub.resume_point(f"{hub.boot}-0") == 0
