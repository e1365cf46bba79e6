"""A replica's evidence follows the store without rebuilding it: a full reload keeps
what this replica applied meanwhile, another replica's reports arrive through the
incremental read (late commits included), nothing counts twice, and expiry is a
background prune."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.core.evidence import Observation, Situation, observations_of_report
from mla_switchboard.core.schemas import MeasurementReport
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.config import Settings
from mla_switchboard.service.evidence.sync import RowCursor
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.store.models import MeasurementRow, Meta
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from tests.spill_paths import default_spill_path

SITUATION = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", "{}", "switchboard")


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    rt = Runtime(Settings(database_url=f"sqlite:///{tmp_path / 'sb.db'}"))
    rt.start()
    yield rt
    rt.stop()


def samples(rt: Runtime, backend: Backend = Backend.FLASHINFER) -> list[float]:
    return sorted(t for _, _, t in rt.publisher.current().evidence.samples(SITUATION, backend))


def test_a_report_applied_during_a_reload_is_kept(runtime: Runtime) -> None:
    late = Observation(
        SITUATION, "FLASHINFER", "pod-a", 600.0, ok=True, cluster="c", at=datetime.now(UTC),
        source="m:late-report:0",
    )  # fmt: skip
    read = runtime.store.measurements.measurement_rows

    def racing(*args: Any, **kw: Any) -> Any:
        rows = read(*args, **kw)  # the read's snapshot predates the report's commit
        runtime.evidence_sync.apply_local([late])  # ...which this replica applies meanwhile
        return rows

    runtime.store.measurements.measurement_rows = racing  # type: ignore[method-assign]
    runtime.evidence_sync.reload()
    runtime.store.measurements.measurement_rows = read  # type: ignore[method-assign]
    assert samples(runtime) == [600.0]
    assert runtime.publisher.current().evidence.group(SITUATION)[Backend.FLASHINFER].samples == 1


# ------------------------------------------------------------ two replicas, one store


def report(
    cluster: str,
    pod: str,
    tflops: float,
    report_id: str | None,
    backends: tuple[str, ...] = ("FLASHINFER",),
) -> MeasurementReport:
    """A pod's report on the H200 of these tests: one correct result per backend."""
    return MeasurementReport.model_validate(
        {
            "report_id": report_id,
            "cluster": cluster,
            "pod": pod,
            "device": {"name": "NVIDIA H200", "capability": [9, 0]},
            "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
            "dtype": "bfloat16",
            "packages": {},
            "results": [
                {
                    "backend": backend,
                    "shape": {"seqlens": [4096], "num_heads": 128},
                    "median_ms": 1.0,
                    "tflops": tflops,
                    "correct": True,
                }
                for backend in backends
            ],
        }
    )


def store_and_apply(rt: Runtime, r: MeasurementReport) -> None:
    """What the report route does: store, then apply on this replica at once."""
    assert r.report_id is not None
    rt.store.measurements.add_measurements(r, r.report_id)
    rt.evidence_sync.apply_local(observations_of_report(r, datetime.now(UTC), r.report_id))


def wait_for(check: Callable[[], bool], *replicas: Runtime, timeout: float = 5.0) -> None:
    """Until ``check()`` holds, which the replicas' background threads bring about; if
    it does not within ``timeout``, the failure says where each replica's evidence
    upkeep was (what it saw and applied, its cursor, and its thread's stack)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(
                "not seen in time\n"
                + "\n".join(where(rt, f"replica {i}") for i, rt in enumerate(replicas))
            )
        time.sleep(0.02)


def where(rt: Runtime, name: str) -> str:
    """A replica's evidence upkeep as it stands, for a failure's message."""
    sync = rt.evidence_sync
    thread = sync._thread
    frames = sys._current_frames().get(thread.ident) if thread and thread.ident else None
    stack = "".join(traceback.format_stack(frames, limit=10)) if frames else "(no thread)"
    cursor = sync._measurements
    return (
        f"{name}: versions seen {sync._versions}, applied {sync._applied}, degraded "
        f"{sync.degraded!r}, cursor after {cursor.after} gaps {sorted(cursor.gaps)}, "
        f"rows read last {sync.rows_caught_up}, thread alive "
        f"{thread is not None and thread.is_alive()}, at:\n{stack}"
    )


def two_replicas(url: str) -> tuple[Runtime, Runtime]:
    # one pod's wrong result excludes: what a clear does to an exclusion is the subject
    settings = Settings(
        database_url=url,
        spill_path=default_spill_path(url),
        config_poll_s=0.05,
        failure_min_pods=1,
    )
    a, b = Runtime(settings), Runtime(settings)
    a.start()
    b.start()
    return a, b


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_another_replicas_reports_arrive_incrementally(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'sb.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url_factory")()
    )
    a, b = two_replicas(url)
    try:
        full_reads = []
        first_id = b.store.measurements.first_id
        b.store.measurements.first_id = lambda *args: full_reads.append(args) or first_id(*args)  # type: ignore[method-assign]
        store_and_apply(a, report("c1", "p1", 500.0, "report-0001"))
        assert samples(a) == [500.0]  # at once on the replica that took it
        wait_for(lambda: samples(b) == [500.0], a, b)
        store_and_apply(b, report("c1", "p2", 510.0, "report-0002"))
        wait_for(lambda: samples(a) == [500.0, 510.0], a, b)
        time.sleep(0.3)  # several polls: nothing is counted twice
        assert samples(a) == samples(b) == [500.0, 510.0]
        assert full_reads == []  # no full reload: only the new rows were read
        # a row committed late, with an id below one already read (PostgreSQL hands ids
        # out before commit): a third party's rows, written with explicit ids
        store_and_apply(a, report("c1", "p3", 520.0, "report-0003"))
        wait_for(lambda: len(samples(b)) == 3, a, b)
        with Session(a.engine) as s:
            top = s.scalar(select(MeasurementRow.id).order_by(MeasurementRow.id.desc()).limit(1))
        assert top is not None
        _late_row(a, top + 10, "c1", "p4", 530.0, "report-0004")
        wait_for(lambda: len(samples(b)) == 4, a, b)
        _late_row(a, top + 5, "c1", "p5", 540.0, "report-0005")  # below top + 10
        wait_for(lambda: samples(b) == [500.0, 510.0, 520.0, 530.0, 540.0], a, b)
        wait_for(lambda: samples(a) == samples(b), a, b)  # a polls on its own schedule too
        assert full_reads == []
        # and the same rows from a full reload: counted once
        b.evidence_sync.reload()
        assert samples(b) == [500.0, 510.0, 520.0, 530.0, 540.0]
    finally:
        a.stop()
        b.stop()


def _late_row(
    rt: Runtime, row_id: int, cluster: str, pod: str, tflops: float, report_id: str
) -> None:
    """A third party's report whose row id is below the highest one already read, as a
    transaction that commits late leaves it; its commit bumps the evidence version."""
    with Session(rt.engine) as s, s.begin():
        s.execute(
            insert(MeasurementRow).values(
                id=row_id, report_id=report_id, at=datetime.now(UTC), cluster=cluster,
                pod=pod, device_name=SITUATION.device, capability=SITUATION.capability,
                dims=SITUATION.dims, dtype=SITUATION.dtype, packages=SITUATION.packages,
                backend="FLASHINFER", shape="{}", median_ms=1.0, tflops=tflops,
                correct=True, engine=SITUATION.engine, counted=True,
            )
        )  # fmt: skip
        s.execute(update(Meta).where(Meta.key == "evidence_version").values(value=Meta.value + 1))


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_clear_reaches_every_replica_in_place(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A clear is a row every replica reads like the others and applies in place: the
    failures go, nothing is rebuilt (a rebuild held two sets of indexes and seconds of
    CPU on every replica), and a failure noted after the clear still counts."""
    url = (
        f"sqlite:///{tmp_path / 'sb.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url_factory")()
    )
    a, b = two_replicas(url)
    try:
        wrong = report("c1", "p1", 500.0, "report-0001").model_copy(deep=True)
        wrong.results[0] = wrong.results[0].model_copy(update={"correct": False})
        store_and_apply(a, wrong)
        wait_for(lambda: bool(b.publisher.current().evidence.group(SITUATION)), a, b)
        assert b.publisher.current().evidence.exclusions(SITUATION, datetime.now(UTC))
        generations = a.trusted.generation, b.trusted.generation
        a.store.measurements.clear_failures(SITUATION, None, actor="admin", note="fixed")
        a.evidence_sync.catch_up()  # what the clear's write does on its own replica
        assert not a.publisher.current().evidence.group(SITUATION)
        wait_for(lambda: not b.publisher.current().evidence.group(SITUATION), a, b)
        assert (a.trusted.generation, b.trusted.generation) == generations  # not rebuilt
        again = report("c1", "p2", 500.0, "report-0002").model_copy(deep=True)
        again.results[0] = again.results[0].model_copy(update={"correct": False})
        store_and_apply(a, again)
        wait_for(
            lambda: bool(b.publisher.current().evidence.exclusions(SITUATION, datetime.now(UTC))),
            a,
            b,
        )
        for rt in (a, b):  # a restart reads the store: the same as applied in place
            rt.evidence_sync.reload()
            failures = rt.publisher.current().evidence.group(SITUATION)[Backend.FLASHINFER].failures
            assert [f.pod for f in failures] == ["p2"]
    finally:
        a.stop()
        b.stop()


def test_expired_evidence_is_pruned_in_the_background(tmp_path: Path) -> None:
    rt = Runtime(
        Settings(
            database_url=f"sqlite:///{tmp_path / 'sb.db'}",
            measured_max_age_days=1.0 / 86400,  # one second
            config_poll_s=0.05,
        )
    )
    rt.start()
    try:
        store_and_apply(rt, report("c1", "p1", 500.0, "report-0001"))
        assert samples(rt) == [500.0]
        tag = rt.publisher.current().tag
        wait_for(lambda: samples(rt) == [])
        assert rt.publisher.current().tag != tag  # cached decisions are dropped with it
    finally:
        rt.stop()


def test_a_cursor_remembers_gaps_for_a_while() -> None:
    c = RowCursor(after=10)
    c.advance([11, 14, 15], now=0.0)
    assert (c.after, sorted(c.gaps)) == (15, [12, 13])
    c.advance([13], now=1.0)  # a late commit: no longer a gap
    assert sorted(c.gaps) == [12]
    c.advance([], now=61.0)  # a rolled-back insert never shows: forgotten after a while
    assert c.gaps == {}
    full = RowCursor(after=99)  # a full read from the first row of the window
    full.advance([100, 102], now=0.0, start=99)
    assert (full.after, sorted(full.gaps)) == (102, [101])


def test_old_rows_outside_the_window_are_not_read(runtime: Runtime) -> None:
    since = datetime.now(UTC) - timedelta(days=30)
    assert runtime.store.measurements.first_id(False, since) == 1  # an empty table: from the start
    store_and_apply(runtime, report("c1", "p1", 500.0, "report-0001"))
    with Session(runtime.engine) as s, s.begin():
        s.execute(update(MeasurementRow).values(at=datetime.now(UTC) - timedelta(days=40)))
    store_and_apply(runtime, report("c1", "p2", 510.0, "report-0002"))
    assert runtime.store.measurements.first_id(False, since) == 2
    runtime.evidence_sync.full_reload()  # a full load (a start's): a reload rereads in place
    assert samples(runtime) == [510.0]


@pytest.mark.postgres
def test_a_transaction_that_commits_late_is_read_on_postgres(
    pg_url_factory: Callable[[], str],
) -> None:
    """A real late commit: a transaction takes its row id, a later one commits first,
    the replica reads past the first's id; the first commits, and is read after all."""
    a, b = two_replicas(pg_url_factory())
    try:
        slow = Session(a.engine)
        slow.begin()
        slow.add(_row("c1", "p1", 500.0, "report-slow"))
        slow.flush()  # the id is taken now; the row is invisible until commit
        store_and_apply(a, report("c1", "p2", 510.0, "report-fast"))
        wait_for(lambda: samples(b) == [510.0], a, b)
        time.sleep(0.2)
        assert b.evidence_sync._measurements.gaps  # the slow row's id, not seen yet
        slow.execute(
            update(Meta).where(Meta.key == "evidence_version").values(value=Meta.value + 1)
        )
        slow.commit()
        slow.close()
        wait_for(lambda: samples(b) == [500.0, 510.0], a, b)
        wait_for(lambda: samples(a) == [500.0, 510.0], a, b)
    finally:
        a.stop()
        b.stop()


def _row(cluster: str, pod: str, tflops: float, report_id: str) -> MeasurementRow:
    return MeasurementRow(
        report_id=report_id, at=datetime.now(UTC), cluster=cluster, pod=pod,
        device_name=SITUATION.device, capability=SITUATION.capability, dims=SITUATION.dims,
        dtype=SITUATION.dtype, packages=SITUATION.packages, backend="FLASHINFER", shape="{}",
        median_ms=1.0, tflops=tflops, correct=True, engine=SITUATION.engine, counted=True,
    )  # fmt: skip


def test_the_whole_window_reads_both_tables(runtime: Runtime) -> None:
    """Each table is read from its own first row in the window."""
    store_and_apply(runtime, report("c1", "p1", 500.0, "report-0001"))
    with Session(runtime.engine) as s, s.begin():
        s.execute(update(MeasurementRow).values(at=datetime.now(UTC) - timedelta(days=40)))
    store_and_apply(runtime, report("c1", "p2", 510.0, "report-0002"))
    measurements = runtime.store.measurements
    asked: list[bool] = []
    first_id = measurements.first_id

    def recording(failures: bool, since: datetime) -> int:
        asked.append(failures)
        return first_id(failures, since)

    measurements.first_id = recording  # type: ignore[method-assign]
    since = datetime.now(UTC) - timedelta(days=30)
    assert [o.tflops for o in measurements.evidence(since)] == [510.0]
    assert asked == [False, True]


def test_a_start_reads_only_the_window_and_keeps_each_pods_newest(tmp_path: Path) -> None:
    """Ninety days of history, every pod reporting every day: a start reads the rows
    of the 30-day window and no older one, in pages, and holds each pod's newest few
    results (what counts), whatever the history."""
    url = f"sqlite:///{tmp_path / 'sb.db'}"
    settings = Settings(
        database_url=url,
        spill_path=default_spill_path(url),
        measured_samples_per_pod=4,
        measured_min_pods=1,
    )
    rt = Runtime(settings)
    rt.prepare_store()
    now = datetime.now(UTC)
    pods, days = 20, 90
    rows = [
        _row(f"c{p % 3}", f"p{p}", 400.0 + day, f"report-{day:03d}-{p:03d}")
        for day in range(days)
        for p in range(pods)
    ]
    for k, row in enumerate(rows):  # oldest first, as reports arrive
        row.at = now - timedelta(days=days - 1 - k // pods, minutes=1)
    with Session(rt.engine) as s, s.begin():
        s.add_all(rows)
    read: list[int] = []
    pages: list[int] = []
    measurement_rows = rt.store.measurements.measurement_rows

    def counting(*args: Any, **kw: Any) -> Any:
        page = measurement_rows(*args, **kw)
        read.extend(page.ids)
        pages.append(len(page.ids))
        return page

    rt.store.measurements.measurement_rows = counting  # type: ignore[method-assign]
    rt.start()
    try:
        in_window = 30 * pods  # days 60..89 (the 30th day back is just outside)
        assert len(read) == in_window, (len(read), in_window)
        assert max(pages) <= 1000  # in pages
        evidence = rt.publisher.current().evidence
        stats = evidence.group(SITUATION)[Backend.FLASHINFER]
        assert (stats.pods, stats.samples) == (pods, 4 * pods)
        assert sorted(set(samples(rt))) == [486.0, 487.0, 488.0, 489.0]  # each pod's newest 4
    finally:
        rt.stop()


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_full_reloads_lean_rows_read_as_observations_do(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The rows a full reload reads through the driver (no observation each) are the
    results, failures and choices of what counts that the observations give, to the
    bit of each time (what orders a pod's samples and expires them)."""
    url = (
        f"sqlite:///{tmp_path / 'sb.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url_factory")()
    )
    rt = Runtime(Settings(database_url=url, spill_path=default_spill_path(url)))
    rt.prepare_store()
    now = datetime.now(UTC)
    rows = [_row("c1", f"p{i}", 400.0 + i, f"report-{i:04d}") for i in range(40)]
    for i, row in enumerate(rows):
        row.at = now - timedelta(seconds=i * 7919.123457)  # some before the window
    rows[3].correct, rows[3].tflops, rows[3].error = False, None, "max abs error 0.5"
    rows[4].counted = False
    rows[5].cleared_at = now
    rows[6].capability = None
    rows[7].impl = "fa3"
    with Session(rt.engine) as s, s.begin():
        s.add_all(rows)
    try:
        since = now - timedelta(days=3)
        read = rt.store.measurements.measurement_rows
        for after, limit in ((0, 1000), (0, 7), (10, 7)):
            lean = read(since, after=after, lean=True, limit=limit)
            full = read(since, after=after, limit=limit)
            assert (lean.ids, lean.more) == (full.ids, full.more)
            assert lean.observations == [o for o in full.observations if not o.ok]
            assert [s[:7] for s in lean.samples] == [
                (o.situation, o.backend, o.cluster, o.pod, o.at.timestamp(), o.tflops, o.impl)  # type: ignore[union-attr]
                for o in full.observations
                if o.ok
            ]
            assert [f"m:{s[7]}" for s in lean.samples] == [
                o.source.rsplit(":", 1)[0] for o in full.observations if o.ok
            ]
        wrong = read(since, after=0, lean=True).observations
        assert [(o.pod, o.ok, o.error) for o in wrong] == [("p3", False, "max abs error 0.5")]
    finally:
        rt.engine.dispose()
        rt.writer_engine.dispose()


def test_a_full_reads_cursor_finds_the_same_gaps_without_sorting() -> None:
    for seen in ([100, 101, 102], [100, 102, 103, 107], [105], list(range(100, 3000, 2))):
        plain, ordered = RowCursor(99), RowCursor(99)
        plain.advance(seen, now=0.0, start=99)
        ordered.advance(seen, now=0.0, start=99, ordered=True)
        assert (ordered.after, ordered.gaps) == (plain.after, plain.gaps)


def test_a_read_back_during_a_running_catch_up_meets_the_reports_before_it(
    runtime: Runtime,
) -> None:
    """A read of this replica's own reports (``read_back``, as the measurements summary
    does) while an incremental read is running waits for that read, then reads what it
    may have missed: it answers with its reports in what was read. Before: the running
    read had cleared a "reports not yet read" flag as it began, so a read back arriving
    meanwhile skipped reading and answered from before them."""
    sync = runtime.evidence_sync
    read = runtime.store.measurements.measurement_rows
    inside, go_on = threading.Event(), threading.Event()

    def held(*args: Any, **kw: Any) -> Any:
        if threading.current_thread().name == "running-catch-up":
            inside.set()
            go_on.wait(30)
        return read(*args, **kw)

    runtime.store.measurements.measurement_rows = held  # type: ignore[method-assign]
    try:
        store_and_apply(runtime, report("c", "pod-a", 600.0, "report-a"))
        running = threading.Thread(target=sync.catch_up, name="running-catch-up")
        running.start()
        assert inside.wait(30)
        # the running read began after the report: it will meet it, but has not yet
        seen: list[int] = []

        def read_back() -> None:
            sync.read_back()
            seen.append(sync.trusted.read_through["measurement_id"])

        reader = threading.Thread(target=read_back)
        reader.start()
        reader.join(1.0)  # a read back that does not wait has answered by now
        go_on.set()
        running.join(30)
        reader.join(30)
    finally:
        go_on.set()
        runtime.store.measurements.measurement_rows = read  # type: ignore[method-assign]
    with runtime.engine.connect() as conn:
        newest = conn.exec_driver_sql("SELECT max(id) FROM measurements").scalar_one()
    assert seen == [newest], (seen, newest)
