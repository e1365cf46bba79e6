"""Helpers for the replica and fault tests: replicas, load, a private PostgreSQL.

Everything here drives real parts: ``switchboard serve`` processes, a real
PostgreSQL (the shared server through a schema of the test's own, or a private
cluster that a test may stop and start), real HTTP.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.recorder import DecisionRecorder
from mla_switchboard.service.store.rows import Decision
from sqlalchemy.exc import DataError

from tests.conftest import ADMIN, InProcessService, ServiceProcess, free_port

SERVICE_SOURCES = {"priority", "requested", "fallback", "override", "measured"}
"""What ``source`` says when the service decided (``cache``/``local-fallback`` are the agent's)."""


def select_body(cluster: str, pod: str, *, cap: list[int] | None = None) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "node": f"node-{hash(pod) % 50}",
        "pod": pod,
        "device": {"name": "NVIDIA H200", "capability": cap or [9, 0]},
        "model": {
            "name": "deepseek-ai/DeepSeek-R1",
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "num_heads": 128,
        },
        "dtype": "bfloat16",
        "packages": None,
    }


def wait_until(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.02, what: str = ""
) -> float:
    """Poll until ``predicate()`` is truthy; the seconds it took. Fails after ``timeout``."""
    start = time.monotonic()
    last: Any = None
    while True:
        try:
            last = predicate()
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            pytest.fail(f"not true after {timeout}s: {what or predicate} (last: {last!r})")
        time.sleep(interval)


def metric(service: ServiceProcess | InProcessService, name: str) -> float:
    """The sum of a metric's samples in /metrics (0 when absent)."""
    with service.client() as c:
        text = c.get("/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def readyz(service: ServiceProcess) -> tuple[int, dict[str, Any]]:
    r = httpx.get(service.url + "/readyz", timeout=5)
    return r.status_code, r.json()


def stored_decision_ids(database_url: str, cluster_prefix: str) -> set[str]:
    """Decision ids in the store for clusters starting with ``cluster_prefix``."""
    from mla_switchboard.service.store.db import make_engine

    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT id FROM decisions WHERE cluster LIKE "
                + ("?" if engine.dialect.paramstyle == "qmark" else "%s"),
                (cluster_prefix + "%",),
            )
            return {r[0] for r in rows}
    finally:
        engine.dispose()


def terminate_all(services: list[ServiceProcess], timeout: float = 30) -> None:
    """SIGTERM every replica at once (a rollout), then wait for each to exit."""
    for s in services:
        if s.proc is not None and s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
    for s in services:
        if s.proc is not None:
            s.proc.wait(timeout)


class SelectLoad:
    """Threads posting ``/v1/select`` for distinct pods to a set of URLs (in turn)
    until stopped; every answer is counted by its decision id.

    ``answers`` holds the decision ids of 200 answers; ``failures`` any other status
    or transport error, with the time it happened (relative to ``start``).
    """

    def __init__(
        self,
        urls: list[str],
        *,
        cluster: str,
        threads: int = 2,
        pause_s: float = 0.002,
        token: str = ADMIN,
    ) -> None:
        self.urls = urls
        self.cluster = cluster
        self.threads = threads
        self.pause_s = pause_s
        self.token = token
        self.answers: list[str] = []
        self.times: list[float] = []  # when each answer arrived (time.monotonic())
        self.by_url: dict[str, int] = {u: 0 for u in urls}
        self.failures: list[tuple[float, str, str]] = []
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._started = 0.0

    def start(self) -> SelectLoad:
        self._started = time.monotonic()
        for t in range(self.threads):
            w = threading.Thread(target=self._run, args=(t,), daemon=True)
            w.start()
            self._workers.append(w)
        return self

    def stop(self) -> SelectLoad:
        self._stop.set()
        for w in self._workers:
            w.join(30)
        return self

    def wait_for(self, n: int, timeout: float = 20) -> None:
        wait_until(lambda: len(self.answers) >= n, timeout, what=f"{n} answers")

    def answered_since(self, t: float) -> int:
        """Answers that arrived after ``t`` (``time.monotonic()``)."""
        with self._lock:
            return sum(1 for at in self.times if at > t)

    def wait_for_since(self, t: float, n: int, timeout: float = 30) -> float:
        """Until more than ``n`` answers arrived after ``t``: a fault lasts as long as
        its evidence needs (fewer answers a second on a busy machine: a longer fault),
        not a fixed time. The seconds it took."""
        return wait_until(
            lambda: self.answered_since(t) > n, timeout, interval=0.01, what=f"{n} answers since"
        )

    def _run(self, t: int) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(headers=headers, timeout=10) as client:
            i = 0
            while not self._stop.is_set():
                url = self.urls[(t + i) % len(self.urls)]
                body = select_body(self.cluster, f"pod-{t}-{i}")
                i += 1
                try:
                    r = client.post(url + "/v1/select", json=body)
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.failures.append((self._elapsed(), url, type(exc).__name__))
                    time.sleep(0.05)
                    continue
                with self._lock:
                    if r.status_code == 200:
                        self.answers.append(r.json()["decision_id"])
                        self.times.append(time.monotonic())
                        self.by_url[url] += 1
                    else:
                        self.failures.append((self._elapsed(), url, f"HTTP {r.status_code}"))
                if self.pause_s:
                    time.sleep(self.pause_s)

    def _elapsed(self) -> float:
        return round(time.monotonic() - self._started, 3)


# ------------------------------------------------ the recorder, in process


class FlakyStore:
    """A store whose writes fail until ``up`` is set; records what it was given.

    ``refuse``: decision ids whose batch the store refuses for its content (as
    PostgreSQL does a value too long for its column), whatever else is in it.
    ``answering``: cleared, every write waits until it is set again (a database that
    hangs rather than refuses), then goes through."""

    def __init__(self) -> None:
        self.up = False
        self.rows: dict[str, Decision] = {}
        self.calls = 0
        self.refuse: set[str] = set()
        self.delay_s = 0.0  # per batch: a slow store
        self.answering = threading.Event()
        self.answering.set()
        self._lock = threading.Lock()

    def record_rows(self, rows: list[Decision]) -> None:
        self.answering.wait()
        time.sleep(self.delay_s)
        with self._lock:
            self.calls += 1
            if not self.up:
                raise ConnectionError("connection refused")
            if any(r.id in self.refuse for r in rows):
                raise DataError("INSERT", {}, ValueError("value too long for type varchar(26)"))
            for r in rows:
                self.rows.setdefault(r.id, r)


def row(i: int, *, shape: str = "shape1", pod: str | None = None) -> Decision:
    """A decision as ``/v1/select`` hands it over."""
    return Decision(
        f"id{i:05d}", datetime.now(UTC), "c", "n", pod or f"p{i}", "FLASH_ATTN", "priority",
        1, shape, "a1", '{"device":{}}', '{"backend":"FLASH_ATTN"}',
    )  # fmt: skip


def recorder(
    store: FlakyStore, log_dir: Path | None, metrics: Metrics, **options: Any
) -> DecisionRecorder:
    """A recorder on ``store`` with its log in ``log_dir`` (None: no log)."""
    settings: dict[str, Any] = {
        "interval_s": 0.01,
        "batch": 100,
        "limit": 10_000,
        "log_dir": log_dir,
        "shutdown_flush_s": 0.3,
        **options,
    }
    return DecisionRecorder(store, metrics, **settings)  # type: ignore[arg-type]


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels or None) or 0.0


# ------------------------------------------------------------------- replicas


@pytest.fixture
def start_replicas(tmp_path: Path) -> Iterator[Callable[..., list[ServiceProcess]]]:
    """Start n ``switchboard serve`` processes on one database; stopped afterwards."""
    started: list[ServiceProcess] = []

    def start(database_url: str, n: int = 2, **env: str) -> list[ServiceProcess]:
        services = [ServiceProcess(database_url, env=env) for _ in range(n)]
        for s in services:
            started.append(s)
            s.start(tmp_path)
        return services

    yield start
    for s in started:
        s.stop(signal.SIGKILL) if s.proc and s.proc.poll() is None else None


# ------------------------------------------------------ privileges and skipping


def skip_or_fail(reason: str) -> None:
    """Skip with a printed reason; under CI (``CI`` set) the missing part is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run this test)")
    pytest.skip(reason)


def without_dac_override() -> list[str]:
    """A command prefix under which file permissions apply, also to root.

    The suite often runs as root, and root ignores ``chmod 0444``; dropping the
    DAC-override capabilities from the bounding set makes the kernel check the mode
    bits for the child, as it would for the service's own user in production.
    """
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    if shutil.which("setpriv") is None:
        skip_or_fail("running as root and setpriv (util-linux) is missing: chmod cannot bind")
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        skip_or_fail(f"running as root and cannot drop CAP_DAC_OVERRIDE: {probe.stderr.strip()}")
    return prefix


def sqlite_integrity(path: Path) -> str:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


# ---------------------------------------------------------- private PostgreSQL


def _pg_bindir() -> Path | None:
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    return versions[0].parent if versions else None


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc: no pgrep needed)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                out.append(int(stat.parent.name))
    return out


class PrivatePostgres:
    """A throwaway PostgreSQL cluster of this test's own, which it may stop and start.

    The shared server at :5432 is never touched (other sessions may be using it).
    As root, initdb and the server run as the ``postgres`` OS user.
    """

    def __init__(self) -> None:
        bindir = _pg_bindir()
        if bindir is None:
            skip_or_fail("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
        assert bindir is not None
        self.bindir = bindir
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                import pwd

                pwd.getpwnam("postgres")
            except KeyError:
                skip_or_fail("running as root and there is no postgres OS user for initdb")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.dir = Path(tempfile.mkdtemp(prefix="sb-pg-"))
        if self.as_user:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._frozen: list[int] = []  # processes freeze() stopped

    def _run(self, *args: str, timeout: float = 60) -> None:
        cmd = [*self.as_user, str(self.bindir / args[0]), *args[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}\n{self.log()}")

    def init(self) -> PrivatePostgres:
        """A new cluster: a copy of one ``initdb`` made once per test process. initdb
        costs seconds where a copy of its 40 MB costs a fraction of one, and the many
        fault tests each need a cluster of their own; each copy is one (its own
        directory, port and processes)."""
        template = _initdb_once(self)
        cmd = [*self.as_user, "cp", "-a", str(template), str(self.data)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
        return self

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-t", "30",
            "-o", options, "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def freeze(self) -> None:
        """SIGSTOP the postmaster, then every process it started: a database that hangs
        rather than refuses. The kernel still accepts connections and acknowledges what
        clients send, so no client-side TCP timeout fires; nothing answers."""
        master = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(master, signal.SIGSTOP)  # first: it forks no new backend meanwhile
        self._frozen = [master, *_children(master)]
        for pid in self._frozen[1:]:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in reversed(self._frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._frozen = []

    def log(self) -> str:
        path = self.dir / "log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def cleanup(self) -> None:
        self.thaw()
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


_TEMPLATE: list[Path] = []  # this process's initdb output, once made


def _initdb_once(pg: PrivatePostgres) -> Path:
    """The data directory of one ``initdb`` (as ``pg`` runs it), made on first use and
    removed when the test process ends."""
    if not _TEMPLATE:
        holder = Path(tempfile.mkdtemp(prefix="sb-pg-template-"))
        atexit.register(shutil.rmtree, holder, True)
        if pg.as_user:
            shutil.chown(holder, "postgres", "postgres")
        data = holder / "data"
        pg._run("initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
        _TEMPLATE.append(data)
    return _TEMPLATE[0]


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PrivatePostgres]:
    """A throwaway server for one test module whose tests never stop it (each makes a
    database of its own); tests that stop, freeze or kill it start their own."""
    pg = PrivatePostgres()
    try:
        pg.init().start()
        yield pg
    finally:
        pg.cleanup()


@pytest.fixture
def pg() -> Iterator[PrivatePostgres]:
    """A throwaway PostgreSQL of the test's own, removed after it (fault tests stop,
    freeze and restart it)."""
    server = PrivatePostgres()
    try:
        server.init().start()
        yield server
    finally:
        server.cleanup()
