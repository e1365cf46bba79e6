"""The test harness's own promises: whatever a fixture starts it stops, also when the
start fails, and every process start is counted when asked."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.conftest import STARTS_LOG, InProcessService, ServiceProcess, start_together

# A "service" that never becomes ready: the prefix runs instead of the real command.
NEVER_READY = ["sh", "-c", "exec sleep 60", "sh"]
EXITS_AT_ONCE = ["sh", "-c", "exit 3", "sh"]


@pytest.fixture(autouse=True)
def _stand_ins_are_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's count of service processes is of real ones: not these shell stand-ins."""
    monkeypatch.delenv(STARTS_LOG, raising=False)


def test_a_start_that_times_out_kills_its_process(tmp_path: Path) -> None:
    service = ServiceProcess("sqlite:///unused.db", prefix=NEVER_READY)
    with pytest.raises(RuntimeError, match="not ready"):
        service.start(tmp_path, timeout=0.3)
    assert service.proc is not None
    assert service.proc.poll() == -signal.SIGKILL


def test_a_process_that_exits_says_so(tmp_path: Path) -> None:
    service = ServiceProcess("sqlite:///unused.db", prefix=EXITS_AT_ONCE)
    with pytest.raises(RuntimeError, match="exited early"):
        service.start(tmp_path, timeout=30)
    assert service.proc is not None and service.proc.returncode == 3


def test_replicas_started_together_are_all_stopped_when_one_fails(tmp_path: Path) -> None:
    a = ServiceProcess("sqlite:///unused.db", prefix=EXITS_AT_ONCE)
    b = ServiceProcess("sqlite:///unused.db", prefix=NEVER_READY)
    with pytest.raises(RuntimeError, match="exited early"):
        start_together(tmp_path, a, b)
    assert a.proc is not None and a.proc.poll() is not None
    assert b.proc is not None and b.proc.poll() is not None


def test_the_factorys_failed_start_leaves_no_process(
    service_factory: type[ServiceProcess], tmp_path: Path
) -> None:
    service = service_factory("sqlite:///unused.db", prefix=NEVER_READY)
    with pytest.raises(RuntimeError):
        service.start(tmp_path, 0.3)
    assert service.proc is not None and service.proc.poll() is not None


def test_each_spawn_is_counted_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "starts.log"
    monkeypatch.setenv(STARTS_LOG, str(log))
    for _ in range(2):
        ServiceProcess("sqlite:///unused.db", prefix=EXITS_AT_ONCE).spawn(tmp_path).proc.wait()  # type: ignore[union-attr]
    assert len(log.read_text().splitlines()) == 2


def test_an_inprocess_app_reads_env_like_the_process_and_stops(sqlite_url: str) -> None:
    service = InProcessService(sqlite_url, env={"SWITCHBOARD_METRICS_REQUIRE_TOKEN": "true"})
    with service:
        assert service.runtime.settings.metrics_require_token is True
        with service.client(None) as anonymous:
            assert anonymous.get("/metrics").status_code == 401
        with service.client() as admin:
            assert admin.get("/readyz").status_code == 200
    assert service._test_client is None
