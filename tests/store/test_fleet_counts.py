"""The fleet's counts (``fleet_counts``) stay exactly what ``pod_latest`` says, whatever
order batches arrive in, however often they are retried, and with several replicas
writing overlapping pods at once; the migration fills them for an existing store."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from mla_switchboard.core.stages import STAGE_BUCKETS, stage_bucket
from mla_switchboard.service.state import DecisionRecord
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.db import MIGRATIONS, make_engine, migrate
from mla_switchboard.service.store.shapes import shape_of_json
from sqlalchemy import Engine

from tests.store.conftest import run_together

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
BACKENDS = ["FLASH_ATTN", "FLASHINFER", "CUDNN"]


def record(n: int, cluster: str, pod: str, backend: str, shape: int) -> DecisionRecord:
    """Decision number ``n`` (ids grow with n) of ``pod``, of request shape ``shape``."""
    at = T0 + timedelta(milliseconds=n)
    request = {"cluster": cluster, "node": "n", "pod": pod, "model": {"shape": shape}}
    return DecisionRecord(
        id=f"{int(at.timestamp() * 1000):012x}{n % 65536:04x}{n:010x}",
        created_at=at,
        cluster=cluster,
        node="n",
        pod=pod,
        backend=backend,
        source="priority",
        rules_revision=1,
        request_json=json.dumps(request),
        answer_id=f"{backend:0<24}"[:24],
        answer_json=json.dumps({"backend": backend}),
    )


def random_history(seed: int, decisions: int, pods: int) -> list[DecisionRecord]:
    rng = random.Random(seed)
    return [
        record(
            n,
            cluster=f"c{(p := rng.randrange(pods)) % 3}",
            pod=f"pod-{p}",
            backend=rng.choice(BACKENDS),
            shape=rng.randrange(4),
        )
        for n in range(decisions)
    ]


def expected(history: list[DecisionRecord]) -> Counter[tuple[str, str, str, str, int]]:
    """What the counts must be: each pod's newest decision, grouped."""
    newest: dict[tuple[str, str], DecisionRecord] = {}
    for d in history:
        key = (d.cluster, d.pod or "")
        if key not in newest or newest[key].id < d.id:
            newest[key] = d
    out: Counter[tuple[str, str, str, str, int]] = Counter()
    for d in newest.values():
        bucket = stage_bucket(d.cluster, d.pod)
        assert bucket is not None
        out[(d.cluster, shape_of_json(d.request_json).id, d.backend, d.source, bucket)] += 1
    return out


def stored(store: Store) -> Counter[tuple[str, str, str, str, int]]:
    _, groups = store.fleet.fleet_groups()
    out: Counter[tuple[str, str, str, str, int]] = Counter()
    for g in groups:
        assert g.pods == sum(g.buckets) > 0 and len(g.buckets) == STAGE_BUCKETS
        for bucket, n in enumerate(g.buckets):
            if n:
                out[(g.cluster, g.shape_id, g.backend, g.source, bucket)] += n
    return out


def test_counts_follow_each_pods_newest_decision(store: Store) -> None:
    history = random_history(1, 600, 80)
    batches = [history[i : i + 37] for i in range(0, len(history), 37)]
    random.Random(2).shuffle(batches)  # replicas and retries deliver out of order
    v0 = store.fleet.fleet_version()
    for batch in batches:
        store.decisions.record_decisions(batch)
    assert stored(store) == expected(history)
    assert store.fleet.fleet_version() > v0
    # a batch stored again (a commit whose answer was lost, a replayed spill file)
    # changes nothing
    store.decisions.record_decisions(batches[0])
    store.decisions.record_decisions(history[:5])
    assert stored(store) == expected(history)
    total = sum(expected(history).values())
    assert sum(n for b in store.fleet.summary().values() for n in b.values()) == total


def test_a_pod_moving_groups_leaves_the_old_one(store: Store) -> None:
    store.decisions.record_decisions([record(1, "east", "a", "FLASH_ATTN", shape=1)])
    store.decisions.record_decisions([record(2, "east", "a", "CUDNN", shape=2)])
    (group,) = store.fleet.fleet_groups()[1]
    assert (group.backend, group.pods) == ("CUDNN", 1)
    assert group.shape_id == shape_of_json(record(2, "east", "a", "CUDNN", 2).request_json).id


def test_replicas_writing_the_same_pods_at_once_keep_counts_exact(
    store: Store, engines: Callable[[], Engine]
) -> None:
    history = random_history(3, 1200, 60)  # many decisions per pod: heavy overlap
    replicas = [Store(engines()) for _ in range(4)]

    def write(i: int) -> None:
        mine = history[i::4]
        for j in range(0, len(mine), 25):
            replicas[i].decisions.record_decisions(mine[j : j + 25])

    run_together(4, write)
    assert stored(store) == expected(history)


@pytest.mark.parametrize("pods", [50])
def test_the_migration_fills_the_counts_of_an_existing_store(tmp_path: Path, pods: int) -> None:
    """A store written by the previous release (requests as JSON text, no shapes)
    upgraded in place: each pod's shape, bucket and the counts come out as if the
    decisions had been written by this release."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0004")
    history = random_history(5, 300, pods)
    newest: dict[tuple[str, str], DecisionRecord] = {}
    with engine.begin() as conn:
        for d in history:
            conn.exec_driver_sql(
                "INSERT INTO decisions (id, created_at, cluster, node, pod, backend, source, "
                "rules_revision, request, answer_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _old_row(d),
            )
            key = (d.cluster, d.pod or "")
            if key not in newest or newest[key].id < d.id:
                newest[key] = d
        for d in newest.values():
            conn.exec_driver_sql(
                "INSERT INTO pod_latest (cluster, node, pod, decision_id, backend, source, "
                "created_at, answer_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (d.cluster, d.node, d.pod, d.id, d.backend, d.source, _ts(d), d.answer_id),
            )
    migrate(engine)
    store = Store(engine)
    store.config.ensure_seeded()
    assert stored(store) == expected(history)
    # old rows keep their text and read back whole; new writes continue the counts
    got = store.decisions.get_decision(history[0].id)
    assert got is not None and got.request == json.loads(history[0].request_json)
    more = [record(1000 + i, "c0", f"pod-{i}", "CUDNN", shape=9) for i in range(10)]
    store.decisions.record_decisions(more)
    assert stored(store) == expected(history + more)
    engine.dispose()


def _ts(d: DecisionRecord) -> str:
    return d.created_at.replace(tzinfo=None).isoformat(" ")


def _old_row(d: DecisionRecord) -> tuple[Any, ...]:
    return (
        d.id,
        _ts(d),
        d.cluster,
        d.node,
        d.pod,
        d.backend,
        d.source,
        1,
        d.request_json,
        d.answer_id,
    )


def test_a_new_fleet_version_reads_back_the_unchanged_groups_as_they_were(store: Store) -> None:
    """Rows whose counts did not move are the same objects on the next read, and so is
    a snapshot's group of them: a new version costs the groups it changed, and the fleet
    reads kept per cluster (``service/fleet/parts.py``) compare them by identity."""
    from mla_switchboard.service.fleet.groups import FleetSnapshot

    history = [record(i, f"c{i % 3}", f"p{i}", BACKENDS[i % 2], shape=i % 2) for i in range(12)]
    store.decisions.record_decisions(history)
    v1, first = store.fleet.fleet_groups()
    shapes = store.fleet.shapes({g.shape_id for g in first})
    before = FleetSnapshot.build(v1, first, shapes)
    booted = record(100, "c1", "new", "CUDNN", shape=0)
    store.decisions.record_decisions([booted])
    v2, second = store.fleet.fleet_groups()
    after = FleetSnapshot.build(v2, second, shapes, before)
    assert v2 > v1 and stored(store) == expected([*history, booted])

    new_shape = shape_of_json(booted.request_json).id
    old_rows = {(g.cluster, g.shape_id, g.backend): g for g in first}
    for g in second:
        is_new = (g.cluster, g.shape_id, g.backend) == ("c1", new_shape, "CUDNN")
        assert (old_rows.get((g.cluster, g.shape_id, g.backend)) is g) is not is_new
    old_groups = {(g.cluster, g.shape_id): g for g in before.groups}
    for g in after.groups:
        changed = (g.cluster, g.shape_id) == ("c1", new_shape)
        assert (old_groups.get((g.cluster, g.shape_id)) is g) is not changed
    assert FleetSnapshot.build(v2, second, shapes) == after  # the same content either way


class CountingReads:
    """A ``FleetStore`` that counts its reads of every row."""

    def __init__(self, store: Store) -> None:
        self.store, self.full_reads = store, 0

    def fleet_groups(self) -> Any:
        self.full_reads += 1
        return self.store.fleet.fleet_groups()

    def shapes(self, ids: Any) -> dict[str, str]:
        return self.store.fleet.shapes(ids)


def test_the_snapshot_follows_this_replicas_own_changes_without_reading_every_row(
    store: Store, engines: Callable[[], Engine]
) -> None:
    """After this replica's batches (and its pod expiry), the fleet's snapshot is the
    previous one with their changes applied, equal to a read of every row; a batch of
    another replica leaves a gap in the versions, and the next read reads every row."""
    from mla_switchboard.service.fleet.groups import Fleet

    history = random_history(7, 400, 60)
    store.decisions.record_decisions(history[:100])
    reads = CountingReads(store)
    fleet = Fleet(store.decisions, reads)  # type: ignore[arg-type]

    def fresh() -> Any:
        return Fleet(store.decisions, store.fleet).current()

    assert fleet.current() == fresh() and reads.full_reads == 1
    for i in range(100, 400, 50):
        store.decisions.record_decisions(history[i : i + 50])
        assert fleet.current() == fresh()
    # pods leaving the fleet (the expiry sweep) move pods out of their groups too
    expired = store.decisions.expire_pods(T0 + timedelta(milliseconds=150))
    assert expired > 0
    fleet.saw(store.fleet.fleet_version())
    assert fleet.current() == fresh()
    assert reads.full_reads == 1  # every change was this replica's: none read again

    other = Store(engines())
    other.decisions.record_decisions([record(1000, "c9", "elsewhere", "CUDNN", shape=3)])
    store.decisions.record_decisions([record(1001, "c1", "here", "CUDNN", shape=3)])
    fleet.saw(other.fleet.fleet_version())
    got = fleet.current()
    assert got == fresh() and reads.full_reads == 2  # the other replica's batch: a gap
    assert any(g.cluster == "c9" for g in got.groups)
