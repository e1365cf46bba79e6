"""What the scale axes share beyond bench/scale.py: stage lines, databases that can be
filled once and cloned, a migration to a given revision, a process's and its threads'
CPU from /proc, and operations timed without stopping at the first refusal.

The axes (bench/scale_overrides.py, bench/scale_evidence.py) run against whichever
checkout's product the running interpreter imports: ``BEFORE/.venv/bin/python
AFTER/bench/scale.py --axis evidence`` measures the BEFORE code with the AFTER bench
(bench/side_by_side.py does exactly that), so nothing here may import product code the
checkout before this bench lacks.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

T0 = time.monotonic()


def stage(message: str) -> None:
    """One progress line: seconds since the bench started, then what it does now."""
    print(f"[{time.monotonic() - T0:8.1f} s] {message}", flush=True)


def product_root() -> Path:
    """The checkout whose product this interpreter imports (its ``.venv`` installed it
    in editable mode): where the service is started from, whatever bench file runs."""
    import mla_switchboard.service as service

    return Path(service.__file__).resolve().parent.parent


def product_commit() -> str:
    """The product checkout's short commit, with ``+dirty`` when it has changes."""
    root = product_root()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{head}+dirty" if head and dirty else head


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


# ------------------------------------------------------------------ CPU from /proc

CLK_TCK = os.sysconf("SC_CLK_TCK")


def measure_in(tree: str | Path, script: str | Path, url: str, *args: str) -> dict[str, Any]:
    """``script``'s ``measure`` mode run by the checkout at ``tree`` (its own ``.venv``,
    its own code) against the service at ``url``, and the JSON it wrote: how the
    side-by-side benchmarks measure each checkout with the same client."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [
            str(Path(tree) / ".venv" / "bin" / "python"),
            str(Path(script).resolve()),
            *("measure", "--url", url, "--out", f.name),
            *args,
        ]
        subprocess.run(cmd, cwd=tree, check=True)
        return json.loads(Path(f.name).read_text())


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (every thread), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


@dataclass(frozen=True)
class ThreadCpu:
    nice: int
    cpu_s: float


def threads_cpu(pid: int) -> dict[int, ThreadCpu]:
    """Each thread's nice value and CPU seconds: from schedstat (nanoseconds on a CPU)
    where the kernel keeps it, else stat's clock ticks. A thread that ended between the
    listing and the read is left out."""
    out: dict[int, ThreadCpu] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            nice = int(fields[16])  # field 19
            try:
                cpu = int((task / "schedstat").read_text().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, ValueError, IndexError):
            continue
        out[int(task.name)] = ThreadCpu(nice, cpu)
    return out


@dataclass
class Burst:
    """One stretch of CPU on one thread: when it began and ended (monotonic, from the
    samples around it), and how much CPU it used."""

    tid: int
    nice: int
    start: float
    end: float
    cpu_s: float

    def shown(self, origin: float) -> dict[str, Any]:
        return {
            "tid": self.tid,
            "nice": self.nice,
            "start_s": round(self.start - origin, 3),
            "wall_s": round(self.end - self.start, 3),
            "cpu_s": round(self.cpu_s, 3),
        }


@dataclass
class ThreadSampler:
    """Samples every thread's CPU of process ``pid`` every ``every_s`` in a thread of
    its own, so that background work (an evidence reload, a prune) can be found
    afterwards as bursts of CPU on one thread, and timed: no metric says when a
    reload or a prune begins or ends, but the thread doing it burns CPU while it runs
    and none afterwards."""

    pid: int
    every_s: float = 0.05
    samples: list[tuple[float, dict[int, ThreadCpu]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ThreadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sample = (time.monotonic(), threads_cpu(self.pid))
            except OSError:
                return  # the process ended
            with self._lock:
                self.samples.append(sample)
            self._stop.wait(self.every_s)

    def snapshot(self) -> list[tuple[float, dict[int, ThreadCpu]]]:
        with self._lock:
            return list(self.samples)

    def grew(self, tid: int, since: float) -> float:
        """CPU seconds thread ``tid`` used from ``since`` to the last sample."""
        samples = self.snapshot()
        first = next((s for at, s in samples if at >= since), None)
        if first is None or tid not in samples[-1][1]:
            return 0.0
        begin = first.get(tid, ThreadCpu(0, 0.0)).cpu_s
        return samples[-1][1][tid].cpu_s - begin

    def bursts(
        self,
        since: float,
        until: float | None = None,
        *,
        background_only: bool = True,
        min_cpu_s: float = 0.005,
        gap_s: float = 0.5,
    ) -> list[Burst]:
        """Stretches of CPU per thread between ``since`` and ``until``: consecutive
        samples in which the thread used CPU, joined across pauses shorter than
        ``gap_s``, those of at least ``min_cpu_s``. ``background_only``: threads whose
        nice value is above the main thread's (the service lowers every background
        thread, service/priority.py), so the event loop answering selects is not one."""
        samples = [s for s in self.snapshot() if s[0] >= since and (until is None or s[0] <= until)]
        if len(samples) < 2:
            return []
        base_nice = samples[0][1].get(self.pid, ThreadCpu(0, 0.0)).nice
        found: list[Burst] = []
        open_: dict[int, Burst] = {}
        for (t_prev, prev), (t_now, now) in itertools.pairwise(samples):
            for tid, cur in now.items():
                if tid == self.pid or (background_only and cur.nice <= base_nice):
                    continue
                used = cur.cpu_s - prev.get(tid, ThreadCpu(cur.nice, cur.cpu_s)).cpu_s
                burst = open_.get(tid)
                if used > 0.0005:
                    if burst is not None and t_prev - burst.end <= gap_s:
                        burst.end, burst.cpu_s = t_now, burst.cpu_s + used
                    else:
                        if burst is not None:
                            found.append(burst)
                        open_[tid] = Burst(tid, cur.nice, t_prev, t_now, used)
        found.extend(open_.values())
        return sorted((b for b in found if b.cpu_s >= min_cpu_s), key=lambda b: b.start)


def wait_for_burst_end(
    sampler: ThreadSampler,
    since: float,
    *,
    quiet_s: float = 2.0,
    quiet_cpu_s: float = 0.002,
    started_cpu_s: float = 0.001,
    first_within_s: float = 30.0,
    timeout_s: float = 1800.0,
    progress: Callable[[float, float], None] | None = None,
) -> Burst | None:
    """The burst of background CPU that began after ``since`` (a reload asked for at
    ``since``), once it ended: the background thread that used the most CPU since
    then has used less than ``quiet_cpu_s`` in the last ``quiet_s`` (an idle
    service's background threads use about 0.1 ms a second). None when no background
    thread used ``started_cpu_s`` within ``first_within_s`` (nothing started) or when
    it is still busy after ``timeout_s``."""
    deadline = since + timeout_s
    last_note = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = time.monotonic()
        samples = sampler.snapshot()
        if len(samples) < 2 or samples[-1][0] - since < quiet_s:
            continue
        start = next((s for at, s in samples if at >= since), None)
        if start is None:
            continue
        base_nice = samples[-1][1].get(sampler.pid, ThreadCpu(0, 0.0)).nice
        used = {
            tid: c.cpu_s - start.get(tid, ThreadCpu(c.nice, 0.0)).cpu_s
            for tid, c in samples[-1][1].items()
            if tid != sampler.pid and c.nice > base_nice
        }
        tid = max(used, key=lambda t: used[t]) if used else None
        if tid is None or used[tid] < started_cpu_s:
            if now - since > first_within_s:
                return None
            continue
        if sampler.grew(tid, now - quiet_s) < quiet_cpu_s:
            bursts = [b for b in sampler.bursts(since, min_cpu_s=0.0) if b.tid == tid]
            if not bursts:
                return None
            # from its first stretch to its last: its waits for the store are part of it
            return Burst(
                tid, bursts[0].nice, bursts[0].start, bursts[-1].end, sum(b.cpu_s for b in bursts)
            )
        if progress is not None and now - last_note > 10:
            last_note = now
            progress(now - since, used[tid])
    return None


# ------------------------------------------------------------------ databases


def migrate_to(engine: Any, revision: str) -> None:
    """Bring the schema to ``revision`` (not head) with the product's own migrations:
    what a bulk fill writes into is the schema as that revision made it, and the
    product's later migrations (which may derive tables from those rows) then run as
    they would on an upgraded store."""
    from alembic import command
    from alembic.config import Config
    from mla_switchboard.service.store.db import MIGRATIONS

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def serve_until_ready(
    python: Path | str, cwd: Path, env: dict[str, str], log: Path, what: str = "service"
) -> tuple[subprocess.Popen[bytes], int]:
    """``switchboard serve`` with ``python`` in ``cwd`` (a checkout: the service is
    its code), on a free port, its output appended to ``log``; returned once
    ``/readyz`` answers 200 (at most 60 s, else it is killed and this raises with the
    log's tail)."""
    from bench.common import free_port, spill_path_in

    port = free_port()
    if "SWITCHBOARD_SPILL_PATH" not in env and "SWITCHBOARD_DATABASE_URL" in env:
        env = {
            **env,
            "SWITCHBOARD_SPILL_PATH": spill_path_in(log.parent, env["SWITCHBOARD_DATABASE_URL"]),
        }
    cmd = [str(python), "-m", "mla_switchboard.service.cli", "serve", "--port", str(port)]
    with log.open("ab") as f:
        proc = subprocess.Popen(
            [*cmd, "--log-level", "warning"], cwd=cwd, env=env, stdout=f, stderr=f
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} not ready in 60 s:\n{log.read_text()[-2000:]}")


def pg_schema(dsn: str, prefix: str, drop: str | None = None) -> str:
    """A new schema named ``prefix`` plus random hex on the server ``dsn``; with
    ``drop``, that schema dropped instead (and its name returned)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        if drop is not None:
            conn.execute(f'DROP SCHEMA IF EXISTS "{drop}" CASCADE')
            return drop
        name = f"{prefix}_{secrets.token_hex(4)}"
        conn.execute(f'CREATE SCHEMA "{name}"')
    return name


def pg_url(dsn: str, database: str) -> str:
    """``dsn`` (postgresql://...) pointed at ``database``, for SQLAlchemy and psycopg."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(scheme="postgresql+psycopg", path=f"/{database}"))


def plain_pg(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as libpq reads it (psycopg.connect)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme="postgresql"))


@dataclass
class Databases:
    """Fresh databases for a run, each filled once and, where a run must start from
    the same filled state again (``--keep-fill``), cloned from it: a PostgreSQL
    ``CREATE DATABASE ... TEMPLATE`` (file copy), or a copy of the SQLite file.

    ``kind`` is "postgresql" or "sqlite"; ``pg_dsn`` the server's DSN (its database is
    only used to create and drop the others)."""

    kind: str
    pg_dsn: str
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "sb-scale-fills")
    created: list[str] = field(default_factory=list)
    templates: set[str] = field(default_factory=set)  # filled once, cloned for runs

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.pg_dsn, autocommit=True)

    def exists(self, name: str) -> bool:
        if self.kind == "sqlite":
            return (self.workdir / f"{name}.db").exists()
        with self._admin() as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            return found.fetchone() is not None

    def url(self, name: str) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.workdir / f'{name}.db'}"
        return pg_url(self.pg_dsn, name)

    def create(self, name: str) -> str:
        """An empty database called ``name`` (an old one of that name is dropped)."""
        self.drop(name)
        if self.kind == "postgresql":
            with self._admin() as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return self.url(name)

    def clone(self, template: str, name: str | None = None) -> str:
        """A copy of ``template`` (which nothing may be connected to)."""
        name = name or f"{template[:40]}_c{secrets.token_hex(3)}"
        self.drop(name)
        if self.kind == "sqlite":
            src = self.workdir / f"{template}.db"
            for suffix in ("", "-wal", "-shm"):
                if Path(f"{src}{suffix}").exists():
                    shutil.copyfile(f"{src}{suffix}", self.workdir / f"{name}.db{suffix}")
        else:
            with self._admin() as conn:
                version = conn.info.server_version
                strategy = " STRATEGY FILE_COPY" if version >= 150000 else ""
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"{strategy}')
        self.created.append(name)
        return self.url(name)

    def drop(self, name: str) -> None:
        if self.kind == "sqlite":
            for suffix in ("", "-wal", "-shm", "-spill.jsonl"):
                Path(f"{self.workdir / name}.db{suffix}").unlink(missing_ok=True)
            return
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def size_mb(self, name: str) -> float | None:
        if self.kind == "sqlite":
            total = sum(p.stat().st_size for p in self.workdir.glob(f"{name}.db*") if p.is_file())
            return round(total / 1e6, 1)
        with self._admin() as conn:
            row = conn.execute("SELECT pg_database_size(%s)", (name,)).fetchone()
            return None if row is None else round(row[0] / 1e6, 1)

    def cleanup(self, keep: frozenset[str] = frozenset()) -> None:
        """Drop every database made here except ``keep``."""
        for name in self.created:
            if name not in keep:
                self.drop(name)
        self.created = [n for n in self.created if n in keep]

    def __post_init__(self) -> None:
        if self.kind == "sqlite":
            self.workdir.mkdir(parents=True, exist_ok=True)


def bump_evidence_epoch(url: str) -> None:
    """Move the store's ``evidence_epoch``: what makes a replica rebuild every evidence
    index from the store (the signal a replica of an older release still sends when
    an admin clears failures). The only way to ask a running service for a full reload
    from outside it."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE meta SET value = value + 1 WHERE key = 'evidence_epoch'"))
    finally:
        engine.dispose()


# ------------------------------------------------------------------ timed calls


@dataclass
class Outcome:
    """One timed call: seconds, and what went wrong (an HTTP status and its first
    words), if anything did."""

    seconds: float
    error: str | None = None


def attempt(call: Callable[[], object]) -> Outcome:
    """``call`` timed; a refusal (RuntimeError from bench.scale.ok, an HTTP error) is
    recorded with the time it took instead of ending the run: a 503 after the read
    budget is a figure too."""
    t0 = time.perf_counter()
    try:
        call()
    except (RuntimeError, httpx.HTTPError) as exc:
        return Outcome(time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"[:200])
    return Outcome(time.perf_counter() - t0)


def metric_lines(client: httpx.Client, prefixes: tuple[str, ...]) -> dict[str, float]:
    """The service's /metrics samples whose names start with one of ``prefixes``."""
    out: dict[str, float] = {}
    try:
        text = client.get("/metrics").text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        if line.startswith(prefixes):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


def metric_diff(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The samples that changed between two ``metric_lines`` readings."""
    return {
        k: round(v - before.get(k, 0.0), 6) for k, v in after.items() if v != before.get(k, 0.0)
    }


@contextmanager
def elapsed() -> Iterator[Callable[[], float]]:
    t0 = time.monotonic()
    yield lambda: time.monotonic() - t0


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` ("" where there is none): what a
    result names its machine by, since the shared VMs differ by 2-3x."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
