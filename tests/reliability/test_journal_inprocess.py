"""The journal and the spill backlog in process: what a crash leaves, what a restart
replays, and what ``/metrics`` and ``/readyz`` say while a backlog drains."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.reads.health import Health
from mla_switchboard.service.store.spill import LineEncoder

from tests.reliability.conftest import FlakyStore, counter, recorder, row, wait_until


def good_lines(n: int, start: int = 0) -> list[bytes]:
    enc = LineEncoder()
    return [enc.line(row(i)) for i in range(start, start + n)]


def test_every_decision_is_in_the_journal_within_ms_and_removed_once_stored(
    tmp_path: Path,
) -> None:
    spill = tmp_path / "spill.jsonl"
    store, metrics = FlakyStore(), Metrics()
    store.answering.clear()  # a database that hangs: the writer's batch stays in flight
    store.up = True
    rec = recorder(store, spill, metrics, interval_s=0.05)
    rec.start()
    for i in range(200):
        assert rec.submit(row(i))
    wait_until(lambda: counter(metrics, "switchboard_journal_lines_total") == 200, 2, what="j")
    journals = list(tmp_path.glob("spill.jsonl.journal-*"))
    assert journals and sum(len(p.read_bytes().splitlines()) for p in journals) == 200
    assert rec.spill_bytes() == 0  # this process's own journal is no backlog
    store.answering.set()
    assert rec.flush(5)
    wait_until(lambda: not list(tmp_path.glob("spill.jsonl.journal-*")), 3, what="retired")
    rec.stop()
    assert len(store.rows) == 200


CRASH = textwrap.dedent(
    """
    import sys, time, threading
    from pathlib import Path
    from mla_switchboard.service.metrics import Metrics
    from tests.reliability.conftest import FlakyStore, recorder, row
    store = FlakyStore(); store.up = True; store.answering.clear()  # hangs
    rec = recorder(store, Path(sys.argv[1]), Metrics(), interval_s=0.05)
    rec.start()
    for i in range(500):
        rec.submit(row(i))
    time.sleep(0.1)  # well past the journal's few ms
    print("answered", flush=True)
    time.sleep(60)
    """
)


def test_a_kill9_while_the_store_hangs_leaves_a_journal_the_next_start_replays(
    tmp_path: Path,
) -> None:
    spill = tmp_path / "spill.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH, str(spill)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"answered"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert not spill.exists()  # the writer had spilled nothing yet (stall bound 200 ms)
    store, metrics = FlakyStore(), Metrics()
    store.up = True
    rec = recorder(store, spill, metrics)
    assert rec.spill_bytes() > 0  # a dead process's journal is a backlog
    assert rec.replay_spill() == 500
    assert sorted(store.rows) == [f"id{i:05d}" for i in range(500)]
    assert rec.spill_bytes() == 0 and not list(tmp_path.glob("spill.jsonl.*"))


def test_a_drain_and_one_cut_short_by_a_stop_are_shown_until_the_last_line(
    tmp_path: Path,
) -> None:
    """Before: while a drain ran (the file renamed away) and after a SIGTERM mid-drain,
    ``switchboard_spill_file_bytes`` was 0 and ``/readyz`` said ok."""
    spill = tmp_path / "spill.jsonl"
    spill.write_bytes(b"".join(good_lines(3000)))
    size = spill.stat().st_size
    store, metrics = FlakyStore(), Metrics()
    store.up, store.delay_s = True, 0.02
    rec = recorder(store, spill, metrics)
    assert rec.spill_bytes() == size
    m = re.fullmatch(r"draining ([\d,]+) spilled decisions, 0% done", rec.spill_backlog() or "")
    assert m and abs(int(m[1].replace(",", "")) - 3000) <= 60  # an estimate from the bytes
    first = rec.replay_spill(budget_s=0.1)  # cut short: the file is claimed, renamed away
    assert 0 < first < 3000 and not spill.exists()
    assert rec.spill_bytes() == size  # on disk until the drain's last line
    text = rec.spill_backlog()
    assert text is not None and text.startswith("draining ")
    pending = counter(metrics, "switchboard_spill_lines_pending")
    assert abs(pending - (3000 - first)) <= 30, (pending, first)
    assert counter(metrics, "switchboard_spill_lines_drained_total") == first
    rec.stop()  # a SIGTERM mid-drain: the rest stays on disk ...

    metrics2 = Metrics()
    again = recorder(store, spill, metrics2)  # ... and the next start shows it
    assert again.spill_bytes() == size
    quiet = SimpleNamespace(degraded=None, snapshot=None, checked_at=None)
    health = Health(quiet, again, quiet, metrics2, None)  # type: ignore[arg-type]
    health.refresh_gauges()
    assert counter(metrics2, "switchboard_spill_file_bytes") == size
    body = health.readiness()[1]
    assert body["spill"] == "degraded" and body["spill_error"] == body["spill_backlog"]
    assert body["spill_backlog"].startswith("draining ")
    store.delay_s = 0
    again.replay_spill()
    assert again.spill_bytes() == 0 and again.spill_backlog() is None
    assert len(store.rows) == 3000
