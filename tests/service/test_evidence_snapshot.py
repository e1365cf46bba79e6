"""A start restores the newest evidence snapshot and reads only the rows after it,
ending with exactly what a read of the whole window gives; a reload touches only the
new rows; a snapshot that is missing or does not read back means a full read, said."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.core.evidence import EvidenceLoader, Situation
from mla_switchboard.core.evidence.snapshot import (
    SnapshotDamaged,
    decode_parts,
    decode_snapshot,
    encode_parts,
    encode_snapshot,
)
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.config import Settings
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.store.models import (
    EvidenceSnapshotPartRow,
    EvidenceSnapshotRow,
    MeasurementRow,
)
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from tests.spill_paths import default_spill_path

SITUATION = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", "{}", "switchboard")
PODS = 12


def _row(cluster: str, pod: str, backend: str, tflops: float, at: datetime) -> MeasurementRow:
    return MeasurementRow(
        report_id=f"{pod}-{backend[:2]}-{at.timestamp():.0f}"[:26], at=at, cluster=cluster, pod=pod,
        device_name=SITUATION.device, capability=SITUATION.capability, dims=SITUATION.dims,
        dtype=SITUATION.dtype, packages=SITUATION.packages, backend=backend, shape="{}",
        median_ms=1.0, tflops=tflops, correct=True, engine=SITUATION.engine, counted=True,
    )  # fmt: skip


def history(days: int, end: datetime, salt: float = 0.0) -> list[MeasurementRow]:
    """Each pod of three clusters reporting both backends once a day up to ``end``
    (days before the window included); every 7th pod's CUDNN result on every 5th day
    wrong."""
    rows = []
    for day in range(days):
        at = end - timedelta(days=days - 1 - day, minutes=1)
        for p in range(PODS):
            for backend in ("FLASHINFER", "CUDNN"):
                row = _row(f"c{p % 3}", f"p{p}", backend, 400.0 + day + p / 10 + salt, at)
                if backend == "CUDNN" and p % 7 == 0 and day % 5 == 0:
                    row.correct, row.tflops, row.error = False, None, "max abs error 0.5"
                rows.append(row)
    return rows


def store_rows(rt: Runtime, rows: list[MeasurementRow]) -> None:
    with Session(rt.engine, expire_on_commit=False) as s, s.begin():
        s.add_all(rows)


def runtime(url: str) -> Runtime:
    return Runtime(
        Settings(
            database_url=url,
            spill_path=default_spill_path(url),
            measured_samples_per_pod=4,
            measured_min_pods=1,
            config_poll_s=3600.0,  # the background thread stays out of these tests' way
        )
    )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sb.db'}"
    return request.getfixturevalue("pg_url_factory")()  # type: ignore[no-any-return]


def answers(rt: Runtime) -> dict[str, Any]:
    """Everything the evidence answers with: the summary, every sample, every record."""
    evidence = rt.publisher.current().evidence
    now = datetime.now(UTC)
    loader = EvidenceLoader(rt.trusted.all.per_pod)
    loader.add_index(rt.trusted.all)
    return {
        "summary": evidence.summary(now),
        "samples": {b: sorted(rt.trusted.all.samples(SITUATION, b)) for b in Backend},
        "records": {(s, b): dict(sorted(r.items())) for s, b, r in loader.groups() if r},
        "exclusions": evidence.exclusions(SITUATION, now, None),
    }


def full_read(url: str) -> dict[str, Any]:
    """What a start that reads the whole window (no snapshot) holds."""
    rt = runtime(url)
    rt.evidence_sync.snapshots = None
    rt.start()
    try:
        assert rt.evidence_sync.last_load.fallback == "no snapshot store"
        return answers(rt)
    finally:
        rt.stop()


@pytest.fixture
def snapshotted(url: str) -> Iterator[Runtime]:
    """A replica that started on 40 days of history (no snapshot: it read the window)
    and wrote the snapshot of what it read."""
    rt = runtime(url)
    rt.prepare_store()
    store_rows(rt, history(40, datetime.now(UTC) - timedelta(hours=2)))
    rt.start()
    assert rt.evidence_sync.last_load.snapshot_id is None
    assert rt.evidence_sync.last_load.fallback == "no snapshot yet"
    rt.evidence_sync.save_snapshot()  # unless the background thread's first tick did
    deadline = time.monotonic() + 30
    while rt.store.snapshots.latest_made() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    yield rt
    rt.stop()


def test_a_start_from_the_snapshot_and_the_rows_after_it_holds_what_a_full_read_does(
    url: str, snapshotted: Runtime
) -> None:
    tail = history(3, datetime.now(UTC), salt=0.05)  # newer results for every pod
    store_rows(snapshotted, tail)
    # a wrong result the snapshot covers, cleared after it was made
    snapshotted.store.measurements.clear_failures(
        SITUATION, "CUDNN", actor="test", note="fixed in the driver"
    )
    store_rows(snapshotted, history(1, datetime.now(UTC), salt=0.07))  # failures again
    rt = runtime(url)
    rt.start()
    try:
        note = rt.evidence_sync.last_load
        assert note.snapshot_id is not None and note.fallback is None
        assert note.rows_read == len(tail) + 2 * PODS  # the rows after it, no other
        assert note.pods_restored > 0
        restored = answers(rt)
    finally:
        rt.stop()
    assert restored == full_read(url)


def test_a_reload_after_new_reports_reads_only_them(url: str, snapshotted: Runtime) -> None:
    """A reload (asked for, or the store's epoch moved) reads the new rows and the
    window's failures again, in place: no measurement row it read before."""
    new = [_row("c1", f"new-{i}", "FLASHINFER", 700.0 + i, datetime.now(UTC)) for i in range(5)]
    store_rows(snapshotted, new)
    read: list[int] = []
    measurement_rows = snapshotted.store.measurements.measurement_rows

    def counting(*args: Any, **kw: Any) -> Any:
        page = measurement_rows(*args, **kw)
        read.extend(page.ids)
        return page

    snapshotted.store.measurements.measurement_rows = counting  # type: ignore[method-assign]
    snapshotted.evidence_sync.reload()
    note = snapshotted.evidence_sync.last_load
    assert (note.rows_read, len(read)) == (5, 5)
    assert sorted(read) == sorted(r.id for r in new)
    wrong = sum(1 for p in range(PODS) if p % 7 == 0) * len(range(0, 40, 5))
    assert note.wrong_rows_read <= wrong  # the covered wrong results, through their index
    assert answers(snapshotted) == full_read(url)


def resave_in_parts(rt: Runtime, part_bytes: int) -> int:
    """The newest snapshot written again in parts of ``part_bytes`` (many, for these
    few pods); how many."""
    with Session(rt.engine) as s, s.begin():
        row = s.scalars(select(EvidenceSnapshotRow)).one()
        stored = b"".join(
            s.scalars(
                select(EvidenceSnapshotPartRow.payload)
                .where(EvidenceSnapshotPartRow.snapshot_id == row.id)
                .order_by(EvidenceSnapshotPartRow.seq)
            )
        )
        assert row.parts == 1  # these few pods fit in one part
        parts = list(encode_parts(4, decode_snapshot(stored, 4, 0.0), part_bytes))
        s.execute(delete(EvidenceSnapshotPartRow))
        s.add_all(
            EvidenceSnapshotPartRow(snapshot_id=row.id, seq=i, payload=part)
            for i, part in enumerate(parts)
        )
        row.parts = len(parts)
    return len(parts)


@pytest.mark.parametrize(
    "damage", ["truncated", "altered", "missing", "per_pod", "part_missing", "part_altered"]
)
def test_a_damaged_or_missing_snapshot_means_a_full_read_and_says_so(
    url: str, snapshotted: Runtime, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    if damage.startswith("part_"):
        assert resave_in_parts(snapshotted, 200) > 5
    with Session(snapshotted.engine) as s, s.begin():
        row = s.scalars(select(EvidenceSnapshotRow)).one()
        parts = list(s.scalars(select(EvidenceSnapshotPartRow).order_by("seq")))
        part = parts[len(parts) // 2]
        if damage == "truncated":
            part.payload = part.payload[: len(part.payload) // 2]
        elif damage in ("altered", "part_altered"):
            payload = bytearray(part.payload)
            payload[len(payload) // 2] ^= 0xFF
            part.payload = bytes(payload)
        elif damage == "per_pod":
            part.payload = encode_snapshot(8, [])
        elif damage == "part_missing":
            s.delete(part)
        else:
            s.delete(row)
    store_rows(snapshotted, history(1, datetime.now(UTC), salt=0.3))
    rt = runtime(url)
    with caplog.at_level("WARNING", logger="switchboard.evidence"):
        rt.start()
    try:
        note = rt.evidence_sync.last_load
        started = answers(rt)
    finally:
        rt.stop()
    assert note.snapshot_id is None
    expected = {
        "truncated": "checksum mismatch",
        "altered": "checksum mismatch",
        "per_pod": "made with 8 samples per pod, not 4",
        "missing": "no snapshot yet",
        "part_missing": "parts found",
        "part_altered": "checksum mismatch",
    }[damage]
    assert note.fallback is not None and expected in note.fallback
    if damage != "missing":
        assert expected in caplog.text
    with Session(snapshotted.engine) as s:
        total = s.scalar(select(MeasurementRow.id).order_by(MeasurementRow.id.desc()).limit(1))
    assert 0 < note.rows_read <= (total or 0)  # the window's rows, all of them
    assert started == full_read(url)


def test_a_snapshot_reads_back_cut_at_the_window() -> None:
    loader = EvidenceLoader(4)
    now = datetime.now(UTC)
    loader.add_samples(
        (SITUATION, "FLASHINFER", "c", f"p{p}", (now - timedelta(days=d)).timestamp(),
         400.0 + d, None, "r")
        for p in range(3)
        for d in (40, 20, 10, 1)
    )  # fmt: skip
    blob = encode_snapshot(4, loader.groups())
    cutoff = (now - timedelta(days=30)).timestamp()
    ((situation, backend, records),) = decode_snapshot(blob, 4, cutoff)
    assert (situation, backend) == (SITUATION, "FLASHINFER")
    assert {len(r) // 18 for r in records.values()} == {3}  # the 40-day-old sample cut
    with pytest.raises(SnapshotDamaged):
        decode_snapshot(blob[:-1] + bytes([blob[-1] ^ 1]), 4, cutoff)
    with pytest.raises(SnapshotDamaged):
        decode_snapshot(b"junk", 4, cutoff)


def test_a_running_replica_refreshes_the_snapshot_from_the_store(
    url: str, snapshotted: Runtime
) -> None:
    """The next start reads the rows after the newest snapshot, whoever wrote it."""
    store_rows(snapshotted, history(2, datetime.now(UTC), salt=0.2))
    first = snapshotted.store.snapshots.latest_made()
    assert snapshotted.evidence_sync.refresh_snapshot() is None  # not due yet
    made = snapshotted.evidence_sync.refresh_snapshot(force=True)
    assert made is not None
    latest = snapshotted.store.snapshots.latest_made()
    assert first is not None and latest is not None and latest[1] > first[1]
    rt = runtime(url)
    rt.start()
    try:
        assert rt.evidence_sync.last_load.snapshot_id == made
        assert rt.evidence_sync.last_load.rows_read == 0
        restored = answers(rt)
    finally:
        rt.stop()
    with Session(snapshotted.engine) as s:
        s.execute(update(EvidenceSnapshotRow).values(made_at=datetime.now(UTC)))
    assert restored == full_read(url)


def test_a_snapshot_names_its_code_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record numbers its code paths as the process that made it did; another
    process reads the names and numbers them its own way."""
    from mla_switchboard.core.evidence import records, snapshot

    sample = records.RECORD.pack(datetime.now(UTC).timestamp(), 500.0, 2)
    with monkeypatch.context() as m:
        m.setattr(snapshot, "IMPL_NAMES", [None, "made-elsewhere-a", "made-elsewhere-b"])
        blob = encode_snapshot(4, [(SITUATION, "FLASHINFER", {"c\0p": sample})])
    records.impl_id_of("made-elsewhere-b")  # numbered here before the other name
    ((_, _, read),) = decode_snapshot(blob, 4, 0.0)
    (_, tflops, impl) = records.RECORD.unpack(read["c\0p"])
    assert (tflops, records.IMPL_NAMES[impl]) == (500.0, "made-elsewhere-b")


def test_a_snapshot_in_many_parts_restores_what_a_full_read_holds(
    url: str, snapshotted: Runtime
) -> None:
    """Parts of a few pods each, a group spread over several: each is decoded in
    turn into the same records as one part, and a start from them holds exactly what
    a read of the whole window does."""
    count = resave_in_parts(snapshotted, 300)
    assert count > 5
    store_rows(snapshotted, history(1, datetime.now(UTC), salt=0.4))
    rt = runtime(url)
    rt.start()
    try:
        note = rt.evidence_sync.last_load
        assert note.snapshot_id is not None and note.fallback is None
        assert note.pods_restored == snapshotted.store.snapshots.latest().pods  # type: ignore[union-attr]
        restored = answers(rt)
    finally:
        rt.stop()
    assert restored == full_read(url)


def test_a_snapshot_of_the_one_payload_layout_still_loads(url: str, snapshotted: Runtime) -> None:
    """A snapshot written before parts (its bytes in the row, ``parts`` 0) is read as
    it is: a start from it holds what a full read does."""
    with Session(snapshotted.engine) as s, s.begin():
        row = s.scalars(select(EvidenceSnapshotRow)).one()
        (payload,) = s.scalars(select(EvidenceSnapshotPartRow.payload))
        s.execute(delete(EvidenceSnapshotPartRow))
        row.payload, row.parts = payload, 0
    rt = runtime(url)
    rt.start()
    try:
        note = rt.evidence_sync.last_load
        assert note.snapshot_id is not None and note.fallback is None
        assert note.pods_restored > 0
        restored = answers(rt)
    finally:
        rt.stop()
    assert restored == full_read(url)


def test_parts_read_back_as_the_whole_and_each_is_small() -> None:
    loader = EvidenceLoader(4)
    now = datetime.now(UTC).timestamp()
    loader.add_samples(
        (SITUATION, backend, f"c{p % 3}", f"p{p}", now - d, 400.0 + d, None, "r")
        for backend in ("FLASHINFER", "CUDNN")
        for p in range(500)
        for d in range(4)
    )  # fmt: skip
    whole = {(s, b): r for s, b, r in loader.groups()}
    parts = list(encode_parts(4, loader.groups(), 4096))
    assert len(parts) > 10
    assert max(len(p) for p in parts) < 4096 + 1024  # a part's pods, its header, one pod
    read: dict[tuple[Situation, str], dict[str, bytes]] = {}
    for situation, backend, records in decode_parts(parts, len(parts), 4, 0.0):
        assert (situation, backend) not in read  # each group once, filled as parts come
        read[(situation, backend)] = records
    assert read == whole
    assert [*decode_parts(list(encode_parts(4, [])), 1, 4, 0.0)] == []  # empty: one part
    with pytest.raises(SnapshotDamaged, match="of its"):
        list(decode_parts(parts[:-1], len(parts), 4, 0.0))
    with pytest.raises(SnapshotDamaged, match="more than"):
        list(decode_parts(parts, len(parts) - 1, 4, 0.0))
    damaged = [*parts[:3], parts[3][:-1] + bytes([parts[3][-1] ^ 1]), *parts[4:]]
    with pytest.raises(SnapshotDamaged, match=f"part 4 of {len(parts)}: checksum"):
        list(decode_parts(damaged, len(parts), 4, 0.0))
