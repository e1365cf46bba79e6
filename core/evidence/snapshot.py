"""What a bulk load counts, as bytes: a compact snapshot that a later load starts from.

A snapshot holds every pod's *record* (its counted correct results, bounded per pod)
per situation and backend, as an :class:`EvidenceLoader` holds them after reading the
rows up to some id. A start (or a full reload) that restores it and reads only the
rows after that id ends with exactly what a read of the whole window gives: each
record is the pod's newest ``per_pod`` results, and the window's cutoff, which has
moved on since, is applied to the restored records (a pod's newest results within the
window are its newest results, cut at the window's edge). So a start costs what the
snapshot holds (the pods, not their history) plus the rows since.

Failures are not in it: they are few, and an admin's clear changes them in the store
(the reader reads them again).

Layout: a magic line, a JSON header (per group: situation, backend, pods, byte
lengths), then per group the pods' keys (newline-separated), a byte per pod (its
sample count) and the records back to back; a CRC-32 of everything before it last.
Anything that does not read back exactly is :class:`SnapshotDamaged`.

A store keeps a snapshot in *parts* (:func:`encode_parts`): each one such a snapshot of
its own holding at most about ``PART_BYTES`` of pods (a group split across parts as
it fills them), so that neither writing nor reading one ever allocates a block the
size of the whole (22 MB at 100,000 pods in one situation): glibc keeps much of a
large block once freed, and a start's memory stayed that much higher for it.
:func:`decode_parts` reads them back one at a time.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import astuple
from sys import intern

from mla_switchboard.core.evidence.records import (
    IMPL_NAMES,
    SAMPLE_SIZE,
    Record,
    impl_id_of,
    split_expired,
)
from mla_switchboard.core.evidence.situations import Situation

__all__ = [
    "MAGIC",
    "PART_BYTES",
    "SnapshotDamaged",
    "SnapshotGroup",
    "decode_parts",
    "decode_snapshot",
    "encode_parts",
    "encode_snapshot",
]

MAGIC = b"switchboard-evidence-snapshot 1\n"
_LENGTH = struct.Struct("<I")
_CRC = struct.Struct("<I")
PART_BYTES = 256 * 1024
"""About the most a part holds (pod keys and records): a few hundred KB, small
enough that a part's bytes, its driver buffer and its decoding never need a large
block of their own."""

SnapshotGroup = tuple[Situation, str, dict[str, Record]]
"""One situation and backend (its registry name) and its pods' records by pod key."""


class SnapshotDamaged(ValueError):
    """A snapshot that does not read back (truncated, altered, another layout)."""


def encode_snapshot(per_pod: int, groups: Iterable[SnapshotGroup]) -> bytes:
    """The snapshot of ``groups`` (records of at most ``per_pod`` samples each)."""
    header: list[dict[str, object]] = []
    parts: list[bytes] = []
    for situation, backend, records in groups:
        if not records:
            continue
        keys = "\n".join(records).encode()
        if keys.count(b"\n") != len(records) - 1:
            raise ValueError("a pod key with a newline cannot be kept in a snapshot")
        counts = bytes(len(r) // SAMPLE_SIZE for r in records.values())
        body = b"".join(records.values())
        header.append(
            {"situation": astuple(situation), "backend": backend, "pods": len(records),
             "keys": len(keys), "records": len(body)}
        )  # fmt: skip
        parts += (keys, counts, body)
    # a record names its code paths by this process's numbers: the names go along
    head = json.dumps({"per_pod": per_pod, "impls": IMPL_NAMES[1:], "groups": header}).encode()
    pieces = [MAGIC, _LENGTH.pack(len(head)), head, *parts]
    crc = 0
    for piece in pieces:  # not over a joined copy: the result is the only one made
        crc = zlib.crc32(piece, crc)
    pieces.append(_CRC.pack(crc))
    return b"".join(pieces)


def encode_parts(
    per_pod: int, groups: Iterable[SnapshotGroup], part_bytes: int = PART_BYTES
) -> Iterator[bytes]:
    """The snapshot of ``groups`` in parts, each a snapshot of its own
    (:func:`encode_snapshot`) of at most about ``part_bytes`` of pod keys and records
    (more only for a single pod bigger than that); at least one part, so that an empty
    snapshot is one too. Made one at a time, as they are consumed."""
    pending: list[SnapshotGroup] = []
    size = 0
    made = 0
    for situation, backend, records in groups:
        chunk: dict[str, Record] = {}
        for key, record in records.items():
            chunk[key] = record
            size += len(key) + 1 + len(record)
            if size >= part_bytes:
                pending.append((situation, backend, chunk))
                yield encode_snapshot(per_pod, pending)
                made += 1
                pending, chunk, size = [], {}, 0
        if chunk:
            pending.append((situation, backend, chunk))
    if pending or not made:
        yield encode_snapshot(per_pod, pending)


def decode_parts(
    parts: Iterable[bytes], count: int, per_pod: int, cutoff: float
) -> Iterator[SnapshotGroup]:
    """The groups of ``count`` parts (:func:`encode_parts`, in order), one part decoded
    at a time as the groups are consumed. A group is yielded once, with the first part
    that holds it; its later parts' records go into that same dict as they are decoded
    (the consumer holds it by then: each record is inserted once, not once into a
    part's dict and again into the group's), so the groups are whole only when the
    iteration ends. A part that does not read back, or fewer or more parts than
    ``count``, raises :class:`SnapshotDamaged` (the caller drops what it took)."""
    held: dict[tuple[Situation, str], dict[str, Record]] = {}
    seen = 0
    for part in parts:
        seen += 1
        if seen > count:
            raise SnapshotDamaged(f"more than its {count} parts")
        try:
            groups = decode_snapshot(part, per_pod, cutoff, held)
        except SnapshotDamaged as exc:
            raise SnapshotDamaged(f"part {seen} of {count}: {exc}") from exc
        del part
        yield from groups
    if seen != count:
        raise SnapshotDamaged(f"{seen} of its {count} parts found")


def decode_snapshot(
    blob: bytes,
    per_pod: int,
    cutoff: float,
    held: dict[tuple[Situation, str], dict[str, Record]] | None = None,
) -> Iterator[SnapshotGroup]:
    """The groups of ``blob``, each record cut at ``cutoff`` (a time key: older dated
    samples are dropped, a pod left with none is dropped). Raises
    :class:`SnapshotDamaged` before yielding anything when the blob is not whole, or
    was made with another ``per_pod`` (its records were bounded differently). With
    ``held`` (by situation and backend), a group found there is decoded into that
    dict and not yielded; a new one is yielded and added to it."""
    view = memoryview(blob)
    if len(blob) < len(MAGIC) + _LENGTH.size + _CRC.size or not blob.startswith(MAGIC):
        raise SnapshotDamaged("not an evidence snapshot")
    (crc,) = _CRC.unpack_from(view, len(blob) - _CRC.size)
    if zlib.crc32(view[: len(blob) - _CRC.size]) != crc:
        raise SnapshotDamaged("checksum mismatch")
    (head_len,) = _LENGTH.unpack_from(view, len(MAGIC))
    at = len(MAGIC) + _LENGTH.size
    try:
        head = json.loads(bytes(view[at : at + head_len]))
        groups = [
            (Situation(*g["situation"]), str(g["backend"]), int(g["pods"]), int(g["keys"]),
             int(g["records"]))
            for g in head["groups"]
        ]  # fmt: skip
        made_with = int(head["per_pod"])
        impls = [0] + [impl_id_of(str(name)) for name in head["impls"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotDamaged(f"unreadable header: {exc}") from exc
    if made_with != per_pod:
        raise SnapshotDamaged(f"made with {made_with} samples per pod, not {per_pod}")
    at += head_len
    laid_out = at + sum(pods + keys + body for _, _, pods, keys, body in groups) + _CRC.size
    if laid_out != len(blob):
        raise SnapshotDamaged("lengths do not add up")
    renumber = None if impls == list(range(len(impls))) else impls
    return _groups(view, at, groups, cutoff, renumber, held)


def _groups(
    view: memoryview,
    at: int,
    groups: list[tuple[Situation, str, int, int, int]],
    cutoff: float,
    renumber: list[int] | None,
    held: dict[tuple[Situation, str], dict[str, Record]] | None,
) -> Iterator[SnapshotGroup]:
    for situation, backend, pods, keys_len, body_len in groups:
        # interned: one string per pod for all its situations and backends, as the
        # indexes' build keeps them (each group's own copies cost 70 bytes a pod)
        keys = [intern(k) for k in bytes(view[at : at + keys_len]).decode().split("\n")]
        at += keys_len
        counts = view[at : at + pods]
        at += pods
        body = bytes(view[at : at + body_len])
        at += body_len
        if len(keys) != pods or sum(counts) * SAMPLE_SIZE != body_len:
            raise SnapshotDamaged("a group's pods do not match its records")
        known = None if held is None else held.get((situation, backend))
        records: dict[str, Record] = {} if known is None else known
        offset = 0
        for key, n in zip(keys, counts, strict=True):
            end = offset + n * SAMPLE_SIZE
            record = body[offset:end]
            offset = end
            if struct.unpack_from("<d", record)[0] < cutoff:  # its oldest sample expired
                record = split_expired(record, cutoff)[0]
                if not record:
                    continue
            if renumber is not None:  # this process numbers the code paths otherwise
                record = _renumbered(record, renumber)
            records[key] = record
        if known is None:
            if held is not None:
                held[(situation, backend)] = records
            yield situation, backend, records


_IMPL = struct.Struct("<H")
_IMPL_AT = 16  # a sample's impl id after its time and TFLOP/s


def _renumbered(record: Record, impls: list[int]) -> Record:
    out = bytearray(record)
    for offset in range(_IMPL_AT, len(out), SAMPLE_SIZE):
        (old,) = _IMPL.unpack_from(out, offset)
        _IMPL.pack_into(out, offset, impls[old] if old < len(impls) else 0)
    return bytes(out)
