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
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import astuple

from mla_switchboard.core.evidence.records import (
    IMPL_NAMES,
    SAMPLE_SIZE,
    Record,
    impl_id_of,
    split_expired,
)
from mla_switchboard.core.evidence.situations import Situation

__all__ = ["MAGIC", "SnapshotDamaged", "SnapshotGroup", "decode_snapshot", "encode_snapshot"]

MAGIC = b"switchboard-evidence-snapshot 1\n"
_LENGTH = struct.Struct("<I")
_CRC = struct.Struct("<I")

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
    payload = b"".join([MAGIC, _LENGTH.pack(len(head)), head, *parts])
    return payload + _CRC.pack(zlib.crc32(payload))


def decode_snapshot(blob: bytes, per_pod: int, cutoff: float) -> Iterator[SnapshotGroup]:
    """The groups of ``blob``, each record cut at ``cutoff`` (a time key: older dated
    samples are dropped, a pod left with none is dropped). Raises
    :class:`SnapshotDamaged` before yielding anything when the blob is not whole, or
    was made with another ``per_pod`` (its records were bounded differently)."""
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
    return _groups(view, at, groups, cutoff, renumber)


def _groups(
    view: memoryview,
    at: int,
    groups: list[tuple[Situation, str, int, int, int]],
    cutoff: float,
    renumber: list[int] | None,
) -> Iterator[SnapshotGroup]:
    for situation, backend, pods, keys_len, body_len in groups:
        keys = bytes(view[at : at + keys_len]).decode().split("\n")
        at += keys_len
        counts = view[at : at + pods]
        at += pods
        body = bytes(view[at : at + body_len])
        at += body_len
        if len(keys) != pods or sum(counts) * SAMPLE_SIZE != body_len:
            raise SnapshotDamaged("a group's pods do not match its records")
        records: dict[str, Record] = {}
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
        yield situation, backend, records


_IMPL = struct.Struct("<H")
_IMPL_AT = 16  # a sample's impl id after its time and TFLOP/s


def _renumbered(record: Record, impls: list[int]) -> Record:
    out = bytearray(record)
    for offset in range(_IMPL_AT, len(out), SAMPLE_SIZE):
        (old,) = _IMPL.unpack_from(out, offset)
        _IMPL.pack_into(out, offset, impls[old] if old < len(impls) else 0)
    return bytes(out)
