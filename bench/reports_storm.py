"""Reports at boot-storm speed: pods that each select, then report their benchmarks,
while 50 rollouts are active elsewhere in the fleet; two checkouts side by side.

Run through ``python bench/boot_storm.py --reports`` (or this file directly). For each
checkout (``--before``: the code measured against, with its own ``.venv``; ``--after``:
this one), alternating which goes first each round, on a fresh PostgreSQL schema in
the benchmark's own database:

1. ``--rollouts`` staged overrides with active rollouts: most on other clusters, a
   tenth on the reporting clusters but for another model (in scope, not in situation);
2. phase ``select_then_report``: each pod calls ``POST /v1/select`` and at once
   ``POST /v1/measurements`` on the same connection (the report waits for its own
   decision to be stored), ``--concurrency`` pods at a time;
3. phase ``reports``: each pod reports once more (its decision long stored): the
   report path alone.

Figures per phase: reports/s (wall), report p50/p99, the service's CPU seconds per
report (``/proc/PID/stat``), and the guard notes written and deleted
(``pg_stat_user_tables`` of ``guard_pending``). Writes ``bench/results/reports_storm.json``.

    python bench/boot_storm.py --reports --before /work/base-reports [--pods 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.boot_storm import TOKEN, cpu_seconds, fleet, machine, read_response  # noqa: E402
from bench.scale_support import pg_schema, serve_until_ready  # noqa: E402

PG_DSN = os.environ.get(
    "SWITCHBOARD_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/bench_reports"
)
MACHINE_NOTE = "2 shared cores, no GPU"


def raw_post(path: str, body: dict[str, Any], host: str) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def report_of(pod: dict[str, Any], n: int) -> dict[str, Any]:
    """A benchmark report of ``pod``'s own situation (one backend, one shape)."""
    return {
        "report_id": f"r{n}-{secrets.token_hex(6)}",
        "cluster": pod["cluster"],
        "pod": pod["pod"],
        "node": pod["node"],
        "device": pod["device"],
        "model": pod["model"],
        "dtype": pod["dtype"],
        "packages": pod["packages"],
        "results": [
            {
                "backend": "FLASH_ATTN",
                "shape": {"seqlens": [4096], "num_heads": pod["model"]["num_heads"]},
                "median_ms": 1.5,
                "tflops": 90.0 + (n % 7),
                "correct": True,
            }
        ],
    }


@dataclass
class Phase:
    reports: list[float] = field(default_factory=list)
    selects: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    not_counted: int = 0


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes, float]:
    t0 = time.perf_counter()
    writer.write(request)
    status, body, _ = await read_response(reader)
    return status, body, time.perf_counter() - t0


async def _client(port: int, work: list[list[bytes]], out: Phase) -> None:
    """One keep-alive connection: each item is [select?, report] of one pod, in order."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while work:
            item = work.pop()
            for request in item:
                status, body, took = await _exchange(reader, writer, request)
                is_report = request.startswith(b"POST /v1/measurements")
                (out.reports if is_report else out.selects).append(took)
                if status not in (200, 201):
                    out.errors.append(f"HTTP {status}: {body[:200]!r}")
                elif is_report and not json.loads(body).get("counted"):
                    out.not_counted += 1
    finally:
        writer.close()


async def _phase(port: int, work: list[list[bytes]], concurrency: int) -> tuple[Phase, float]:
    out = Phase()
    work = list(reversed(work))
    t0 = time.perf_counter()
    await asyncio.gather(*(_client(port, work, out) for _ in range(concurrency)))
    return out, time.perf_counter() - t0


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 2) if s else 0.0


def _note_writes(schema: str) -> tuple[int, int]:
    """Rows inserted into and deleted from ``guard_pending`` so far (PostgreSQL's own
    per-table counters, read after the service stopped so its last ones are in)."""
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT n_tup_ins, n_tup_del FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname = 'guard_pending'",
            (schema,),
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _db_backends(conn: Any = None) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving the benchmark's database now."""
    import psycopg

    dbname = PG_DSN.rsplit("/", 1)[1].split("?", 1)[0]
    own = conn or psycopg.connect(PG_DSN, autocommit=True)
    try:
        pids = [
            int(r[0])
            for r in own.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            )
        ]
    finally:
        if conn is None:
            own.close()
    out = {}
    for pid in pids:
        try:
            out[pid] = cpu_seconds(pid)
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
    return out


class DatabaseCpu:
    """The CPU the PostgreSQL backends serving the benchmark's database spend during a
    phase: every backend's CPU is read every 0.1 s, so one that a pool closes
    mid-phase (an overflow connection) is counted up to its last reading, not lost
    (the figure is still a floor by at most 0.1 s of such a backend's work)."""

    def __init__(self) -> None:
        import threading

        self._before = _db_backends()
        self._last = dict(self._before)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        import psycopg

        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            while not self._stop.wait(0.1):
                self._last.update(_db_backends(conn))

    def seconds(self) -> float:
        self._stop.set()
        self._thread.join(10)
        self._last.update(_db_backends())
        return sum(cpu - self._before.get(pid, 0.0) for pid, cpu in self._last.items())


def _start(tree: Path, url: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = {
        **os.environ,
        "SWITCHBOARD_DATABASE_URL": url,
        "SWITCHBOARD_ADMIN_TOKEN": TOKEN,
        "SWITCHBOARD_SPILL_PATH": str(log.parent / f"spill-{secrets.token_hex(4)}"),
    }
    env.pop("PYTHONPATH", None)
    return serve_until_ready(tree / ".venv" / "bin" / "python", tree, env, log)


def _rollouts(port: int, clusters: list[str], n: int) -> None:
    """``n`` active rollouts: nine in ten on clusters no pod reports from, the rest on
    the reporting clusters for a model none of their pods runs."""
    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as c:
        for i in range(n):
            own = i % 10 == 9
            cluster = clusters[i % len(clusters)] if own else f"canary-{i:03d}"
            body: dict[str, Any] = {
                "force": "FLASHINFER",
                "note": f"bench rollout {i}",
                "rollout": {"percent": 20, "max_failures": 3},
            }
            if own:
                body["model"] = "acme/not-deployed-*"
            r = c.put(f"/v1/overrides/{cluster}", json=body)
            if r.status_code not in (200, 201):
                raise RuntimeError(f"rollout {i}: HTTP {r.status_code} {r.text[:300]}")


def _phase_figures(out: Phase, wall: float, cpu: float) -> dict[str, Any]:
    n = len(out.reports)
    return {
        "reports": n,
        "wall_s": round(wall, 3),
        "reports_per_s": round(n / wall, 1) if wall else 0.0,
        "report_p50_ms": _pct(out.reports, 0.5),
        "report_p99_ms": _pct(out.reports, 0.99),
        "report_mean_ms": round(statistics.fmean(out.reports) * 1000, 2) if n else 0.0,
        "select_p50_ms": _pct(out.selects, 0.5),
        "service_cpu_s": round(cpu, 3),
        "service_cpu_ms_per_report": round(cpu / n * 1000, 3) if n else 0.0,
        "errors": len(out.errors),
        "error_samples": out.errors[:3],
        "not_counted": out.not_counted,
    }


def run_tree(
    label: str, tree: Path, pods: list[dict[str, Any]], rollouts: int, concurrency: int
) -> dict[str, Any]:
    schema = pg_schema(PG_DSN, "sb_reports")
    base = PG_DSN.split("://", 1)[1]
    joiner = "&" if "?" in base else "?"
    url = f"postgresql+psycopg://{base}{joiner}options=-csearch_path%3D{schema}"
    logs = Path(tempfile.mkdtemp(prefix="sb-reports-"))
    print(f"\n{label} ({tree}) on schema {schema}", flush=True)
    proc, port = _start(tree, url, logs / "service.log")
    result: dict[str, Any] = {"tree": label}
    try:
        clusters = sorted({p["cluster"] for p in pods})
        _rollouts(port, clusters, rollouts)
        host = f"127.0.0.1:{port}"
        first = [
            [raw_post("/v1/select", p, host), raw_post("/v1/measurements", report_of(p, 1), host)]
            for p in pods
        ]
        again = [[raw_post("/v1/measurements", report_of(p, 2), host)] for p in pods]
        for name, work in (("select_then_report", first), ("reports", again)):
            cpu0, db0 = cpu_seconds(proc.pid), DatabaseCpu()
            out, wall = asyncio.run(_phase(port, work, concurrency))
            figures = _phase_figures(out, wall, cpu_seconds(proc.pid) - cpu0)
            db = db0.seconds()
            figures["database_cpu_ms_per_report"] = round(db / max(len(out.reports), 1) * 1e3, 3)
            result[name] = figures
            print(
                f"  {name}: {figures['reports_per_s']:.0f} reports/s, p50 "
                f"{figures['report_p50_ms']:.1f} ms, p99 {figures['report_p99_ms']:.1f} ms, "
                f"CPU {figures['service_cpu_ms_per_report']:.2f} ms/report (database "
                f"{figures['database_cpu_ms_per_report']:.2f}), errors "
                f"{figures['errors']}, not counted {figures['not_counted']}",
                flush=True,
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        time.sleep(0.6)  # the statistics collector's last flush
        inserted, deleted = _note_writes(schema)
        pg_schema(PG_DSN, "sb_reports", drop=schema)
    result["guard_notes_inserted"] = inserted
    result["guard_notes_deleted"] = deleted
    print(f"  guard notes: {inserted} inserted, {deleted} deleted", flush=True)
    return result


def _median(runs: list[dict[str, Any]], phase: str, key: str) -> float:
    return round(statistics.median(r[phase][key] for r in runs), 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=16, help="clients in flight")
    ap.add_argument("--rollouts", type=int, default=50, help="active rollouts")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", type=Path, help="the checkout measured against (its .venv)")
    ap.add_argument("--before-label", default="before (9fed401)")
    ap.add_argument("--after", type=Path, default=ROOT)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "reports_storm.json"))
    args = ap.parse_args(argv)

    pods = [p for p in fleet(args.pods * 2) if p["device"]["capability"] and p["packages"]]
    pods = pods[: args.pods]
    trees = [("after", args.after.resolve())]
    if args.before is not None:
        trees.insert(0, (args.before_label, args.before.resolve()))
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in trees}
    for i in range(args.rounds):
        order = trees if i % 2 == 0 else list(reversed(trees))
        for label, tree in order:
            runs[label].append(run_tree(label, tree, pods, args.rollouts, args.concurrency))
    summary = {
        label: {
            phase: {
                k: _median(rs, phase, k)
                for k in (
                    "reports_per_s",
                    "report_p50_ms",
                    "report_p99_ms",
                    "service_cpu_ms_per_report",
                    "database_cpu_ms_per_report",
                )
            }
            | {"errors": sum(r[phase]["errors"] for r in rs)}
            for phase in ("select_then_report", "reports")
        }
        | {"guard_notes_inserted": [r["guard_notes_inserted"] for r in rs]}
        for label, rs in runs.items()
    }
    for figures in summary.values():
        for phase in ("select_then_report", "reports"):
            f = figures[phase]
            cpu_ms = f["service_cpu_ms_per_report"] + f["database_cpu_ms_per_report"]
            # what 2 cores given to the service and its database alone would take, by
            # CPU: this machine's cores are shared, so its wall figure is a floor
            f["reports_per_s_2_cores_by_cpu"] = round(2000 / cpu_ms, 1) if cpu_ms else None
    result = {
        "benchmark": "reports at boot-storm speed: select then report, then report again, "
        f"{args.rollouts} rollouts active, PostgreSQL store",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{MACHINE_NOTE}; {machine()}",
        "store": f"PostgreSQL {PG_DSN.rsplit('@', 1)[-1]} (same machine), a fresh schema per run",
        "load": f"{len(pods)} pods over 20 clusters, {args.concurrency} clients, HTTP/1.1 "
        "keep-alive; one service process",
        "rounds": args.rounds,
        "median": summary,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")
    ok = all(r[p]["errors"] == 0 for rs in runs.values() for r in rs for p in ("reports",))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
