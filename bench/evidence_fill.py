"""Measurement reports by the million, written straight into the ``measurements`` table.

``Store.add_measurements`` takes one transaction per report and stamps it "now": a
million reports through it take about half an hour and all land in the same minute.
A year of history is written here instead: the rows ``add_measurements`` would write
for each report (same columns, same values, computed by the same functions from a
validated ``MeasurementReport``), with the time each report was sent, in bulk (COPY on
PostgreSQL, about 150,000 rows/s on 2 shared cores; one ``executemany`` per batch on
SQLite), into the table as migration
``BULK_REVISION`` creates it. The product's later migrations run afterwards, as on a
store being upgraded, so a table they derive from these rows is derived from them.

``tests/bench/test_evidence_fill.py`` checks that a report written here and the same
report written by ``add_measurements`` are the same row.
"""

from __future__ import annotations

import itertools
import math
import random
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from mla_switchboard.core.schemas import MeasurementReport
from mla_switchboard.service.store.measurements import measurement_rows

from bench.scale import Pod, Progress, report_of

BULK_REVISION = "0008"
"""The migration whose ``measurements`` table the rows are written into: the newest
when this bench was written. A later migration that changes the table (or derives
others from it) then runs on the filled rows."""

COLUMNS = (
    "report_id", "at", "cluster", "node", "pod", "device_name", "capability", "dims",
    "num_heads", "dtype", "packages", "backend", "impl", "shape", "median_ms", "tflops",
    "correct", "error", "engine", "counted",
)  # fmt: skip
WRONG_ERROR = "max abs error 0.52 > tolerance 0.02"


def report_rows(
    report: MeasurementReport, report_id: str, at: datetime, counted: bool
) -> list[dict[str, Any]]:
    """The rows ``Store.add_measurements`` writes for ``report``, sent at ``at``."""
    return measurement_rows(report, report_id, counted, at)


def report_id_at(at: datetime, rng: random.Random, seq: int) -> str:
    """An id like ``service.ids.new_id`` would have made at ``at`` (time-ordered)."""
    return f"{int(at.timestamp() * 1000):012x}{seq & 0xFFFF:04x}{rng.getrandbits(40):010x}"


@dataclass(frozen=True)
class Template:
    """What every report of one pod kind with ``n`` results shares: its rows as
    ``report_rows`` makes them, less the pod, the time and the measured figures."""

    rows: tuple[dict[str, Any], ...]


class Templates:
    """``report_rows`` of a validated report, once per (pod kind, results): a million
    reports then cost a dict copy per row, not a pydantic validation per report."""

    def __init__(self) -> None:
        self._made: dict[tuple[Any, ...], Template] = {}

    def of(self, pod: Pod, results: int) -> Template:
        req = pod.request
        key = (
            req["cluster"], req["device"]["name"], tuple(req["device"]["capability"] or ()),
            req["model"]["name"], req["dtype"], repr(req["packages"]), repr(req["engine"]),
            results,
        )  # fmt: skip
        found = self._made.get(key)
        if found is None:
            body = report_of(pod, random.Random(0), results, wrong_rate=0.0)
            rows = report_rows(MeasurementReport.model_validate(body), "", datetime.now(UTC), True)
            found = self._made[key] = Template(tuple(rows))
        return found


@dataclass(frozen=True)
class Plan:
    """Which reports to write: ``reports`` of them at even times from ``start`` to
    ``end``, each from a pod drawn from ``pods``; ``per_incarnation`` reports per
    pod name before the pod is replaced (a new name: pods are redeployed, and most
    reports over a year come from pods that no longer run), or None for pods that keep
    their names. ``results`` is drawn per report, ``counted_share`` of the reports are
    counted (the rest came from pods the service never decided for), and a
    FLASHINFER or CUDNN result is wrong at ``wrong_rate`` (as ``report_of``)."""

    pods: Sequence[Pod]
    reports: int
    start: datetime
    end: datetime
    results: Sequence[int] = (6, 7)
    counted_share: float = 0.97
    wrong_rate: float = 0.004
    per_incarnation: int | None = 1
    seed: int = 23

    @property
    def rows_estimate(self) -> int:
        return round(self.reports * sum(self.results) / len(self.results))


def planned_rows(plan: Plan) -> Iterator[dict[str, Any]]:
    """The rows of ``plan``, oldest first (row ids follow time, as the service's do)."""
    rng = random.Random(plan.seed)
    templates = Templates()
    span = (plan.end - plan.start).total_seconds()
    generation: dict[int, int] = {}
    order = list(range(len(plan.pods)))
    for k in range(plan.reports):
        at = plan.start + timedelta(seconds=span * (k + rng.random()) / max(plan.reports, 1))
        if plan.per_incarnation is None:
            if k % len(order) == 0:
                rng.shuffle(order)
            i = order[k % len(order)]
        else:
            i = rng.randrange(len(plan.pods))
        pod = plan.pods[i]
        name = pod.request["pod"]
        if plan.per_incarnation is not None:
            g = generation.get(i, 0)
            generation[i] = g + 1
            name = f"{name}-{g // plan.per_incarnation:x}"
        n = plan.results[rng.randrange(len(plan.results))]
        counted = rng.random() < plan.counted_share
        rid = report_id_at(at, rng, k)
        gpu = rng.uniform(0.9, 1.1)
        for row in templates.of(pod, n).rows:
            wrong = row["backend"] in ("FLASHINFER", "CUDNN") and rng.random() < plan.wrong_rate
            tflops = row["tflops"]
            yield {
                **row,
                "report_id": rid,
                "at": at,
                "node": pod.request["node"],
                "pod": name,
                "median_ms": round(rng.uniform(0.05, 5.0), 3),
                "tflops": None if wrong or tflops is None else round(tflops * gpu, 1),
                "correct": not wrong,
                "error": WRONG_ERROR if wrong else None,
                "counted": counted,
            }


# ------------------------------------------------------------------ writers


def copy_pg(url: str, rows: Iterator[dict[str, Any]], progress: Callable[[int], None]) -> int:
    """``rows`` into ``measurements`` with one COPY (psycopg adapts each row's values,
    in C); returns how many."""
    import psycopg

    from bench.scale_support import plain_pg

    done = 0
    with psycopg.connect(plain_pg(url)) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY measurements ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(tuple(row[c] for c in COLUMNS))
                done += 1
                if done % 20_000 == 0:
                    progress(done)
        conn.commit()
    return done


def _sqlite_value(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, datetime):  # as SQLAlchemy's DateTime stores it on SQLite
        return value.astimezone(UTC).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")
    return value


def insert_sqlite(url: str, rows: Iterator[dict[str, Any]], progress: Callable[[int], None]) -> int:
    """``rows`` into ``measurements`` of the SQLite file of ``url``, 20,000 per
    ``executemany``, one transaction."""
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    sql = (
        f"INSERT INTO measurements ({', '.join(COLUMNS)}) "
        f"VALUES ({', '.join('?' for _ in COLUMNS)})"
    )
    done = 0
    conn = sqlite3.connect(path)
    try:
        batch: list[tuple[Any, ...]] = []
        for row in rows:
            batch.append(tuple(_sqlite_value(row[c]) for c in COLUMNS))
            if len(batch) >= 20_000:
                conn.executemany(sql, batch)
                done += len(batch)
                batch = []
                progress(done)
        conn.executemany(sql, batch)
        done += len(batch)
        conn.commit()
    finally:
        conn.close()
    return done


def write_plan(url: str, plans: Sequence[Plan], label: str = "") -> dict[str, Any]:
    """Every row of ``plans`` (each older than the next) into the store at ``url``
    (its schema at ``BULK_REVISION`` or later): the figures of the fill."""
    total = sum(p.rows_estimate for p in plans)
    progress = Progress(f"{label}measurement rows", total, "rows")
    write = copy_pg if url.startswith("postgresql") else insert_sqlite
    rows = write(url, itertools.chain.from_iterable(map(planned_rows, plans)), progress.update)
    progress.total = rows
    seconds = progress.finish()
    return {
        "reports": sum(p.reports for p in plans),
        "rows": rows,
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / max(seconds, 1e-9)),
        "from": plans[0].start.isoformat(timespec="seconds"),
        "to": plans[-1].end.isoformat(timespec="seconds"),
    }


def in_window(plan: Plan, window: timedelta, now: datetime) -> int:
    """About how many of ``plan``'s reports are younger than ``window`` at ``now``."""
    span = (plan.end - plan.start).total_seconds()
    inside = (plan.end - max(plan.start, now - window)).total_seconds()
    return max(0, min(plan.reports, math.floor(plan.reports * inside / max(span, 1e-9))))
