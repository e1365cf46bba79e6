"""Faults, with real parts: a replica killed with SIGKILL in the middle of a boot
burst, PostgreSQL restarted under load, an SQLite file locked or read-only.

Each test prints what it saw (counts, how long the outage lasted); the figures are
summarised in docs/reliability.md. Every test is bounded in time (well under 30 s on
the 2-core CI machine) and asserts behaviour, not speed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from mla_switchboard.agent import pod as agent_pod
from mla_switchboard.agent.api import SelectionResult, select_backend
from mla_switchboard.agent.probe import DeviceProbe

from tests.conftest import ADMIN, ROOT, ServiceProcess, free_port, start_together
from tests.reliability.conftest import (
    SERVICE_SOURCES,
    PrivatePostgres,
    SelectLoad,
    metric,
    readyz,
    sqlite_integrity,
    stored_decision_ids,
    terminate_all,
    wait_until,
    without_dac_override,
)

# --------------------------------------------------------------- kill -9 a replica


@pytest.mark.postgres
def test_kill9_replica_mid_boot_burst(
    pg_url_factory: Callable[[], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents configured with two URLs (``SWITCHBOARD_URL=http://a,http://b``) boot
    while replica A is killed with SIGKILL: every agent still gets the service's
    decision (none falls back to its cache or its local engine).

    The order of events is driven, not assumed: when the ``kill_after``-th answer
    arrives, no new boot starts until A is dead (the boots already in flight go on and
    meet the kill mid-request); then the rest start. An earlier version killed on the
    fly and looked at answers that came 0.5 s after the kill, which was an empty list
    whenever the machine finished every boot within 0.5 s (1 run in 3).
    """
    url = pg_url_factory()
    a, b = start_together(tmp_path, ServiceProcess(url), ServiceProcess(url))
    monkeypatch.setenv("SWITCHBOARD_URL", f"{a.url},{b.url}")
    monkeypatch.setenv("SWITCHBOARD_TOKEN", ADMIN)
    # the probe sees an H200: real pods, recorded (a pretended GPU is a dry run)
    monkeypatch.setattr(
        agent_pod, "probe_device", lambda: DeviceProbe("NVIDIA H200", (9, 0), "nvml")
    )
    total, kill_after, workers = 360, 120, 8
    # (answered at, started after the kill, result)
    results: list[tuple[float, bool, SelectionResult]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    next_pod = iter(range(total))
    killed_at: list[float] = []
    a_dead = threading.Event()

    def boot(i: int) -> SelectionResult:
        return select_backend(
            cluster="kill9",
            node=f"node-{i % 40}",
            pod=f"pod-{i}",
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            num_heads=128,
            use_cache=False,  # a failure must show as local-fallback, not hide in a cache
            build=False,
            deadline=15,  # generous: a slow answer on a busy 2-core machine is no failure
        )

    def worker() -> None:
        while True:
            with lock:
                hold = len(results) >= kill_after and not a_dead.is_set()
            if hold:  # the kill is due: start nothing new until A is dead
                a_dead.wait(60)
            with lock:
                i = next(next_pod, None)
                after = a_dead.is_set()
            if i is None:
                return
            try:
                result = boot(i)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                continue
            with lock:
                results.append((time.monotonic(), after, result))
                if len(results) == kill_after:
                    a.proc.kill()  # type: ignore[union-attr]  # SIGKILL, mid-burst
                    a.proc.wait(10)  # type: ignore[union-attr]
                    killed_at.append(time.monotonic())
                    a_dead.set()

    try:
        threads = [threading.Thread(target=worker) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        assert a.proc is not None and a.proc.wait(10) == -9
        terminate_all([b])  # clean: B flushes what it answered
    finally:
        a.stop()
        b.stop()

    assert len(results) == total
    bad = [r for _, _, r in results if r.source not in SERVICE_SOURCES or r.decision_id is None]
    assert not bad, [(r.source, r.notes) for r in bad[:5]]
    assert {str(r.backend) for _, _, r in results} == {"FLASH_ATTN"}
    by_a = {r.decision_id for _, _, r in results if r.service_url == a.url}
    by_b = {r.decision_id for _, _, r in results if r.service_url == b.url}
    assert len(by_a) + len(by_b) == total and by_a and by_b
    # every boot that started after the kill (at least total - kill_after - workers of
    # them, by construction) was answered by B
    after_kill = [r for _, after, r in results if after]
    assert len(after_kill) >= total - kill_after - workers
    assert all(r.service_url == b.url for r in after_kill)

    stored = stored_decision_ids(url, "kill9")
    lost_a = by_a - stored
    window = max((killed_at[0] - t for t, _, r in results if r.decision_id in lost_a), default=0)
    print(
        f"\nkill -9 mid-burst: {total} agent boots, {len(by_a)} answered by A before its "
        f"SIGKILL, {len(by_b)} by B; failed decisions: 0; local fallbacks: 0; "
        f"A's decisions lost with it (not yet flushed): {len(lost_a)}, all answered in "
        f"the last {window * 1000:.0f} ms before the kill; B's lost: {len(by_b - stored)}"
    )
    assert by_b <= stored  # B shut down cleanly: all its decisions are in the store


# --------------------------------------------------- PostgreSQL restart under load


class ReadyWatcher:
    """Polls /readyz every 50 ms in the background; records every status and body."""

    def __init__(self, service: ServiceProcess) -> None:
        self.service = service
        self.statuses: list[int] = []
        self.degraded_seen = False
        self.max_buffered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReadyWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.05):
                try:
                    r = client.get(self.service.url + "/readyz")
                except httpx.HTTPError as exc:
                    self.statuses.append(-1)
                    print(f"readyz: {exc!r}")
                    continue
                self.statuses.append(r.status_code)
                body = r.json()
                self.degraded_seen |= body["store"] == "degraded"
                self.max_buffered = max(self.max_buffered, body["decisions_buffered"])


@pytest.mark.postgres
def test_postgres_restart_under_load(tmp_path: Path) -> None:
    pg = PrivatePostgres()
    try:
        pg.init()
        pg.start()
        service = ServiceProcess(pg.url).start(tmp_path)
        try:
            answers = _restart_under_load(pg, service)
        finally:
            service.stop()
        stored = stored_decision_ids(pg.url, "pgrestart")
        print(f"after SIGTERM: {len(stored)} decisions in the store, {len(answers)} answers")
        assert stored == set(answers)
    finally:
        pg.cleanup()


def _restart_under_load(pg: PrivatePostgres, service: ServiceProcess) -> list[str]:
    """Load, stop the database, check the degraded behaviour, start it, check the
    recovery; the decision ids answered."""
    with service.client() as admin:
        admin.timeout = httpx.Timeout(30)  # a refused admin write first waits for a flush
        assert admin.put("/v1/overrides/pgrestart-a", json={"deny": ["CUDNN"], "note": "before"})
        load = SelectLoad([service.url], cluster="pgrestart", threads=2, pause_s=0.005)
        with ReadyWatcher(service) as watcher:
            load.start()
            load.wait_for(100)
            pg.stop("fast")
            down_at, before = time.monotonic(), len(load.answers)

            # readiness holds, the store is reported degraded, in the body and in metrics
            wait_until(lambda: readyz(service)[1]["store"] == "degraded", 10, what="degraded")
            status, body = readyz(service)
            assert status == 200 and body["status"] == "ready" and body["store_error"]
            assert metric(service, "switchboard_store_degraded") == 1
            # admin writes: 503, saying why, and (checked after recovery) nothing changed
            t0 = time.monotonic()
            r = admin.put("/v1/overrides/pgrestart-b", json={"deny": ["CUDNN"], "note": "lost"})
            write_s = time.monotonic() - t0
            assert r.status_code == 503, r.text
            assert "store unavailable" in r.json()["detail"]["message"]
            assert r.headers.get("Retry-After")
            r = admin.delete("/v1/overrides/pgrestart-a")
            assert r.status_code == 503, r.text
            # reads served from memory still work
            assert admin.get("/v1/overrides/pgrestart-a").status_code == 200
            wait_until(lambda: readyz(service)[1]["decisions_buffered"] > 0, 5, what="buffered")
            load.wait_for(len(load.answers) + 50)
            assert not load.failures, load.failures[:5]

            pg.start()
            up_at, during = time.monotonic(), len(load.answers) - before
            wait_until(
                lambda: readyz(service)[1]["store"] == "ok", 15, interval=0.1, what="store ok"
            )
            recovered_s = time.monotonic() - up_at
            load.wait_for(len(load.answers) + 50)
            load.stop()
        wait_until(lambda: readyz(service)[1]["decisions_buffered"] == 0, 10, what="drained")
        assert metric(service, "switchboard_store_degraded") == 0
        assert metric(service, "switchboard_decisions_dropped_total") == 0

        assert not load.failures, load.failures[:5]
        assert set(watcher.statuses) == {200}, set(watcher.statuses)
        assert watcher.degraded_seen
        # the refused writes changed nothing
        assert admin.get("/v1/overrides/pgrestart-b").status_code == 404
        assert admin.get("/v1/overrides/pgrestart-a").json()["note"] == "before"
        audit = admin.get("/v1/audit", params={"limit": 100}).json()["items"]
        assert [e["target"] for e in audit if e["target"].startswith("pgrestart")] == [
            "pgrestart-a"
        ]
    print(
        f"\nPostgreSQL restart under load: {len(load.answers)} /v1/select answers, all 200 "
        f"({during} while the database was down for {up_at - down_at:.1f}s); "
        f"readyz 200 throughout ({len(watcher.statuses)} probes), store degraded seen; "
        f"up to {watcher.max_buffered} decisions buffered; admin write answered 503 in "
        f"{write_s:.1f}s; store ok {recovered_s:.1f}s after the database returned"
    )
    return load.answers


# ------------------------------------------------------------------ SQLite faults


def serve_once(database_url: str, prefix: list[str] | None = None, timeout: float = 40) -> Any:
    """Run ``switchboard serve`` expecting it to refuse to start; its CompletedProcess."""
    env = {**os.environ, "SWITCHBOARD_DATABASE_URL": database_url, "SWITCHBOARD_ADMIN_TOKEN": ADMIN}
    cmd = [sys.executable, "-m", "mla_switchboard.service.cli", "serve", "--port", str(free_port())]
    return subprocess.run(
        [*(prefix or []), *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def sqlite_counts(path: Path) -> tuple[int, list[str]]:
    with sqlite3.connect(path) as conn:
        decisions = conn.execute("SELECT count(*) FROM decisions").fetchone()[0]
        overrides = [r[0] for r in conn.execute("SELECT cluster FROM overrides ORDER BY 1")]
    return decisions, overrides


def test_sqlite_locked(tmp_path: Path) -> None:
    """Another connection holds the write lock (``BEGIN EXCLUSIVE``): selects answer
    from memory, admin writes get 503 naming the lock, a second ``serve`` refuses to
    start; once the lock goes, buffered decisions are written and nothing is lost."""
    db = tmp_path / "sb.db"
    url = f"sqlite:///{db}?timeout=2"  # how long a write waits for the lock
    service = ServiceProcess(url).start(tmp_path)
    try:
        with service.client() as admin:
            admin.timeout = httpx.Timeout(30)  # the refused write waits for the lock first
            r = admin.put("/v1/overrides/locked-a", json={"force": "FLASH_ATTN", "note": "x"})
            assert r.status_code == 200
            load = SelectLoad([service.url], cluster="locked", threads=1, pause_s=0.005)
            load.start()
            load.wait_for(50)
            admin.get("/v1/selections", params={"limit": 1})  # flushes
            locker = sqlite3.connect(db, isolation_level=None)
            locker.execute("BEGIN EXCLUSIVE")
            try:
                before = len(load.answers)
                load.wait_for(before + 50)
                r = admin.put("/v1/overrides/locked-b", json={"force": "CUDNN", "note": "lost"})
                assert r.status_code == 503, r.text
                message = r.json()["detail"]["message"]
                assert "database is locked" in message, message
                wait_until(lambda: readyz(service)[1]["store"] == "degraded", 10, what="degr.")
                assert readyz(service)[0] == 200
                assert metric(service, "switchboard_store_degraded") == 1
                second = serve_once(url)
                assert second.returncode != 0
                assert "is locked by another process" in second.stderr, second.stderr
                during = len(load.answers) - before
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            load.wait_for(len(load.answers) + 20)
            load.stop()

            def recovered() -> bool:
                body = readyz(service)[1]
                return body["store"] == "ok" and body["decisions_buffered"] == 0

            wait_until(recovered, 15, interval=0.1, what="store ok, buffer drained")
            assert not load.failures, load.failures[:5]
            assert admin.get("/v1/overrides/locked-b").status_code == 404
    finally:
        service.stop()
    decisions, overrides = sqlite_counts(db)
    print(
        f"\nSQLite locked: {len(load.answers)} selects answered, {during} while locked; "
        f"admin write 503 ({message!r}); second serve exit {second.returncode}: "
        f"{second.stderr.strip().splitlines()[-1]!r}; {decisions} decisions stored"
    )
    assert decisions == len(load.answers)
    assert stored_decision_ids(url, "locked") == set(load.answers)
    assert overrides == ["locked-a"]
    assert sqlite_integrity(db) == "ok"


def test_sqlite_read_only(tmp_path: Path) -> None:
    """``switchboard serve`` on a read-only database (file 0444, directory 0555), or
    a new one in a read-only directory, exits non-zero at once, saying so; the data
    written before is intact."""
    prefix = without_dac_override()
    home = tmp_path / "ro"
    home.mkdir()
    db = home / "sb.db"
    url = f"sqlite:///{db}"
    service = ServiceProcess(url).start(tmp_path)
    with service.client() as admin:
        assert admin.put("/v1/overrides/ro", json={"deny": ["CUDNN"], "note": "x"})
        for i in range(20):
            body = {
                "cluster": "ro",
                "pod": f"p{i}",
                "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
                "dtype": "bf16",
            }
            assert admin.post("/v1/select", json=body).status_code == 200
    service.stop()
    assert sqlite_counts(db) == (20, ["ro"])

    files = [p for p in home.iterdir() if p.is_file()]
    try:
        for p in files:
            p.chmod(0o444)
        home.chmod(0o555)
        existing = serve_once(url, prefix)
        fresh = serve_once(f"sqlite:///{home / 'new.db'}", prefix)
    finally:
        home.chmod(0o755)
        for p in files:
            # SQLite removes the -wal and -shm files when the last connection closes
            with contextlib.suppress(FileNotFoundError):
                p.chmod(0o644)
    print(
        f"\nSQLite read-only: serve exit {existing.returncode}: "
        f"{existing.stderr.strip().splitlines()[-1]!r}\n"
        f"new database in a read-only directory: exit {fresh.returncode}: "
        f"{fresh.stderr.strip().splitlines()[-1]!r}"
    )
    assert existing.returncode != 0
    assert "is read-only" in existing.stderr, existing.stderr
    assert "Traceback" not in existing.stderr
    assert fresh.returncode != 0
    assert "cannot open SQLite database" in fresh.stderr, fresh.stderr
    assert not (home / "new.db").exists()
    assert sqlite_integrity(db) == "ok"
    assert sqlite_counts(db) == (20, ["ro"])
