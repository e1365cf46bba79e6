"""Typed rows: what the store takes and gives, read by field name, never by position.

Rows built once per select or once per row of a large read are ``NamedTuple``: as
small and as quick to build as a plain tuple (a decision waits in the recorder's
queue, and pages of thousands of evidence rows are read at each start), with fields
read by name. The column lists of the queries that fill them are taken from their
fields (``columns``), so a query and its row cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple


class Decision(NamedTuple):
    """One decision as the writer takes it (and the spill file keeps it, in this field
    order). The two JSON texts are shared by every decision of one shape or answer and
    stored once each."""

    id: str  # sorts by time: a pod's newest decision has the highest id
    created_at: datetime
    cluster: str
    node: str | None
    pod: str | None  # None or empty: an unnamed pod, logged but not counted in the fleet
    backend: str
    source: str  # what chose the backend: "priority", "override", "measured", ...
    rules_revision: int
    shape_id: str
    answer_id: str
    shape_json: str
    answer_json: str | None
    # who asked: the principal's id (``workload:<pod uid>`` for a verified pod, else the
    # static token's id) and whether the pod's identity was verified. The rollout guards
    # count a report as evidence from this asker, never from the pod name in a body.
    principal: str | None = None
    verified: bool = False


class PodPointer(NamedTuple):
    """A pod's stored newest decision, with the group it is counted in (``bucket``:
    its stage bucket, None for rows written before buckets were stored)."""

    cluster: str
    node: str
    pod: str
    decision_id: str
    shape_id: str | None
    backend: str
    source: str
    bucket: int | None


class GroupCounts(NamedTuple):
    """One ``fleet_counts`` row as stored: per-bucket pod counts as JSON text."""

    cluster: str
    shape_id: str
    backend: str
    source: str
    pods: int
    buckets: str


@dataclass(frozen=True, slots=True)
class LivePod:
    """One pod of the live fleet: its newest decision, when it was made, its shape."""

    cluster: str
    node: str  # empty when the agent sent none
    pod: str
    decision_id: str
    backend: str
    source: str
    seen_at: datetime
    shape_id: str | None
    bucket: int | None


@dataclass(frozen=True, slots=True)
class FleetGroup:
    """Pods whose newest decision is in one (cluster, shape, backend, source) group;
    ``buckets[b]`` of them are in stage bucket ``b``."""

    cluster: str
    shape_id: str
    backend: str
    source: str
    pods: int
    buckets: tuple[int, ...]


class RefusalCount(NamedTuple):
    """Refused selects of one claimed cluster for one reason, and the last one's time."""

    cluster: str
    reason: str
    refused: int  # how many
    last_at: datetime


class MeasurementRead(NamedTuple):
    """The columns of one measurement row that evidence is made of."""

    id: int
    device_name: str
    capability: str | None
    dims: str
    dtype: str
    packages: str
    engine: str
    backend: str
    pod: str
    cluster: str
    at: datetime
    tflops: float | None
    correct: bool
    error: str | None
    impl: str | None
    report_id: str
    counted: bool
    cleared_at: datetime | None


class MeasurementSample(NamedTuple):
    """The columns of a measurement row that a full reload reads, straight from the
    driver (``MeasurementStore.measurement_rows(lean=True)``): ``at`` is a datetime
    from PostgreSQL, the stored text from SQLite."""

    id: int
    counted: bool
    cleared_at: Any
    capability: str | None
    at: Any
    correct: bool
    tflops: float | None
    device_name: str
    dims: str
    dtype: str
    packages: str
    engine: str
    backend: str
    cluster: str
    pod: str
    impl: str | None
    report_id: str
    error: str | None


class FailureRead(NamedTuple):
    """A build failure with what its decision recorded (None where the decision cannot
    be read: the failure's id is still seen)."""

    id: int
    backend: str
    error: str
    at: datetime
    cleared_at: datetime | None
    request_json: str | None
    shape_json: str | None
    cluster: str | None
    node: str | None
    pod: str | None
    decision_id: str


class ClearRead(NamedTuple):
    """One admin's clear of failures as stored."""

    id: int
    at: datetime
    device_name: str
    capability: str
    dims: str
    dtype: str
    packages: str
    engine: str
    backend: str | None


def columns(entity: Any, row: type[tuple[Any, ...]]) -> list[Any]:
    """``entity``'s columns named by ``row``'s fields, in their order: the select
    list of a query whose rows are read as ``row``."""
    return [getattr(entity, name) for name in row._fields]  # type: ignore[attr-defined]


class PendingGuard(NamedTuple):
    """A report's guard evaluation still to run (``guard_pending``): ``kind`` is
    "failure" or "measurements"; ``payload`` the JSON a replica evaluates it from."""

    key: str
    kind: str
    payload: str
    created_at: datetime
