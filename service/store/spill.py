"""The spill file: a local log of the decisions the store could not take yet.

One decision per line, a JSON array in ``Decision`` field order (``created_at`` as ISO text), so
that each line can be checked, replayed or set aside on its own: a bad line never costs
its neighbours. Appends take an exclusive ``flock`` and end with ``fsync``, so several
replicas may share one path (a shared volume) and an acknowledged append survives a
crash of the process or the machine.

A drain first takes the file out of the way: under the lock it renames it to
``<name>.replay-<pid>-<ns>`` and keeps the lock while it reads. An appender that opened
the old name waits for that lock, sees the name now points elsewhere and opens the new
file, so every line is drained by exactly one replica. A drain that stops halfway (the
store went away, the process died) leaves its ``.replay-*`` file, which any later drain
takes once nobody holds its lock. Lines that cannot be replayed go to ``<name>.rejected``
with the reason, up to ``REJECTED_LIMIT_BYTES``; past it they are counted and logged,
not written (a file of garbage must not fill the disk a second time).

Whatever a line holds, reading it never raises anything but ``BadLine``: a replay runs
at every start, and a line that made it fail would fail every start again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from mla_switchboard.service.messages import first_line
from mla_switchboard.service.store.rows import Decision
from mla_switchboard.service.store.shapes import shape_of_json

log = logging.getLogger("switchboard.recorder")


class OldLine(NamedTuple):
    """A line spilled before shapes: the whole request as JSON text where a line now
    has its shape's id."""

    id: Any
    created_at: Any
    cluster: Any
    node: Any
    pod: Any
    backend: Any
    source: Any
    rules_revision: Any
    request_json: Any
    answer_id: Any
    answer_json: Any


ROW_FIELDS = len(Decision._fields)
OLD_ROW_FIELDS = len(OldLine._fields)
UNATTRIBUTED_ROW_FIELDS = ROW_FIELDS - 2
"""A line spilled before decisions kept who asked (no ``principal``, ``verified``): read
with no asker, as the store keeps such rows."""

MAX_LINE = 4 * 1024 * 1024
"""A real line is a few KB (bodies are at most 64 KB); anything longer is damage, and
reading it whole would cost memory."""

MAX_JSON_TEXT = 1024 * 1024
"""Most characters a line's shape or answer JSON may have: a real one is a few KB (the
request body a shape comes from is at most 64 KiB by default)."""

REJECTED_LIMIT_BYTES = 64 * 1024 * 1024
"""Most bytes ``<name>.rejected`` grows to; past it, bad lines are counted, not kept."""

_REJECTED_FLUSH_BYTES = 1024 * 1024  # bad lines held before they are written out
_UNKEPT_LOG_S = 5.0

# name: (most characters the store's column takes, None allowed); created_at and
# rules_revision are checked apart. The limits are the columns' (service/store/models.py):
# a value PostgreSQL refuses would fail its whole batch, again at every retry.
_TEXT_FIELDS: dict[str, tuple[int | None, bool]] = {
    "id": (26, False),
    "cluster": (63, False),
    "node": (253, True),
    "pod": (253, True),
    "backend": (32, False),
    "source": (32, False),
    "shape_id": (24, False),
    "answer_id": (24, False),
    "shape_json": (None, False),
    "answer_json": (None, True),
    "principal": (80, True),
}
_FIELD_AT = {name: i for i, name in enumerate(Decision._fields)}
"""Each field's place in a line (what a reason names, beside the field's name)."""
_INT32 = 2**31 - 1


class BadLine(ValueError):
    """A line that cannot be replayed; ``kind`` is the metric's label, ``reason`` the text."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


# ------------------------------------------------------------------ lines


class LineEncoder:
    """Rows as spill lines. A shape's and an answer's JSON text is shared by every
    decision of that shape or answer, so each is escaped once and reused."""

    CACHE = 4096

    def __init__(self) -> None:
        self._texts: dict[str | None, str] = {}

    def line(self, row: Decision) -> bytes:
        head = json.dumps(
            [row.id, row.created_at.isoformat(), row.cluster, row.node, row.pod, row.backend,
             row.source, row.rules_revision, row.shape_id, row.answer_id],
            separators=(",", ":"),
        )  # fmt: skip
        shape, answer = self._text(row.shape_json), self._text(row.answer_json)
        asker = json.dumps([row.principal, row.verified], separators=(",", ":"))
        return f"{head[:-1]},{shape},{answer},{asker[1:]}\n".encode()

    def _text(self, text: str | None) -> str:
        encoded = self._texts.get(text)
        if encoded is None:
            if len(self._texts) >= self.CACHE:
                self._texts.clear()
            encoded = self._texts[text] = json.dumps(text)
        return encoded


def parse_line(raw: bytes) -> Decision:
    """One spill line as a ``Decision``, checked field by field; ``BadLine`` says why not,
    and nothing else is ever raised (an error no check foresaw is a ``BadLine`` of kind
    ``unexpected``).

    Lines of the old format (the whole request as JSON text at index 8) are converted
    to the shape the store keeps."""
    try:
        return _parse(raw)
    except BadLine:
        raise
    except Exception as exc:
        raise BadLine("unexpected", f"{type(exc).__name__}: {first_line(exc)}") from None


def _parse(raw: bytes) -> Decision:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadLine("not_utf8", f"not UTF-8 (byte {exc.start} of the line)") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise BadLine("not_json", "not JSON that can be read: nested too deep") from None
    except ValueError as exc:
        raise BadLine("not_json", f"not JSON ({exc})") from None
    if not isinstance(value, list):
        raise BadLine("bad_fields", f"a JSON {type(value).__name__}, not an array")
    if len(value) == OLD_ROW_FIELDS:
        return _checked(_from_old_format(OldLine._make(value)))
    if len(value) > ROW_FIELDS:
        # a newer release's line, with fields this one does not keep: the rest stands
        value = value[:ROW_FIELDS]
    elif len(value) < ROW_FIELDS and ROW_FIELDS - len(value) <= len(Decision._field_defaults):
        # an older release's line: the fields added since take their defaults
        missing = Decision._fields[len(value) :]
        if all(name in Decision._field_defaults for name in missing):
            value = [*value, *(Decision._field_defaults[name] for name in missing)]
    if len(value) != ROW_FIELDS:
        raise BadLine(
            "bad_fields",
            f"{len(value)} fields, expected {ROW_FIELDS} (or {UNATTRIBUTED_ROW_FIELDS} or "
            f"{OLD_ROW_FIELDS}, older formats)",
        )
    return _checked(Decision._make(value))


def _from_old_format(v: OldLine) -> Decision:
    request = v.request_json
    if not isinstance(request, str):
        raise BadLine("bad_fields", "field 8 (request_json): not a string")
    if len(request) > MAX_JSON_TEXT:
        raise BadLine(
            "bad_fields", f"field 8 (request_json): {len(request)} characters, over 1 MiB"
        )
    try:
        shape = shape_of_json(request)
    except RecursionError:
        raise BadLine("bad_fields", "field 8 (request_json): JSON nested too deep") from None
    return Decision(
        v.id, v.created_at, v.cluster, v.node, v.pod, v.backend, v.source, v.rules_revision,
        shape.id, v.answer_id, shape.json, v.answer_json,
    )  # fmt: skip


def _checked(v: Decision) -> Decision:
    """``v`` as read from JSON (any types) checked field by field; ``created_at`` is
    read as a time."""
    for name, (limit, nullable) in _TEXT_FIELDS.items():
        x, i = getattr(v, name), _FIELD_AT[name]
        if x is None and nullable:
            continue
        if not isinstance(x, str):
            raise BadLine("bad_fields", f"field {i} ({name}): {type(x).__name__}, not a string")
        if limit is not None and not 0 < len(x) <= limit:
            raise BadLine("bad_fields", f"field {i} ({name}): {len(x)} characters (1-{limit})")
        if "\x00" in x:
            raise BadLine("bad_fields", f"field {i} ({name}): holds a NUL character")
    if type(v.verified) is not bool:
        i = _FIELD_AT["verified"]
        raise BadLine("bad_fields", f"field {i} (verified): {v.verified!r}, not true or false")
    revision = v.rules_revision
    if type(revision) is not int or not 0 <= revision <= _INT32:
        raise BadLine("bad_fields", f"field 7 (rules_revision): {revision!r}, not an integer")
    text: Any = v.created_at
    if not isinstance(text, str):
        raise BadLine("bad_fields", "field 1 (created_at): not a string")
    try:
        created = datetime.fromisoformat(text)
    except ValueError:
        raise BadLine("bad_fields", f"field 1 (created_at): {text[:40]!r} is not a time") from None
    if created.tzinfo is None:
        raise BadLine("bad_fields", "field 1 (created_at): no time zone")
    _json_object(v.shape_json, _FIELD_AT["shape_json"], "shape_json")
    if v.answer_json is not None:
        _json_object(v.answer_json, _FIELD_AT["answer_json"], "answer_json")
    return v._replace(created_at=created)


_checked_texts: set[str] = set()
"""Shape and answer texts already found to be JSON objects: every decision of one shape
or answer carries the same text, so each is parsed once, not once per line. Only texts
up to ``_CHECKED_TEXT_MAX`` characters are kept: a real shape or answer is a few KB, and
a hostile file of 1 MiB texts must not pin gigabytes here."""
_CHECKED_LIMIT = 4096
_CHECKED_TEXT_MAX = 64 * 1024


def _json_object(text: str, i: int, name: str) -> None:
    """The store keeps these texts as they are and every later read parses them: one
    that is not a JSON object would break the listings that show it."""
    if text in _checked_texts:
        return
    if len(text) > MAX_JSON_TEXT:
        raise BadLine("bad_fields", f"field {i} ({name}): {len(text)} characters, over 1 MiB")
    try:
        value = json.loads(text)
    except RecursionError:
        raise BadLine("bad_fields", f"field {i} ({name}): JSON nested too deep") from None
    except ValueError:
        raise BadLine("bad_fields", f"field {i} ({name}): not JSON") from None
    if not isinstance(value, dict):
        raise BadLine(
            "bad_fields", f"field {i} ({name}): a JSON {type(value).__name__}, not an object"
        )
    if len(text) > _CHECKED_TEXT_MAX:
        return
    if len(_checked_texts) >= _CHECKED_LIMIT:
        _checked_texts.clear()
    _checked_texts.add(text)


# ------------------------------------------------------------------ appends


@dataclass(frozen=True)
class Appended:
    """What an append did: the first ``count`` rows are in the file (fsynced); the rest
    are not, for the reason in ``error`` (``full``: the size limit, not an OS error)."""

    count: int
    bytes: int
    error: str | None = None
    full: bool = False


class SpillFile:
    def __init__(
        self, path: Path, limit_bytes: int, rejected_limit_bytes: int = REJECTED_LIMIT_BYTES
    ) -> None:
        self.path = path
        self.limit_bytes = limit_bytes
        self.rejected_path = path.with_name(path.name + ".rejected")
        self.rejected_limit_bytes = rejected_limit_bytes
        self._encoder = LineEncoder()
        # backlog-like files this process still writes (its journal's): not
        # a backlog, never claimed or counted
        self.not_backlog: Callable[[Path], bool] = lambda _path: False
        self._unkept_unlogged = 0
        self._unkept_logged_at = -_UNKEPT_LOG_S

    def probe(self) -> str | None:
        """None when a spill could be written now, else why not (no path in the text:
        ``/readyz`` shows it). Creates the directory, leaves no file behind."""
        if self.limit_bytes <= 0:
            return "off: SWITCHBOARD_SPILL_LIMIT_MB is 0"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC))
            else:
                probe = self.path.with_name(f".{self.path.name}.probe-{os.getpid()}")
                os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
                probe.unlink()
        except OSError as exc:
            return describe(exc)
        if self.size() >= self.limit_bytes:
            return self.full_reason()
        return None

    def full_reason(self) -> str:
        return f"full: SWITCHBOARD_SPILL_LIMIT_MB ({self.limit_bytes / 2**20:g}) reached"

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def backlog_bytes(self) -> int:
        """Bytes waiting for the store: the spill file, the files drains claimed and
        have not finished (this one's, or left by a process that died), and journals
        of processes that died."""
        total = self.size()
        for path in self._leftovers():
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

    def append(self, rows: Sequence[Decision]) -> Appended:
        """Append as many of ``rows`` as the size limit and the disk allow, in order,
        and fsync. A write the disk cut short is cut back to the last whole line, so
        the count is exact and the file never ends in half a decision."""
        try:
            fd = self._open_current()
        except OSError as exc:
            return Appended(0, 0, describe(exc))
        try:
            size = os.fstat(fd).st_size
            # a line left unfinished by a crash stays on a line of its own
            lead = b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""
            room = self.limit_bytes - size - len(lead)
            lines: list[bytes] = []
            used = 0
            for row in rows:
                line = self._encoder.line(row)
                if used + len(line) > room:
                    break
                lines.append(line)
                used += len(line)
            full = len(lines) < len(rows)
            if not lines:
                return Appended(0, 0, self.full_reason() if full else None, full)
            data = lead + b"".join(lines)
            done, error = _write_all(fd, data)
            if error is None:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    error, done = exc, 0  # what reached the disk is unknown: none of it
            if error is None:
                return Appended(len(lines), used, self.full_reason() if full else None, full)
            count, kept = _whole_lines(lines, done - len(lead))
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size + (len(lead) + kept if count else 0))
                os.fsync(fd)
            return Appended(count, kept, describe(error))
        finally:
            os.close(fd)  # releases the lock

    def _open_current(self) -> int:
        """An fd on the file that is *still* at the path, locked (a drain may have
        renamed it between our open and our lock)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if _same_file(fd, self.path):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise OSError(f"spill file kept moving: {self.path}")

    def write_rejected(self, entries: Sequence[dict[str, Any]]) -> int:
        """Set lines aside in ``<name>.rejected``, one JSON object each (the reason, the
        file and offset it came from, the line itself), as long as the file stays
        within ``rejected_limit_bytes``. Returns how many were not written (the file at
        its limit, or an error): those are logged with their count, at most every 5 s.
        A failure here is never raised: the good lines of the file matter more than a
        copy of the bad ones."""
        if not entries:
            return 0
        lines = [
            (json.dumps(e, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace")
            for e in entries
        ]
        kept = 0
        why = f"it is at its size limit ({self.rejected_limit_bytes / 2**20:g} MiB)"
        try:
            fd = os.open(
                self.rejected_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                room = self.rejected_limit_bytes - os.fstat(fd).st_size
                used = 0
                for line in lines:
                    if used + len(line) > room:
                        break
                    used += len(line)
                    kept += 1
                if kept:
                    _write_all_or_raise(fd, b"".join(lines[:kept]))
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            kept, why = 0, describe(exc)
        if kept < len(lines):
            self._note_unkept(len(lines) - kept, why)
        return len(lines) - kept

    def _note_unkept(self, n: int, why: str) -> None:
        self._unkept_unlogged += n
        now = time.monotonic()
        if now - self._unkept_logged_at < _UNKEPT_LOG_S:
            return
        log.error(
            "%d bad spill lines were counted (switchboard_decisions_rejected_total) but "
            "not written to %s: %s",
            self._unkept_unlogged,
            self.rejected_path,
            why,
        )
        self._unkept_unlogged = 0
        self._unkept_logged_at = now

    def set_aside(self, refused: Sequence[tuple[Decision, str]]) -> None:
        """Rows the store itself refused, as lines in ``<name>.rejected``."""
        self.write_rejected(
            [
                {"reason": why, "file": None, "offset": None, "line": self._encoder.line(row)
                 .decode().rstrip("\n")}
                for row, why in refused
            ]
        )  # fmt: skip

    # ------------------------------------------------------------- drains
    def has_work(self) -> bool:
        """Anything to drain: a spill file, or a drain some replica left unfinished."""
        if self.size() > 0:
            return True
        return any(self._leftovers())

    def peek(self, n: int) -> list[Decision]:
        """Up to ``n`` good rows from the files a drain would take, without taking any:
        a failing store is tried with real rows, and no file moves until it answers."""
        for path in [*self._leftovers(), self.path]:
            rows: list[Decision] = []
            try:
                with path.open("rb") as f:
                    while len(rows) < n:
                        raw = f.readline(MAX_LINE + 1)
                        if not raw.endswith(b"\n"):
                            break  # the end, or a line a drain will set aside
                        with contextlib.suppress(BadLine):
                            rows.append(parse_line(raw))
            except OSError:
                continue
            if rows:
                return rows
        return []

    def claim(self) -> Replay | None:
        """The next file to drain, locked for this replica: a drain another replica left
        (its lock free), else the spill file itself, renamed away. None when neither."""
        for leftover in self._leftovers():
            replay = Replay.take(leftover, self, wait=False)
            if replay is not None:
                return replay
        return self._claim_current()

    def backlog_files(self) -> list[Path]:
        """The files drains claimed and did not finish, and dead processes' journals."""
        return self._leftovers()

    def _leftovers(self) -> list[Path]:
        parent, name = self.path.parent, self.path.name
        found = [*parent.glob(name + ".replay-*"), *parent.glob(name + ".journal-*")]
        return sorted(p for p in found if not self.not_backlog(p))

    def _claim_current(self) -> Replay | None:
        for _ in range(10):
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # an appender finishes its batch first
                if not _same_file(fd, self.path):
                    os.close(fd)
                    continue
                mine = self.path.with_name(
                    f"{self.path.name}.replay-{os.getpid()}-{time.time_ns()}"
                )
                os.rename(self.path, mine)
            except BaseException:
                os.close(fd)
                raise
            return Replay(mine, fd, self)
        return None


class Replay:
    """One claimed file being drained, batch by batch, under its lock.

    ``read`` returns the next good rows; ``commit`` says the store took them,
    ``rewind`` that it did not (the next ``read`` starts from the last commit; a line
    already set aside is not set aside twice). ``finish`` removes the file once
    everything is stored, ``close`` leaves it for a later drain."""

    def __init__(self, path: Path, fd: int, spill: SpillFile) -> None:
        self.path = path
        self._file = os.fdopen(fd, "rb")
        self._spill = spill
        self._committed = 0
        self._seen_to = 0  # lines before this offset were already checked
        self.eof = False
        self.stored = 0
        self.rejected: Counter[str] = Counter()  # by kind, since the last take_rejected()
        self.rejected_total = 0
        self.partial = 0
        self.refused = 0  # good lines the store refused (set aside by the recorder)
        self.not_kept = 0  # rejected lines counted but not written (.rejected at its limit)
        self._bad_bytes = 0  # of the bad lines read and not yet written out

    @classmethod
    def take(cls, path: Path, spill: SpillFile, *, wait: bool) -> Replay | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            if os.fstat(fd).st_nlink == 0:  # drained and removed while we waited
                os.close(fd)
                return None
        except BlockingIOError:
            os.close(fd)
            return None  # another replica is draining it
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, spill)

    def read(self, n: int) -> list[Decision]:
        rows: list[Decision] = []
        bad: list[dict[str, Any]] = []
        f = self._file
        while len(rows) < n:
            if self._bad_bytes > _REJECTED_FLUSH_BYTES:
                self.not_kept += self._spill.write_rejected(bad)  # bounded memory
                bad, self._bad_bytes = [], 0
            start = f.tell()
            raw = f.readline(MAX_LINE + 1)
            if not raw:
                self.eof = True
                break
            fresh = start >= self._seen_to
            if not raw.endswith(b"\n"):
                if len(raw) > MAX_LINE:
                    _skip_line(f)
                    self._reject(bad, fresh, start, raw[:200], "too_long", "longer than 4 MiB")
                else:
                    self.eof = True
                    if fresh:
                        self.partial += 1
                    self._reject(
                        bad, fresh, start, raw, "partial",
                        "partial last line: a write cut short (a crash or a full disk)",
                    )  # fmt: skip
                continue
            if not raw.strip():
                continue
            try:
                rows.append(parse_line(raw))
            except BadLine as exc:
                self._reject(bad, fresh, start, raw, exc.kind, exc.reason)
        self._seen_to = max(self._seen_to, f.tell())
        if bad:
            self.not_kept += self._spill.write_rejected(bad)
        self._bad_bytes = 0
        return rows

    def _reject(
        self, bad: list[dict[str, Any]], fresh: bool, offset: int, raw: bytes, kind: str, why: str
    ) -> None:
        if not fresh:
            return
        self.rejected[kind] += 1
        self.rejected_total += 1
        self._bad_bytes += len(raw)
        bad.append(
            {
                "reason": why,
                "file": self.path.name,
                "offset": offset,
                "line": raw.decode("utf-8", "backslashreplace").rstrip("\n"),
            }
        )

    def take_rejected(self) -> Counter[str]:
        out, self.rejected = self.rejected, Counter()
        return out

    def commit(self, stored: int, refused: int = 0) -> int:
        """The store took ``stored`` of the rows read since the last commit and
        refused ``refused`` (set aside by the caller). Returns the bytes of the file
        this commit got through."""
        before, self._committed = self._committed, self._file.tell()
        self.stored += stored
        self.refused += refused
        return self._committed - before

    @property
    def committed_bytes(self) -> int:
        """Bytes of the file the store took (or that were set aside) so far."""
        return self._committed

    def rewind(self) -> None:
        self._file.seek(self._committed)
        self.eof = False

    def finish(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.close()

    def close(self) -> None:
        self._file.close()


# ------------------------------------------------------------------ helpers


def describe(exc: BaseException) -> str:
    """An OS error without the file name (``/readyz`` is open to anyone)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return type(exc).__name__


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _write_all(fd: int, data: bytes) -> tuple[int, OSError | None]:
    """Write everything or say how much got written before the error."""
    done = 0
    view = memoryview(data)
    while done < len(data):
        try:
            n = os.write(fd, view[done:])
        except OSError as exc:
            return done, exc
        if n == 0:
            return done, OSError(28, os.strerror(28))
        done += n
    return done, None


def _write_all_or_raise(fd: int, data: bytes) -> None:
    _, error = _write_all(fd, data)
    if error is not None:
        raise error


def _whole_lines(lines: Sequence[bytes], written: int) -> tuple[int, int]:
    """How many of ``lines`` fit whole in the first ``written`` bytes, and their bytes."""
    count = total = 0
    for line in lines:
        if total + len(line) > written:
            break
        total += len(line)
        count += 1
    return count, total


def _skip_line(f: Any) -> None:
    while True:
        chunk = f.readline(MAX_LINE)
        if not chunk or chunk.endswith(b"\n"):
            return
