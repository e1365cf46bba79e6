"""kill -9 of a real replica while its PostgreSQL is frozen, with the decision log on and
off (``SWITCHBOARD_JOURNAL``), and what the log costs a select; with ``--before DIR``
the same rounds also run another checkout's code (its own ``.venv``), in the same run,
on a PostgreSQL of its own (an older schema cannot share one).

Part 1, losses: rounds of ``tests/reliability/freeze_kill.py`` (load on one replica,
every PostgreSQL process SIGSTOPped, kill -9 at a random moment 0.05-0.4 s later, the
next replica replays what it left). A decision answered more than 100 ms before the
kill and not stored is lost. Log on (the default) and off (``SWITCHBOARD_JOURNAL=0``,
memory only). Then the same at full load (8 client threads back to
back) with the database up, kill -9 0.5-2 s in.

Part 2, cost: one replica with the log and one without, in alternating rounds;
threads post ``/v1/select`` for distinct pods back to back and time each answer
(client side, loopback): p50 and p99 per round.

    python bench/kill9_freeze.py [--rounds 20] [--rounds-off 10] [--cost-rounds 4] \
        [--before ../base]   # a checkout of the older code with its own .venv

Writes bench/results/kill9_freeze.json: ``now`` (this checkout) and ``before``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
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
    root: Path | None = None,
) -> dict[str, object]:
    env = {"SWITCHBOARD_JOURNAL": "1" if journal else "0"}
    kill_after = (0.05, 0.4) if freeze else (0.5, 2.0)
    with tempfile.TemporaryDirectory(prefix="sb-k9-") as tmp:
        got = freeze_kill_rounds(
            pg, Path(tmp), rounds, threads=threads, seed=seed, env=env, freeze=freeze,
            kill_after=kill_after, root=root,
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


def cost(
    pg: PrivatePostgres, rounds: int, seconds: float, threads: int, root: Path | None = None
) -> dict[str, object]:
    per: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="sb-cost-") as tmp:
        for i in range(rounds):
            order = ["on", "off"] if i % 2 == 0 else ["off", "on"]
            for mode in order:
                env = {
                    "SWITCHBOARD_JOURNAL": "1" if mode == "on" else "0",
                    "SWITCHBOARD_SPILL_PATH": str(Path(tmp) / f"{mode}{i}" / "spill.jsonl"),
                }
                service = ServiceProcess(pg.url, env=env, root=root).start(Path(tmp))
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


PARTS = {  # name: (rounds argument, log on, seed, database frozen, client threads)
    "log_on": ("rounds", True, 7, True, 4),
    "log_off": ("rounds_off", False, 8, True, 4),
    "full_load_log_on": ("rounds_load", True, 9, False, 8),
    "full_load_log_off": ("rounds_load", False, 10, False, 8),
}


def measure(args: argparse.Namespace, roots: dict[str, Path | None]) -> dict[str, object]:
    """Every part for each version of the code, each on a PostgreSQL of its own. The
    versions take turns, a few rounds at a time, so a busy spell of the machine (its one
    disk is shared) falls on both rather than on whichever ran then."""
    pgs = {name: PrivatePostgres() for name in roots}
    out: dict[str, dict[str, object]] = {
        name: {"code": str(root or ROOT), "commit": _commit(root or ROOT)}
        for name, root in roots.items()
    }
    try:
        for pg in pgs.values():
            pg.init().start()
        for part, (arg, on, seed, frozen, threads) in PARTS.items():
            total = getattr(args, arg)
            for start in range(0, total, CHUNK):
                n = min(CHUNK, total - start)
                for name, root in roots.items():
                    got = losses(
                        pgs[name], n, on, seed=seed * 1000 + start, freeze=frozen,
                        threads=threads, root=root,
                    )  # fmt: skip
                    _merge(out[name], part, got)
        for name, root in roots.items():
            out[name]["select_cost"] = cost(
                pgs[name], args.cost_rounds, args.cost_seconds, threads=4, root=root
            )
    finally:
        for pg in pgs.values():
            pg.cleanup()
    return out


CHUNK = 3  # rounds of one version before the other takes its turn


def _merge(version: dict[str, object], part: str, got: dict[str, object]) -> None:
    """Add one chunk's rounds to a part's totals."""
    have = version.get(part)
    if not isinstance(have, dict):
        version[part] = got
        return
    have["per_round"] = [*have["per_round"], *got["per_round"]]
    rounds = have["per_round"]
    have["rounds"] = len(rounds)
    have["rounds_losing_answers_older_than_100ms"] = sum(
        1 for r in rounds if r["lost_before_grace"]
    )
    have["lost_older_than_100ms_total"] = sum(r["lost_before_grace"] for r in rounds)
    have["oldest_lost_ms_max"] = max(r["oldest_lost_ms"] for r in rounds)
    have["answered_total"] = sum(r["answered"] for r in rounds)
    have["lost_total"] = sum(r["lost"] for r in rounds)


def _commit(root: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip()


def _brief(version: dict[str, object]) -> dict[str, object]:
    keep = ("rounds", "rounds_losing_answers_older_than_100ms", "oldest_lost_ms_max")
    out: dict[str, object] = {"commit": version["commit"]}
    for key, part in version.items():
        if isinstance(part, dict) and "per_round" in part and "rounds" in part:
            out[key] = {k: part[k] for k in keep}
    out["select_cost"] = version["select_cost"]["median"]  # type: ignore[index]
    return out


def main() -> None:
    _exit_on_sigterm()
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--rounds-off", type=int, default=10)
    ap.add_argument("--rounds-load", type=int, default=6)
    ap.add_argument("--cost-rounds", type=int, default=4)
    ap.add_argument("--cost-seconds", type=float, default=4.0)
    ap.add_argument("--before", type=Path, help="a checkout of older code with its .venv")
    ap.add_argument("--out", default=str(ROOT / "bench/results/kill9_freeze.json"))
    args = ap.parse_args()
    result: dict[str, object] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({os.cpu_count()} cores, shared), load average "
        f"{os.getloadavg()[0]:.1f} at start",
        "grace_ms": 100,
    }
    roots: dict[str, Path | None] = {"now": None}
    if args.before:
        roots["before"] = args.before.resolve()
    result.update(measure(args, roots))
    result["load_average_at_end"] = round(os.getloadavg()[0], 1)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    brief = {k: _brief(v) for k, v in result.items() if k in ("now", "before")}
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
