"""kill -9 of a real replica while its PostgreSQL is frozen, with and without the decision
log (``SWITCHBOARD_JOURNAL``), and what the log costs a select. (The results file's
``journal_*`` keys name the setting; bench/results/kill9_freeze.json is the journal's
last run, before the decision log replaced it.)

Part 1, losses: rounds of ``tests/reliability/freeze_kill.py`` (load on one replica,
every PostgreSQL process SIGSTOPped, kill -9 at a random moment 0.05-0.4 s later, the
next replica replays what it left). A decision answered more than 100 ms before the
kill and not stored is lost. Log on (the default) and off (``SWITCHBOARD_JOURNAL=0``,
memory only). Then the same at full load (8 client threads back to
back) with the database up, kill -9 0.5-2 s in.

Part 2, cost: one replica with the journal and one without, in alternating rounds;
threads post ``/v1/select`` for distinct pods back to back and time each answer
(client side, loopback): p50 and p99 per round.

    python bench/kill9_freeze.py [--rounds 20] [--rounds-off 10] [--cost-rounds 4]

Writes bench/results/kill9_freeze.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conftest import ADMIN, ServiceProcess  # noqa: E402
from tests.reliability.conftest import PrivatePostgres, select_body  # noqa: E402
from tests.reliability.freeze_kill import freeze_kill_rounds  # noqa: E402


def losses(
    pg: PrivatePostgres,
    rounds: int,
    journal: bool,
    seed: int,
    *,
    freeze: bool = True,
    threads: int = 4,
) -> dict[str, object]:
    env = {"SWITCHBOARD_JOURNAL": "1" if journal else "0"}
    kill_after = (0.05, 0.4) if freeze else (0.5, 2.0)
    with tempfile.TemporaryDirectory(prefix="sb-k9-") as tmp:
        got = freeze_kill_rounds(
            pg, Path(tmp), rounds, threads=threads, seed=seed, env=env, freeze=freeze,
            kill_after=kill_after,
        )  # fmt: skip
    bad = [r for r in got if r.lost_before_grace]
    return {
        "journal": journal,
        "database": "frozen (SIGSTOP), kill 0.05-0.4 s after" if freeze else "up",
        "client_threads": threads,
        "rounds": len(got),
        "rounds_losing_answers_older_than_100ms": len(bad),
        "lost_older_than_100ms_total": sum(r.lost_before_grace for r in got),
        "oldest_lost_ms_max": max(r.oldest_lost_ms for r in got),
        "answered_total": sum(r.answered for r in got),
        "lost_total": sum(r.lost for r in got),
        "per_round": [r.as_dict() for r in got],
    }


def timed_selects(url: str, seconds: float, threads: int, tag: str) -> list[float]:
    out: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run(t: int) -> None:
        mine: list[float] = []
        headers = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(headers=headers, timeout=10) as client:
            i = 0
            while time.monotonic() < stop:
                body = select_body("cost", f"{tag}-{t}-{i}")
                i += 1
                t0 = time.perf_counter()
                r = client.post(url + "/v1/select", json=body)
                mine.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
        with lock:
            out.extend(mine)

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return out


def cost(pg: PrivatePostgres, rounds: int, seconds: float, threads: int) -> dict[str, object]:
    per: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="sb-cost-") as tmp:
        for i in range(rounds):
            order = ["on", "off"] if i % 2 == 0 else ["off", "on"]
            for mode in order:
                env = {
                    "SWITCHBOARD_JOURNAL": "1" if mode == "on" else "0",
                    "SWITCHBOARD_SPILL_PATH": str(Path(tmp) / f"{mode}{i}" / "spill.jsonl"),
                }
                service = ServiceProcess(pg.url, env=env).start(Path(tmp))
                try:
                    timed_selects(service.url, 1.0, threads, f"warm{mode}{i}")
                    lat = sorted(timed_selects(service.url, seconds, threads, f"{mode}{i}"))
                finally:
                    service.stop()
                per[mode].append(
                    {
                        "selects": len(lat),
                        "per_s": round(len(lat) / seconds),
                        "p50_ms": round(lat[len(lat) // 2] * 1000, 3),
                        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 3),
                    }
                )
    summary = {
        mode: {
            key: statistics.median(r[key] for r in runs) for key in ("per_s", "p50_ms", "p99_ms")
        }
        for mode, runs in per.items()
    }
    return {"threads": threads, "seconds": seconds, "median": summary, "per_round": per}


def _exit_on_sigterm() -> None:
    """A SIGTERM unwinds (the private PostgreSQL and replicas are cleaned up)."""

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def main() -> None:
    _exit_on_sigterm()
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--rounds-off", type=int, default=10)
    ap.add_argument("--rounds-load", type=int, default=6)
    ap.add_argument("--cost-rounds", type=int, default=4)
    ap.add_argument("--cost-seconds", type=float, default=4.0)
    ap.add_argument("--out", default=str(ROOT / "bench/results/kill9_freeze.json"))
    args = ap.parse_args()
    pg = PrivatePostgres()
    try:
        pg.init().start()
        result = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} ({os.cpu_count()} cores, shared), load average "
            f"{os.getloadavg()[0]:.1f} at start",
            "grace_ms": 100,
            "journal_on": losses(pg, args.rounds, True, seed=7),
            "journal_off": losses(pg, args.rounds_off, False, seed=8),
            "full_load_journal_on": losses(
                pg, args.rounds_load, True, seed=9, freeze=False, threads=8
            ),
            "full_load_journal_off": losses(
                pg, args.rounds_load, False, seed=10, freeze=False, threads=8
            ),
            "select_cost": cost(pg, args.cost_rounds, args.cost_seconds, threads=4),
        }
    finally:
        pg.cleanup()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "select_cost"}, indent=1)[:3000])
    print(json.dumps(result["select_cost"]["median"], indent=1))


if __name__ == "__main__":
    main()
