"""Load benchmark of ``POST /v1/select`` against a bare FastAPI endpoint, same run.

Both servers run as one uvicorn process each on loopback; wrk (Debian package ``wrk``)
drives a mix of distinct pods (bench/select_mix.lua). Each round runs both servers
back to back, in alternating order, so that the shared 2-core machine's noise hits
both alike; the figures that matter are the ratios within a round (requests/s, p99,
CPU per request), reported per round and as their medians, with their spread.
Afterwards every 200 answer of the Switchboard rounds must be in the store (counted).

    python bench/select_load.py [--rounds 7] [--duration 8] [--connections 32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/select_load.py` from anywhere
    sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402

TOKEN = "bench-admin-token"


def start(cmd: list[str], env: dict[str, str], url: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(300):
        try:
            if httpx.get(url, timeout=0.5).status_code < 500:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{cmd} did not start")


def cpu_seconds(pid: int) -> float:
    """User+system CPU of a process so far (Linux /proc), to report CPU per request:
    a figure the shared machine's noise disturbs far less than requests/s."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_wrk(url: str, duration: int, connections: int) -> dict[str, float]:
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{duration}s",
            "--latency",
            "-s",
            str(ROOT / "bench" / "select_mix.lua"),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SWITCHBOARD_TOKEN": TOKEN},
    ).stdout
    m = re.search(r"RESULT (\{.*\})", out)
    assert m, out
    r = json.loads(m.group(1))
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--duration", type=int, default=8, help="seconds per round")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "select_load.json"))
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("bench: needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-"))
    db = f"sqlite:///{tmp / 'bench.db'}"
    env = {**os.environ, "SWITCHBOARD_DATABASE_URL": db, "SWITCHBOARD_ADMIN_TOKEN": TOKEN}
    sb_port, bare_port = free_port(), free_port()
    sb = start(
        [
            sys.executable,
            "-m",
            "mla_switchboard.service.cli",
            "serve",
            "--port",
            str(sb_port),
            "--log-level",
            "warning",
        ],
        env,
        f"http://127.0.0.1:{sb_port}/readyz",
    )
    bare = start(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.bare_app:app",
            "--port",
            str(bare_port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env,
        f"http://127.0.0.1:{bare_port}/docs",
    )
    rounds: dict[str, list[dict[str, float]]] = {"switchboard": [], "bare": []}
    pids = {"switchboard": sb.pid, "bare": bare.pid}
    try:
        # warm-up, not timed (its answers are still counted against the store below)
        warmup = run_wrk(f"http://127.0.0.1:{sb_port}", 2, args.connections)
        run_wrk(f"http://127.0.0.1:{bare_port}", 2, args.connections)
        per_round: list[dict[str, float]] = []
        for i in range(args.rounds):
            order = [("switchboard", sb_port), ("bare", bare_port)]
            if i % 2:
                order.reverse()  # neither always runs right after the other's load
            got: dict[str, dict[str, float]] = {}
            for name, port in order:
                cpu0 = cpu_seconds(pids[name])
                r = run_wrk(f"http://127.0.0.1:{port}", args.duration, args.connections)
                r["cpu_us_per_request"] = (cpu_seconds(pids[name]) - cpu0) / r["requests"] * 1e6
                r["load_average_1m"] = os.getloadavg()[0]
                rounds[name].append(r)
                got[name] = r
                print(
                    f"round {i + 1}/{args.rounds} {name:12s} {r['rps']:8.0f} req/s  "
                    f"p50 {r['p50_us'] / 1000:6.2f} ms  p99 {r['p99_us'] / 1000:6.2f} ms  "
                    f"cpu/req {r['cpu_us_per_request']:5.0f} us  non-2xx {r['non2xx']}  "
                    f"load {r['load_average_1m']:.1f}",
                    flush=True,
                )
            sb_r, bare_r = got["switchboard"], got["bare"]
            per_round.append(
                {
                    "ratio_rps": sb_r["rps"] / bare_r["rps"],
                    "ratio_p99": sb_r["p99_us"] / bare_r["p99_us"],
                    "ratio_cpu_per_request": bare_r["cpu_us_per_request"]
                    / sb_r["cpu_us_per_request"],
                }
            )
            print(
                f"round {i + 1}/{args.rounds} ratios: requests/s "
                f"{per_round[-1]['ratio_rps']:.2f}, p99 {per_round[-1]['ratio_p99']:.2f}x",
                flush=True,
            )
        metrics = httpx.get(f"http://127.0.0.1:{sb_port}/metrics").text
        writer_cpu_s = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("switchboard_decision_writer_cpu_seconds_total ")
        )
        answered_by_server = int(
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("switchboard_decisions_total{")
            )
        )
    finally:
        bare.terminate()
        sb.terminate()  # clean shutdown: flushes buffered decisions
        sb.wait(60)
        bare.wait(10)

    from mla_switchboard.service.store import Store
    from mla_switchboard.service.store.db import make_engine

    # wrk counts answers it read before its clock ran out; requests still in flight
    # then are answered and recorded too, so the server's own count is the reference.
    seen_by_wrk = sum(r["requests"] - r["non2xx"] for r in [warmup, *rounds["switchboard"]])
    stored = Store(make_engine(db)).decisions.count_decisions()

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[name])

    def spread(key: str) -> dict[str, float]:
        values = [r[key] for r in per_round]
        return {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "rounds_meeting_target": sum(
                (v >= 1.0) if key == "ratio_rps" else (v <= 1.5) for v in values
            ),
        }

    result = {
        "benchmark": "POST /v1/select vs bare FastAPI endpoint, same run",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores (shared)",
        "load": f"wrk -t1 -c{args.connections}, {args.duration}s rounds x {args.rounds}, "
        "10,000 distinct pods (bench/select_mix.lua)",
        "load_average_1m": {
            "min": min(r["load_average_1m"] for n in rounds for r in rounds[n]),
            "max": max(r["load_average_1m"] for n in rounds for r in rounds[n]),
        },
        "switchboard": {
            "rps": med("switchboard", "rps"),
            "p50_ms": med("switchboard", "p50_us") / 1000,
            "p99_ms": med("switchboard", "p99_us") / 1000,
            "cpu_us_per_request": med("switchboard", "cpu_us_per_request"),
            "errors": sum(r["non2xx"] + r["socket_errors"] for r in rounds["switchboard"]),
        },
        "bare": {
            "rps": med("bare", "rps"),
            "p50_ms": med("bare", "p50_us") / 1000,
            "p99_ms": med("bare", "p99_us") / 1000,
            "cpu_us_per_request": med("bare", "cpu_us_per_request"),
        },
        # ratios within each round (same minutes of the machine), then their median;
        # targets: requests/s >= 1.0, p99 <= 1.5x
        "ratio_rps": spread("ratio_rps")["median"],
        "ratio_p99": spread("ratio_p99")["median"],
        "ratio_rps_rounds": spread("ratio_rps"),
        "ratio_p99_rounds": spread("ratio_p99"),
        # the writer thread's own CPU per decision, and the rate it could sustain on
        # one core at that cost (against the answers/s the replica reached)
        "writer_cpu_us_per_decision": writer_cpu_s / max(answered_by_server, 1) * 1e6,
        "writer_rows_per_cpu_second": answered_by_server / writer_cpu_s if writer_cpu_s else None,
        "ratio_cpu_per_request": spread("ratio_cpu_per_request")["median"],
        "decisions_answered_by_server": answered_by_server,
        "decisions_seen_by_wrk": seen_by_wrk,
        "decisions_in_store": stored,
        "all_decisions_stored": stored == answered_by_server and stored >= seen_by_wrk,
        "per_round": per_round,
        "rounds": rounds,
    }
    print(
        json.dumps({k: v for k, v in result.items() if k not in ("rounds", "per_round")}, indent=2)
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not result["all_decisions_stored"]:
        print(f"LOST DECISIONS: answered {answered_by_server}, stored {stored}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
