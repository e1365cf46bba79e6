"""The store itself (``service.store``), on SQLite and on a real PostgreSQL server.

Every test runs twice: on a fresh SQLite file and on a fresh PostgreSQL schema
(``pg_url_factory``). Concurrency tests use separate engines from several threads,
which is what several replicas (or a replica and ``switchboard token create``) are
to the database.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pytest
from mla_switchboard.core.schemas import SEED_RULES, OverrideSpec, RulesDocument
from mla_switchboard.service.state import Conflict, DecisionRecord, override_etag, rules_etag
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.db import make_engine, migrate
from mla_switchboard.service.store.models import Base
from sqlalchemy import Engine, inspect

from tests.store.conftest import run_together


def audit(store: Store, **filters: Any) -> list[dict[str, Any]]:
    args = {"action": None, "target": None, "actor": None, "limit": 100, "before_id": None}
    return store.audit.list_audit(**{**args, **filters})


def rules_doc(default: list[str]) -> RulesDocument:
    return RulesDocument.model_validate({"default": default, "by_capability": {}})


def spec(**kw: Any) -> OverrideSpec:
    return OverrideSpec.model_validate({"note": "test", **kw})


# --------------------------------------------------------------------- decisions

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def decision(
    n: int,
    *,
    cluster: str = "c1",
    node: str | None = "n1",
    pod: str | None = "p1",
    backend: str = "FLASH_ATTN",
    answer: str = "a" * 24,
) -> DecisionRecord:
    """Decision number ``n``: ids (and times) grow with n, as the service's do."""
    at = T0 + timedelta(milliseconds=n)
    return DecisionRecord(
        id=f"{int(at.timestamp() * 1000):012x}{n % 65536:04x}{'0' * 10}",
        created_at=at,
        cluster=cluster,
        node=node,
        pod=pod,
        backend=backend,
        source="priority",
        rules_revision=1,
        request_json=json.dumps({"cluster": cluster, "node": node, "pod": pod, "n": n}),
        answer_id=answer,
        answer_json=json.dumps({"backend": backend, "answer": answer}),
    )


def latest(store: Store) -> dict[tuple[str, str, str], tuple[str, str]]:
    return {
        (p.cluster, p.node, p.pod): (p.decision_id, p.backend)
        for p in store.decisions.latest_per_pod()
    }


def count(store: Store, table: str) -> int:
    with store.engine.connect() as conn:
        return conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()


# ------------------------------------------------------------------------ schema


@pytest.mark.postgres
def test_postgres_schema_holds_everything(pg_url_factory: Callable[[], str]) -> None:
    """Alembic's version table and every table land in the URL's schema, nowhere else."""
    url = pg_url_factory()
    schema = unquote(url).rsplit("search_path=", 1)[1]
    engine = make_engine(url)
    try:
        migrate(engine)
        insp = inspect(engine)
        tables = set(insp.get_table_names(schema=schema))
        assert tables == set(Base.metadata.tables) | {"alembic_version"}
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT current_schema()").scalar_one() == schema
            head = conn.exec_driver_sql(f'SELECT version_num FROM "{schema}".alembic_version')
            assert head.scalar_one()
    finally:
        engine.dispose()


def test_seeding_is_idempotent(engines: Callable[[], Engine]) -> None:
    engine = engines()
    for _ in range(2):
        migrate(engine)
        Store(engine).config.ensure_seeded()
    store = Store(engine)
    snap = store.config.load_config()
    assert snap.rules.revision == 1
    assert snap.rules.rules_only() == SEED_RULES.rules_only()
    assert snap.version == 1 == store.config.config_version()
    assert count(store, "rules_revisions") == 1


def test_replicas_migrate_and_seed_concurrently(db_url: str) -> None:
    """Four replicas starting at once on an empty database: one migration, one seed,
    no replica fails. On SQLite they queue on the write lock; the busy timeout is raised
    from 15 s to 120 s here because a 2-core machine shared by other jobs has been seen
    to take longer than 15 s for the first replica's migration."""
    url = f"{db_url}?timeout=120" if db_url.startswith("sqlite") and "?" not in db_url else db_url
    replicas = [make_engine(url) for _ in range(4)]

    def start(i: int) -> int:
        migrate(replicas[i])
        store = Store(replicas[i])
        store.config.ensure_seeded()
        return store.config.load_config().rules.revision or 0

    try:
        assert run_together(4, start) == [1, 1, 1, 1]
        store = Store(replicas[0])
        assert count(store, "rules_revisions") == 1
        assert store.config.config_version() == 1
    finally:
        for engine in replicas:
            engine.dispose()


# ------------------------------------------------------------------------- rules


def test_rules_revisions_and_stale_if_match(store: Store) -> None:
    v0 = store.config.config_version()
    new = store.config.put_rules(
        rules_doc(["FLASHINFER", "FLASH_ATTN"]),
        actor="alice",
        if_match=rules_etag(1),
        note="try flashinfer",
        preview={"pods_changed": 0},
    )
    assert isinstance(new, RulesDocument) and new.revision == 2
    assert store.config.config_version() == v0 + 1
    snap = store.config.load_config()
    assert snap.rules.revision == 2
    assert [b.value for b in snap.rules.default] == ["FLASHINFER", "FLASH_ATTN"]

    # stale If-Match: refused with the current ETag, nothing written, nothing bumped
    stale = store.config.put_rules(
        rules_doc(["CUDNN"]), actor="bob", if_match=rules_etag(1), note=None, preview=None
    )
    assert stale == Conflict(rules_etag(2))
    assert store.config.load_config().rules.revision == 2
    assert store.config.config_version() == v0 + 1

    entries = audit(store, action="rules.replace")
    assert len(entries) == 1
    entry = entries[0]
    assert entry["actor"] == "alice" and entry["note"] == "try flashinfer"
    assert entry["before"]["revision"] == 1 and entry["after"]["revision"] == 2
    assert entry["before"]["default"] == ["FLASH_ATTN"]
    assert entry["after"]["default"] == ["FLASHINFER", "FLASH_ATTN"]
    assert entry["preview"] == {"pods_changed": 0}


def test_unconditional_rules_writes_all_apply(store: Store, engines: Callable[[], Engine]) -> None:
    """Writes without If-Match apply unconditionally, also when replicas race."""
    replicas = [Store(engines()) for _ in range(4)]

    def write(i: int) -> Any:
        return replicas[i].config.put_rules(
            rules_doc(["FLASH_ATTN"]), actor=f"r{i}", if_match=None, note=None, preview=None
        )

    results = run_together(4, write)
    assert not [r for r in results if isinstance(r, Conflict)], results
    assert sorted(r.revision for r in results) == [2, 3, 4, 5]
    assert store.config.load_config().rules.revision == 5
    assert len(audit(store, action="rules.replace")) == 4


def test_conditional_rules_writes_race_one_wins(
    store: Store, engines: Callable[[], Engine]
) -> None:
    replicas = [Store(engines()) for _ in range(4)]

    def write(i: int) -> Any:
        return replicas[i].config.put_rules(
            rules_doc(["FLASH_ATTN"]),
            actor=f"r{i}",
            if_match=rules_etag(1),
            note=None,
            preview=None,
        )

    results = run_together(4, write)
    winners = [r for r in results if not isinstance(r, Conflict)]
    assert len(winners) == 1 and winners[0].revision == 2
    assert {r for r in results if isinstance(r, Conflict)} == {Conflict(rules_etag(2))}
    assert len(audit(store, action="rules.replace")) == 1


# --------------------------------------------------------------------- overrides


def test_override_put_delete_with_audit(store: Store) -> None:
    v0 = store.config.config_version()
    created = store.config.put_override(
        "prod",
        spec(deny=["FLASHINFER"], note="NaNs"),
        actor="alice",
        if_match='"none"',
        preview=None,
    )
    assert not isinstance(created, Conflict)
    assert created.deny == ["FLASHINFER"] and created.created_by == "alice"
    assert store.config.config_version() == v0 + 1
    assert created.revision == store.config.config_version()
    etag = override_etag("prod", created.revision)

    # creating again with If-Match "none" is stale now
    assert store.config.put_override(
        "prod", spec(force="CUDNN"), actor="bob", if_match='"none"', preview=None
    ) == Conflict(etag)
    replaced = store.config.put_override(
        "prod", spec(force="CUDNN", note="cudnn"), actor="bob", if_match=etag, preview=None
    )
    assert not isinstance(replaced, Conflict) and replaced.force == "CUDNN"
    assert store.config.put_override(
        "prod", spec(force="FLASH_ATTN"), actor="carol", if_match=etag, preview=None
    ) == Conflict(override_etag("prod", replaced.revision))
    snap = store.config.load_config()
    assert [(o.cluster, o.force) for o in snap.overrides] == [("prod", "CUDNN")]

    assert store.config.delete_override(
        "prod", actor="dave", if_match=etag, note=None, preview=None
    ) == Conflict(override_etag("prod", replaced.revision))
    deleted = store.config.delete_override(
        "prod", actor="dave", if_match=None, note="done", preview={"pods_changed": 3}
    )
    assert deleted is not None and not isinstance(deleted, Conflict)
    assert store.config.get_override("prod") is None
    assert (
        store.config.delete_override("prod", actor="dave", if_match=None, note=None, preview=None)
        is None
    )
    assert store.config.load_config().overrides == ()

    put1, put2 = reversed(audit(store, action="override.put"))
    assert put1["before"] is None and put1["after"]["deny"] == ["FLASHINFER"]
    assert put1["note"] == "NaNs" and put1["target"] == "prod"
    assert put2["before"]["deny"] == ["FLASHINFER"] and put2["after"]["force"] == "CUDNN"
    (gone,) = audit(store, action="override.delete")
    assert gone["before"]["force"] == "CUDNN" and gone["after"] is None
    assert gone["actor"] == "dave" and gone["preview"] == {"pods_changed": 3}
    # three writes applied, the refused ones bumped nothing
    assert store.config.config_version() == v0 + 3


def test_override_if_match_race_one_wins(store: Store, engines: Callable[[], Engine]) -> None:
    """Replicas racing with the same If-Match: exactly one write applies (no lost update)."""
    first = store.config.put_override(
        "race", spec(deny=["CUDNN"]), actor="a", if_match=None, preview=None
    )
    assert not isinstance(first, Conflict)
    etag = override_etag("race", first.revision)
    replicas = [Store(engines()) for _ in range(4)]

    def write(i: int) -> Any:
        return replicas[i].config.put_override(
            "race",
            spec(force="FLASH_ATTN", note=f"r{i}"),
            actor=f"r{i}",
            if_match=etag,
            preview=None,
        )

    results = run_together(4, write)
    winners = [r for r in results if not isinstance(r, Conflict)]
    assert len(winners) == 1, results
    assert store.config.get_override("race").note == winners[0].note  # type: ignore[union-attr]
    assert len(audit(store, action="override.put", target="race")) == 2


# ------------------------------------------------------------------------ tokens


def test_tokens(store: Store) -> None:
    assert store.tokens.count_tokens() == 0
    v0 = store.config.config_version()
    store.tokens.create_token(
        token_id="t1", name="ci", role="viewer", clusters=None, secret_hash="h" * 64, actor="root"
    )
    store.tokens.create_token(
        token_id="t2",
        name="prod-admin",
        role="admin",
        clusters=["prod-*"],
        secret_hash="g" * 64,
        actor="root",
    )
    assert store.tokens.count_tokens() == 2 and store.config.config_version() == v0 + 2
    tokens = store.config.load_config().tokens
    assert tokens["t1"].role == "viewer" and tokens["t1"].clusters is None
    assert tokens["t2"].clusters == ("prod-*",) and not tokens["t2"].revoked
    assert tokens["t2"].secret_hash == "g" * 64
    assert store.tokens.revoke_token("t2", actor="root")
    assert not store.tokens.revoke_token("t2", actor="root")
    assert not store.tokens.revoke_token("nope", actor="root")
    assert store.config.load_config().tokens["t2"].revoked
    assert store.config.config_version() == v0 + 3
    assert [e["action"] for e in audit(store)] == ["token.revoke", "token.create", "token.create"]


# --------------------------------------------------------------------- decisions


def test_pod_latest_keeps_the_newest(store: Store) -> None:
    v0 = store.config.config_version()
    # a newer batch is written before an older one (two replicas, or a retry)
    store.decisions.record_decisions([decision(5, backend="CUDNN"), decision(6, pod="p2")])
    store.decisions.record_decisions([decision(1, backend="FLASHINFER"), decision(2, pod="p2")])
    # one batch holding the same pod twice, newest first
    store.decisions.record_decisions(
        [decision(9, pod="p3", backend="TORCH_SDPA"), decision(8, pod="p3", backend="CUDNN")]
    )
    got = latest(store)
    assert got == {
        ("c1", "n1", "p1"): (decision(5).id, "CUDNN"),
        ("c1", "n1", "p2"): (decision(6).id, "FLASH_ATTN"),
        ("c1", "n1", "p3"): (decision(9).id, "TORCH_SDPA"),
    }
    assert store.decisions.count_decisions() == 6
    assert store.fleet.summary() == {"c1": {"CUDNN": 1, "FLASH_ATTN": 1, "TORCH_SDPA": 1}}
    assert store.config.config_version() == v0  # decisions are not config


def test_unnamed_pods_are_recorded_not_counted(store: Store) -> None:
    store.decisions.record_decisions(
        [
            decision(1, pod=None),
            decision(2, pod=None, node=None),
            decision(3, node=None, pod="lonely"),
        ]
    )
    assert store.decisions.count_decisions() == 3
    assert store.fleet.summary() == {"c1": {"FLASH_ATTN": 1}}
    assert list(latest(store)) == [("c1", "", "lonely")]


def test_answers_deduplicated_across_replicas(store: Store, engines: Callable[[], Engine]) -> None:
    other = Store(engines())  # a second replica: its own in-memory set of known answers
    store.decisions.record_decisions([decision(i, pod=f"p{i}", answer="x" * 24) for i in range(5)])
    other.decisions.record_decisions(
        [decision(i, pod=f"q{i}", answer="x" * 24) for i in range(5, 10)]
    )
    store.decisions.record_decisions([decision(10, pod="r", answer="y" * 24)])
    assert count(store, "answers") == 2
    record = store.decisions.get_decision(decision(7).id)
    assert record is not None and record.answer == {"backend": "FLASH_ATTN", "answer": "x" * 24}


def test_retried_batch_is_idempotent(store: Store) -> None:
    """A batch whose commit succeeded but whose acknowledgement was lost (connection
    cut by a database restart) is retried by the recorder: it must not fail forever."""
    batch = [decision(i, pod=f"p{i}") for i in range(20)]
    store.decisions.record_decisions(batch)
    fresh = Store(store.engine)  # no memory of the answers either
    fresh.decisions.record_decisions([*batch, decision(99, pod="p0", backend="CUDNN")])
    assert store.decisions.count_decisions() == 21
    assert latest(store)[("c1", "n1", "p0")] == (decision(99).id, "CUDNN")


def test_replicas_writing_the_same_pods_concurrently(
    store: Store, engines: Callable[[], Engine]
) -> None:
    """Two replicas' batches touching the same pods and answers in different orders:
    no deadlock, no error, every decision stored, the newest per pod wins."""
    replicas = [Store(engines()) for _ in range(2)]
    answers = [f"{k:024d}" for k in range(30)]

    def write(i: int) -> None:
        for round_ in range(10):
            base = 1000 * round_ + i * 500
            order = range(30) if i == 0 else reversed(range(30))
            replicas[i].decisions.record_decisions(
                [decision(base + k, pod=f"p{k}", answer=answers[k]) for k in order]
            )

    run_together(2, write)
    assert store.decisions.count_decisions() == 600
    assert count(store, "answers") == 30
    # the newest decision of pod k is replica 1's in the last round: 9000 + 500 + k
    assert latest(store) == {
        ("c1", "n1", f"p{k}"): (decision(9500 + k).id, "FLASH_ATTN") for k in range(30)
    }


def test_listing_order_filters_pagination(store: Store) -> None:
    records = [
        decision(i, cluster=f"c{i % 2}", pod=f"p{i}", backend=["FLASH_ATTN", "CUDNN"][i % 3 == 0])
        for i in range(25)
    ]
    store.decisions.record_decisions(records[10:])
    store.decisions.record_decisions(records[:10])
    newest_first = [r.id for r in reversed(records)]

    def page(**kw: Any) -> list[str]:
        args = {"cluster": None, "backend": None, "limit": 10, "before_id": None}
        return [r.id for r in store.decisions.list_decisions(**{**args, **kw})]

    first = page()
    assert first == newest_first[:10]
    second = page(before_id=first[-1])
    assert second == newest_first[10:20]
    assert page(before_id=second[-1]) == newest_first[20:]
    assert page(cluster="c1", limit=100) == [r.id for r in reversed(records) if r.cluster == "c1"]
    assert page(backend="CUDNN", limit=100) == [
        r.id for r in reversed(records) if r.backend == "CUDNN"
    ]
    assert page(pod="p7") == [records[7].id]
    one = store.decisions.list_decisions(
        cluster=None, backend=None, pod="p3", limit=1, before_id=None
    )[0]
    assert one.created_at == records[3].created_at and one.request == records[3].request
    assert one.node == "n1" and one.source == "priority" and one.rules_revision == 1


def test_summary_and_latest_per_pod(store: Store) -> None:
    store.decisions.record_decisions(
        [
            decision(1, cluster="east", pod="a", backend="FLASH_ATTN"),
            decision(2, cluster="east", pod="b", backend="FLASH_ATTN"),
            decision(3, cluster="east", pod="c", backend="CUDNN"),
            decision(4, cluster="west", pod="a", backend="FLASHINFER"),
            decision(5, cluster="east", pod="a", backend="CUDNN"),  # pod a moves
        ]
    )
    assert store.fleet.summary() == {
        "east": {"CUDNN": 2, "FLASH_ATTN": 1},
        "west": {"FLASHINFER": 1},
    }
    states = {(p.cluster, p.pod): p for p in store.decisions.latest_per_pod()}
    assert set(states) == {("east", "a"), ("east", "b"), ("east", "c"), ("west", "a")}
    moved = states[("east", "a")]
    assert moved.backend == "CUDNN" and moved.decision_id == decision(5).id
    assert json.loads(moved.request_json)["n"] == 5
