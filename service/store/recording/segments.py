"""The decision log's on-disk format: segments of checksummed records, read back.

A log directory holds segments named after the position (``seq``) of their first
decision, ``<first seq, 20 digits>.seg``, and a ``mark`` file: the position up to which
every decision is in the database. Each record is

    <payload length: u32> <crc32 of kind, seq and payload: u32> <kind: u8> <seq: u64> payload

of four kinds: ``H`` opens every segment (its seq is the segment's first position, so
an emptied file is told from one that never held anything), ``S`` and ``A`` carry a
shape's or an answer's JSON text once per segment (a few KB shared by thousands of
decisions: written once, not per decision), and ``D`` a group-committed batch: the
decisions from ``seq`` on, one line each (their fields but those texts, joined by a
unit separator), under one checksum. Positions are consecutive across segments and
restarts, so a missing, emptied or cut segment shows as a gap between what the mark
says is stored and what the segments hold (``scan``).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from mla_switchboard.service.store.rows import Decision as Row

HEADER = struct.Struct("<IIBQ")
MAGIC = b"switchboard-decision-log-1"
SUFFIX = ".seg"
HEAD, SHAPE, ANSWER, DECISION = b"H"[0], b"S"[0], b"A"[0], b"D"[0]
_KIND_SEQ = struct.Struct("<BQ")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)  # times kept exactly, as whole microseconds
FIELDS = 12  # a decision record's fields
_NONE = "\x00"  # a field that is None
READ_CHUNK = 4 * 2**20  # a drain reads the log this much at a time


def record(kind: int, seq: int, payload: bytes) -> bytes:
    """One record, checksummed over its kind, position and payload."""
    crc = zlib.crc32(payload, zlib.crc32(_KIND_SEQ.pack(kind, seq)))
    return HEADER.pack(len(payload), crc, kind, seq) + payload


class Encoder:
    """Decisions as records. A segment carries each shape and answer text once: the
    encoder remembers which its current segment has (``new_segment`` forgets them)."""

    def __init__(self) -> None:
        self._texts: set[str] = set()

    def new_segment(self, first_seq: int) -> bytes:
        self._texts = set()
        return record(HEAD, first_seq, MAGIC)

    def batch(self, items: Sequence[tuple[int, Row]]) -> bytes:
        """Consecutive decisions as one ``D`` record (one checksum for the batch), after
        the texts this segment does not carry yet."""
        out = []
        texts = self._texts
        for seq, row in items:
            if row.shape_id not in texts:
                texts.add(row.shape_id)
                out.append(record(SHAPE, seq, json.dumps([row.shape_id, row.shape_json]).encode()))
            if row.answer_json is not None and row.answer_id not in texts:
                texts.add(row.answer_id)
                out.append(
                    record(ANSWER, seq, json.dumps([row.answer_id, row.answer_json]).encode())
                )
        lines = b"\n".join([_fields(row) for _, row in items])
        out.append(record(DECISION, items[0][0], lines))
        return b"".join(out)

    def decision(self, seq: int, row: Row) -> bytes:
        return self.batch([(seq, row)])


def _fields(row: Row) -> bytes:
    """A decision's fields but its texts, one line: joined by a unit separator (half of
    what JSON costs: this runs for every decision), or as JSON (``J`` first) when a
    field holds a separator, a NUL or a newline itself."""
    node, pod, principal = row.node, row.pod, row.principal
    text = (
        f"{row.id}\x1f{(row.created_at - EPOCH) // MICROSECOND}\x1f{row.cluster}\x1f"
        f"{_NONE if node is None else node}\x1f{_NONE if pod is None else pod}\x1f"
        f"{row.backend}\x1f{row.source}\x1f{row.rules_revision}\x1f{row.shape_id}\x1f"
        f"{row.answer_id}\x1f{_NONE if principal is None else principal}\x1f"
        f"{1 if row.verified else 0}"
    )
    if (
        text.count("\x1f") == FIELDS - 1
        and text.count(_NONE) == (node is None) + (pod is None) + (principal is None)
        and "\n" not in text
    ):
        return text.encode()
    return b"J" + json.dumps(
        [row.id, (row.created_at - EPOCH) // MICROSECOND, row.cluster, node, pod,
         row.backend, row.source, row.rules_revision, row.shape_id, row.answer_id,
         principal, row.verified]
    ).encode()  # fmt: skip


def _parse_fields(payload: bytes) -> list[Any]:
    if payload[:1] == b"J":
        return list(json.loads(payload[1:]))
    parts: list[Any] = payload.decode().split("\x1f")
    if len(parts) != FIELDS:
        raise ValueError(f"{len(parts)} fields, not {FIELDS}")
    for i in (3, 4, 10):
        if parts[i] == _NONE:
            parts[i] = None
    parts[1], parts[7], parts[11] = int(parts[1]), int(parts[7]), parts[11] == "1"
    return parts


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SUFFIX}"


def segment_paths(directory: Path) -> list[tuple[int, Path]]:
    """The segments in ``directory`` by first position (a name that is not one is not
    a segment and is left alone)."""
    found = []
    for path in directory.glob(f"*{SUFFIX}"):
        stem = path.name.removesuffix(SUFFIX)
        if stem.isdigit():
            found.append((int(stem), path))
    return sorted(found)


@dataclass
class Segment:
    """What one segment holds, as read at start: ``last`` is its last decision's
    position (``first - 1`` when it holds none); ``damage`` what is wrong with it."""

    path: Path
    first: int
    last: int
    size: int
    damage: str | None = None
    torn_bytes: int = 0  # an unfinished last write (a crash mid-batch): never acknowledged


@dataclass
class Scan:
    """What a start found: the segments, the mark, and each loss with its count (None
    where it cannot be known: the newest segment gone or emptied)."""

    mark: int
    segments: list[Segment] = field(default_factory=list)
    losses: list[tuple[str, int | None]] = field(default_factory=list)

    @property
    def last(self) -> int:
        """The newest position in the log (the mark when no segment holds more)."""
        return max([self.mark, *(s.last for s in self.segments)])

    @property
    def lost(self) -> int | None:
        """Decisions lost in all, None when some loss cannot be counted."""
        counts = [n for _, n in self.losses]
        return None if None in counts else sum(n for n in counts if n is not None)


def read_mark(directory: Path) -> int:
    """The stored mark (0: none yet, or unreadable: everything in the log is stored
    again, which inserts skip)."""
    try:
        raw = (directory / "mark").read_bytes()
    except OSError:
        return 0
    if len(raw) != 12 or zlib.crc32(raw[:8]) != int.from_bytes(raw[8:], "little"):
        return 0
    return int.from_bytes(raw[:8], "little")


def write_mark(directory: Path, seq: int) -> None:
    """Replace the mark durably: written, synced, renamed over the old one, and the
    rename synced with the directory."""
    body = seq.to_bytes(8, "little")
    raw = body + zlib.crc32(body).to_bytes(4, "little")
    tmp = directory / "mark.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, raw)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / "mark")
    sync_directory(directory)


def sync_directory(directory: Path) -> None:
    """A file created, renamed or removed in ``directory`` survives a power loss only
    once the directory itself is synced."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def records(
    path: Path, offset: int = 0, max_bytes: int = -1
) -> Iterator[tuple[int, int, bytes, int]]:
    """``(kind, seq, payload, end offset)`` of each whole, intact record from
    ``offset`` (within ``max_bytes`` of it); stops at the first cut or damaged one
    (``Segment.torn_bytes``)."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(max_bytes)
        if max_bytes >= 0 and len(data) >= HEADER.size:
            whole = HEADER.size + HEADER.unpack_from(data)[0]
            if whole > len(data):  # a record longer than the chunk: read it whole
                data += f.read(whole - len(data))
    pos, size = 0, len(data)
    while pos + HEADER.size <= size:
        length, crc, kind, seq = HEADER.unpack_from(data, pos)
        end = pos + HEADER.size + length
        if end > size:
            return
        payload = data[pos + HEADER.size : end]
        if zlib.crc32(payload, zlib.crc32(_KIND_SEQ.pack(kind, seq))) != crc:
            return
        yield kind, seq, payload, offset + end
        pos = end


def scan(directory: Path) -> Scan:
    """Read every segment once, checking each record, and compare what they hold with
    the mark: a position after the mark that no segment holds was lost."""
    found = Scan(read_mark(directory))
    for first, path in segment_paths(directory):
        seg = Segment(path, first, first - 1, path.stat().st_size)
        end = 0
        for i, (kind, seq, payload, offset) in enumerate(records(path)):
            if i == 0 and (kind != HEAD or seq != first):
                seg.damage = "its first record is not the segment's header"
                break
            if kind == DECISION:
                if seq != seg.last + 1:
                    seg.damage = f"position {seq} follows {seg.last}"
                    break
                seg.last = seq + payload.count(b"\n")
            end = offset
        if seg.size == 0:
            seg.damage = "emptied"
        elif end == 0 and seg.damage is None:
            seg.damage = "its header is damaged"
        seg.torn_bytes = seg.size - end
        found.segments.append(seg)
    _losses(found)
    return found


def _losses(found: Scan) -> None:
    """Each position after the mark that the segments skip: a gap before a segment
    (one deleted), a segment emptied, damaged or cut short before the next one starts,
    or the newest one emptied or damaged (then how many is unknown). A torn tail of the
    newest alone is the batch a crash interrupted: never acknowledged, not a loss."""
    expected = found.mark + 1
    segs = found.segments
    for i, seg in enumerate(segs):
        if seg.first > expected:
            found.losses.append(
                (f"decisions {expected}-{seg.first - 1} are in no segment (one was deleted)",
                 seg.first - expected)
            )  # fmt: skip
            expected = seg.first
        expected = max(expected, seg.last + 1)
        broken = seg.damage or ("cut short" if seg.torn_bytes else None)
        if broken is None:
            continue
        if i + 1 < len(segs):
            following = segs[i + 1].first
            if following > expected:
                found.losses.append(
                    (f"segment {seg.path.name} {broken}: decisions {expected}-{following - 1}",
                     following - expected)
                )  # fmt: skip
                expected = following
        elif seg.damage is not None:
            found.losses.append(
                (f"segment {seg.path.name} {seg.damage}: decisions from {expected} on", None)
            )


class Reader:
    """Decisions out of the segments in position order, from a cursor kept between
    calls (a drain reads on where it stopped, not from each segment's start)."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._path: Path | None = None
        self._offset = 0
        self._next = 0
        self._texts: dict[str, str] = {}
        self._pending: deque[tuple[int, bytes]] = deque()  # a batch's lines not yet taken

    def read(self, start: int, end: int, limit: int) -> list[tuple[int, Row]]:
        """Up to ``limit`` decisions with positions in ``[start, end]``."""
        out: list[tuple[int, Row]] = []
        if self._path is None or self._next != start or not self._path.exists():
            self._seek(start)
        while self._path is not None:
            if self._take(out, start, end, limit):
                return out
            got = list(records(self._path, self._offset, READ_CHUNK))
            if not got and not self._step(end):
                break
            for kind, seq, payload, offset in got:
                if kind == DECISION and seq > end:
                    return out
                self._offset = offset
                if kind in (SHAPE, ANSWER):
                    key, text = json.loads(payload)
                    self._texts[key] = text
                elif kind == DECISION:
                    lines = payload.split(b"\n")
                    self._pending.extend(zip(range(seq, seq + len(lines)), lines, strict=True))
                    if self._take(out, start, end, limit):
                        return out
        return out

    def _take(self, out: list[tuple[int, Row]], start: int, end: int, limit: int) -> bool:
        """Move decoded decisions of the batch read into ``out``; True when done (at
        ``limit``, or past ``end``)."""
        pending = self._pending
        while pending:
            if len(out) >= limit:
                return True
            seq, line = pending[0]
            if seq > end:
                return True
            pending.popleft()
            if seq >= start:
                out.append((seq, self._row(line)))
                self._next = seq + 1
        return len(out) >= limit

    def _seek(self, start: int) -> None:
        """The segment that holds ``start`` (or the first after it), from its start."""
        paths = segment_paths(self._dir)
        chosen = [p for first, p in paths if first <= start][-1:] or [p for _, p in paths][:1]
        self._path = chosen[0] if chosen else None
        self._offset, self._next, self._texts = 0, start, {}
        self._pending.clear()

    def _step(self, end: int) -> bool:
        """On to the next segment, if one follows the current one."""
        assert self._path is not None
        later = [(f, p) for f, p in segment_paths(self._dir) if p.name > self._path.name]
        if not later or later[0][0] > end:
            return False
        self._path, self._offset, self._texts = later[0][1], 0, {}
        return True

    def _row(self, payload: bytes) -> Row:
        (id_, at, cluster, node, pod, backend, source, revision, shape_id, answer_id,
         principal, verified) = _parse_fields(payload)  # fmt: skip
        return Row(
            id_, EPOCH + timedelta(microseconds=at), cluster, node, pod, backend, source,
            revision, shape_id, answer_id, self._texts.get(shape_id, "{}"),
            self._texts.get(answer_id), principal, verified,
        )  # fmt: skip
