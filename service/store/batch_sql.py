"""The decision batch's SQL text, built once per store, and SQLite's many-row inserts.

``DecisionStore.record_rows`` (``decisions.py``) bypasses SQLAlchemy's statement
compiler to keep the calls into the driver per batch few and fixed; these are the
statements it runs, in the driver's parameter style.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

SQLITE_ROWS = 64
"""Rows per SQLite statement (see ``sqlite_rows``)."""

POD_LATEST_CONFLICT = (
    "ON CONFLICT (cluster, node, pod) DO UPDATE SET "
    "decision_id = excluded.decision_id, backend = excluded.backend, "
    "source = excluded.source, created_at = excluded.created_at, "
    "answer_id = excluded.answer_id, shape_id = excluded.shape_id, bucket = excluded.bucket "
    "WHERE excluded.decision_id > pod_latest.decision_id"
)


def statements(mark: str) -> dict[str, str]:
    """The batch statements in the driver's parameter style ``mark``: built once per
    store, not per batch."""

    def values(n: int) -> str:
        return "(" + ", ".join([mark] * n) + ")"

    return {
        "shapes": f"INSERT INTO shapes (id, request) VALUES {values(2)} "
        "ON CONFLICT (id) DO NOTHING",
        "answers": f"INSERT INTO answers (id, answer) VALUES {values(2)} "
        "ON CONFLICT (id) DO NOTHING",
        "decisions": "INSERT INTO decisions (id, created_at, cluster, node, pod, backend, "
        f"source, rules_revision, shape_id, answer_id, principal, verified) VALUES {values(12)} "
        "ON CONFLICT (id) DO NOTHING",
        "pod_latest": "INSERT INTO pod_latest (cluster, node, pod, decision_id, backend, "
        f"source, created_at, answer_id, shape_id, bucket) VALUES {values(10)} "
        f"{POD_LATEST_CONFLICT}",
        "fleet_upsert": "INSERT INTO fleet_counts (cluster, shape_id, backend, source, pods, "
        f"buckets) VALUES {values(6)} ON CONFLICT (cluster, shape_id, backend, source) "
        "DO UPDATE SET pods = excluded.pods, buckets = excluded.buckets",
        "fleet_delete": f"DELETE FROM fleet_counts WHERE cluster = {mark} AND "
        f"shape_id = {mark} AND backend = {mark} AND source = {mark}",
        "fleet_bump": "UPDATE meta SET value = value + 1 WHERE key = 'fleet_version' "
        "RETURNING value",
    }


def _flat(rows: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    return tuple(itertools.chain.from_iterable(rows))


def sqlite_rows(
    conn: Connection, sql: dict[str, str], name: str, params: list[tuple[Any, ...]]
) -> None:
    """Insert ``params`` with statement ``name``, up to ``SQLITE_ROWS`` rows per
    statement.

    Python's sqlite3 releases the GIL around every step of every statement, even
    inside ``executemany``; while the event loop is busy, taking the GIL back waits
    up to the switch interval each time, so one row per step held the writer to
    about a thousand rows a second under full load (its backlog then made every
    full garbage collection longer). A statement of many rows is one step. Sizes
    are powers of two, so that a few statements, prepared once, fit any batch.
    """
    done = len(params) - len(params) % SQLITE_ROWS
    if done:
        conn.exec_driver_sql(
            _sqlite_sql(sql, name, SQLITE_ROWS),
            [_flat(params[i : i + SQLITE_ROWS]) for i in range(0, done, SQLITE_ROWS)],
        )
    size = SQLITE_ROWS // 2
    while done < len(params):
        if len(params) - done >= size:
            conn.exec_driver_sql(_sqlite_sql(sql, name, size), _flat(params[done : done + size]))
            done += size
        size //= 2


def _sqlite_sql(sql_of: dict[str, str], name: str, rows: int) -> str:
    key = f"{name}*{rows}"
    sql = sql_of.get(key)
    if sql is None:
        head, _, rest = sql_of[name].partition(" VALUES ")
        group, _, tail = rest.partition(")")  # the one row's "(?, ..., ?" and the rest
        sql = f"{head} VALUES {', '.join([group + ')'] * rows)}{tail}"
        sql_of[key] = sql
    return sql


def _flat(rows: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    return tuple(itertools.chain.from_iterable(rows))
