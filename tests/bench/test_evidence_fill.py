"""The scale bench writes a year of evidence in bulk (bench/evidence_fill.py) instead
of through ``Store.add_measurements``: the rows must be the ones the store writes, or
the bench measures a store no service ever had."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mla_switchboard.core.schemas import MeasurementReport
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.base import aware
from mla_switchboard.service.store.db import make_engine, migrate
from mla_switchboard.service.store.models import MeasurementRow
from sqlalchemy import select

from bench.evidence_fill import (
    BULK_REVISION,
    COLUMNS,
    Plan,
    copy_pg,
    insert_sqlite,
    planned_rows,
    report_rows,
)
from bench.scale import make_fleet, measurable, report_of
from bench.scale_support import migrate_to

PER_REPORT = {"report_id", "at", "pod", "median_ms", "tflops", "correct", "error", "counted"}
"""What differs from one report of a pod kind to the next (the rest is the template)."""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fill.db'}"
    return str(request.getfixturevalue("pg_url_factory")())


def _stored(store: Store) -> dict[str, list[dict[str, Any]]]:
    columns = [getattr(MeasurementRow, c) for c in COLUMNS]
    out: dict[str, list[dict[str, Any]]] = {}
    with store.engine.connect() as conn:
        for row in conn.execute(select(*columns).order_by(MeasurementRow.id)).mappings():
            out.setdefault(row["report_id"], []).append(dict(row))
    return out


def test_bulk_rows_are_the_rows_the_store_writes(url: str) -> None:
    pod = measurable(make_fleet(40, 4, seed=3))[0]
    body = report_of(pod, random.Random(1), 7, wrong_rate=0.5)
    report = MeasurementReport.model_validate(body)
    at = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    engine = make_engine(url)
    migrate_to(engine, BULK_REVISION)  # the bench's order: rows first, then head
    write = copy_pg if url.startswith("postgresql") else insert_sqlite
    assert write(url, iter(report_rows(report, "bulk", at, True)), lambda _: None) == 7
    migrate(engine)
    store = Store(engine)
    store.config.ensure_seeded()
    store.measurements.add_measurements(report, "api", counted=True)

    stored = _stored(store)
    assert len(stored["bulk"]) == len(stored["api"]) == 7
    for bulk, api in zip(stored["bulk"], stored["api"], strict=True):
        assert aware(bulk.pop("at")) == at
        api.pop("at")
        assert {**bulk, "report_id": "api"} == api
    # and the service's read counts both alike
    since = at - timedelta(days=1)
    page = store.measurements.measurement_rows(since, after=0)
    by_report: dict[str, int] = {}
    for o in page.observations:
        by_report[o.source.split(":")[1]] = by_report.get(o.source.split(":")[1], 0) + 1
    assert by_report["bulk"] == by_report["api"] > 0
    engine.dispose()


def test_planned_reports_are_a_pods_reports_in_time_order() -> None:
    pods = measurable(make_fleet(60, 4, seed=5))[:5]
    now = datetime.now(UTC)
    plan = Plan(pods, 40, now - timedelta(days=365), now, seed=2)
    rows = list(planned_rows(plan))
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
    reports: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        reports.setdefault(r["report_id"], []).append(r)
    assert len(reports) == 40
    for group in reports.values():
        assert len({r["pod"] for r in group}) == 1 and len(group) in plan.results
        pod = next(p for p in pods if group[0]["pod"].startswith(p.request["pod"] + "-"))
        body = report_of(pod, random.Random(0), len(group), wrong_rate=0.0)
        expected = report_rows(MeasurementReport.model_validate(body), "", now, True)
        for got, want in zip(group, expected, strict=True):
            assert {k: v for k, v in got.items() if k not in PER_REPORT} == {
                k: v for k, v in want.items() if k not in PER_REPORT
            }
    # one report per pod name: a year of reports comes from pods since replaced
    assert len({g[0]["pod"] for g in reports.values()}) == 40
