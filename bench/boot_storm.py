"""Boot storm: 10,000 distinct pods each call ``POST /v1/select`` once, on PostgreSQL.

A fleet rollout boots thousands of pods within a minute, all asking at once. This
runs that against 1 and then 2 ``switchboard serve`` replicas, each run on a fresh
PostgreSQL schema, with a realistic number of requests in flight (128 by default),
pods spread over the replicas round-robin. It reports requests/s, p50/p90/p99
latency, errors (must be 0) and, after a clean SIGTERM of the replicas, the
decisions in the store (must be exactly one per pod).

The load generator is one asyncio process (uvloop when installed) speaking HTTP/1.1
with keep-alive over raw streams: far cheaper per request than an HTTP client
library, which matters because it shares this machine's CPUs with the replicas.

    python bench/boot_storm.py [--pods 10000] [--concurrency 128] [--replicas 1,2] [--rounds 3]

With ``--reports`` it runs the reports storm instead (``bench/reports_storm.py``: each
pod selects then reports its benchmarks, with 50 rollouts active, side by side with
another checkout): ``python bench/boot_storm.py --reports --before ../base``.

Rounds alternate between the replica counts so that the shared machine's noise
(other work on it moves requests/s by 2x between runs) hits each alike; the
figures reported are the medians over the rounds.

Needs the PostgreSQL server of the tests (127.0.0.1:5432, trust, database "test";
``SWITCHBOARD_BENCH_PG`` to use another).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
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
if str(ROOT) not in sys.path:  # `python bench/boot_storm.py` from anywhere
    sys.path.insert(0, str(ROOT))


from bench.common import raw_select  # noqa: E402
from bench.scale_support import cpu_model, pg_schema, serve_until_ready  # noqa: E402

TOKEN = "bench-admin-token"
PG_DSN = os.environ.get("SWITCHBOARD_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")

# ------------------------------------------------------------------ the fleet

# (device name, capability, weight): mostly Hopper, a Blackwell wave, older parts
GPUS = [
    ("NVIDIA H200", [9, 0], 35),
    ("NVIDIA H100 80GB HBM3", [9, 0], 25),
    ("NVIDIA B200", [10, 0], 20),
    ("NVIDIA A100-SXM4-80GB", [8, 0], 12),
    ("NVIDIA L40S", [8, 9], 5),
    (None, None, 3),  # a CPU-only canary pod
]
# what the pod image ships (None: the agent was told "any", assume every package)
PACKAGE_SETS = [
    ({"torch": "2.11.0", "flashinfer": "0.7.2", "cudnn": "1.32.0"}, 40),
    ({"torch": "2.11.0", "flashinfer": "0.7.2"}, 25),
    ({"torch": "2.11.0", "flash_attn": "2.8.3"}, 20),
    ({"torch": "2.11.0"}, 10),
    (None, 5),
]
MODELS = [
    ({"name": "deepseek-ai/DeepSeek-R1", "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "num_heads": 128}, 45),
    ({"name": "moonshotai/Kimi-K2-Instruct", "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "num_heads": 64}, 25),
    ({"name": "zai-org/GLM-5", "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
      "v_head_dim": 256, "num_heads": 64}, 20),
    ({"name": "deepseek-ai/DeepSeek-V2-Lite", "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "num_heads": 16}, 10),
]  # fmt: skip
REGIONS = ["us-east", "us-west", "eu-central", "ap-south"]


def pick(rng: random.Random, table: list[Any]) -> Any:
    return rng.choices([row[:-1] for row in table], weights=[row[-1] for row in table])[0]


def fleet(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` distinct pods: 20 clusters, 8 GPUs a node, names like Kubernetes's."""
    rng = random.Random(seed)
    pods = []
    for i in range(n):
        name, cap = pick(rng, GPUS)
        (packages,) = pick(rng, PACKAGE_SETS)
        (model,) = pick(rng, MODELS)
        cluster = f"prod-{REGIONS[i % 4]}-{i % 20 // 4 + 1}"
        deployment = model["name"].split("/")[1].lower()[:12].strip("-.")
        pods.append(
            {
                "cluster": cluster,
                "node": f"{cluster}-gpu-{i // 8:05d}",
                "pod": f"{deployment}-{rng.getrandbits(40):010x}-{i:05d}",
                "device": {"name": name, "capability": cap},
                "model": model,
                "dtype": "bfloat16",
                "packages": packages,
                "requested_backend": "FLASHINFER" if rng.random() < 0.03 else None,
                "strict": False,
            }
        )
    assert len({(p["cluster"], p["node"], p["pod"]) for p in pods}) == n
    return pods


# --------------------------------------------------------------- load generator


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    decision_ids: set[str] = field(default_factory=set)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length, keep = 0, True
    for line in lines[1:]:
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "content-length":
            length = int(value)
        elif key == "connection" and value.strip().lower() == "close":
            keep = False
    return status, await reader.readexactly(length), keep


async def connection(port: int, queue: list[bytes], out: Outcome, progress: list[int]) -> None:
    """One keep-alive connection taking requests from its replica's queue."""
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    while queue:
        request = queue.pop()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert reader is not None
            t0 = time.perf_counter()
            writer.write(request)
            status, body, keep = await read_response(reader)
            out.latencies.append(time.perf_counter() - t0)
            if status != 200:
                out.errors.append(f"HTTP {status}: {body[:200]!r}")
            else:
                out.decision_ids.add(json.loads(body)["decision_id"])
            if not keep:
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            out.errors.append(f"{type(exc).__name__}: {exc}")
            if writer is not None:
                writer.close()
            writer = None
        progress[0] += 1
    if writer is not None:
        writer.close()


async def storm(
    ports: list[int], pods: list[dict[str, Any]], concurrency: int
) -> tuple[Outcome, float]:
    queues: list[list[bytes]] = [[] for _ in ports]
    for i, pod in enumerate(pods):  # round-robin over the replicas
        r = i % len(ports)
        queues[r].append(raw_select(pod, f"127.0.0.1:{ports[r]}", TOKEN))
    for q in queues:
        q.reverse()  # pop() from the end keeps the fleet's order
    out, progress = Outcome(), [0]

    async def report() -> None:
        while True:
            await asyncio.sleep(1)
            elapsed = time.perf_counter() - start
            print(
                f"  {progress[0]:6d}/{len(pods)} answered  {progress[0] / elapsed:7.0f} req/s"
                f"  errors {len(out.errors)}",
                flush=True,
            )

    start = time.perf_counter()
    reporter = asyncio.create_task(report())
    await asyncio.gather(
        *(
            connection(ports[c % len(ports)], queues[c % len(ports)], out, progress)
            for c in range(concurrency)
        )
    )
    elapsed = time.perf_counter() - start
    reporter.cancel()
    return out, elapsed


# ------------------------------------------------------------------- replicas


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_replica(url: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = {**os.environ, "SWITCHBOARD_DATABASE_URL": url, "SWITCHBOARD_ADMIN_TOKEN": TOKEN}
    return serve_until_ready(sys.executable, ROOT, env, log, "replica")


def store_counts(url: str) -> tuple[int, int]:
    from mla_switchboard.service.store.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            decisions = conn.exec_driver_sql("SELECT count(*) FROM decisions").scalar_one()
            pods = conn.exec_driver_sql("SELECT count(*) FROM pod_latest").scalar_one()
        return decisions, pods
    finally:
        engine.dispose()


def run(replicas: int, pods: list[dict[str, Any]], concurrency: int, logs: Path) -> dict:
    schema = pg_schema(PG_DSN, "sb_bench")
    base = PG_DSN.split("://", 1)[1]
    url = f"postgresql+psycopg://{base}?options=-csearch_path%3D{schema}"
    print(f"\n{replicas} replica(s) on PostgreSQL schema {schema}: starting", flush=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ports = []
        for i in range(replicas):
            proc, port = start_replica(url, logs / f"replica-{replicas}-{i}.log")
            procs.append(proc)
            ports.append(port)
        cpu0 = [cpu_seconds(p.pid) for p in procs]
        gen0 = time.process_time()
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
            runner = asyncio.run
        print(f"  {len(pods)} pods, {concurrency} in flight, ports {ports}", flush=True)
        out, elapsed = runner(storm(ports, pods, concurrency))
        gen_cpu = time.process_time() - gen0
        server_cpu = sum(cpu_seconds(p.pid) - c for p, c in zip(procs, cpu0, strict=True))
        shutdown0 = time.monotonic()
        for p in procs:
            p.send_signal(signal.SIGTERM)  # clean: each flushes what it answered
        codes = [p.wait(60) for p in procs]
        shutdown_s = time.monotonic() - shutdown0
        decisions, pod_rows = store_counts(url)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        pg_schema(PG_DSN, "sb_bench", drop=schema)
    lat = sorted(out.latencies)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000

    result = {
        "replicas": replicas,
        "pods": len(pods),
        "concurrency": concurrency,
        "duration_s": round(elapsed, 3),
        "rps": round(len(lat) / elapsed, 1),
        "p50_ms": round(pct(0.50), 2),
        "p90_ms": round(pct(0.90), 2),
        "p99_ms": round(pct(0.99), 2),
        "max_ms": round(lat[-1] * 1000, 2),
        "mean_ms": round(statistics.fmean(lat) * 1000, 2),
        "errors": len(out.errors),
        "error_samples": out.errors[:5],
        "answers_200": len(out.decision_ids),
        "server_cpu_us_per_request": round(server_cpu / len(lat) * 1e6, 1),
        "loadgen_cpu_us_per_request": round(gen_cpu / len(lat) * 1e6, 1),
        "shutdown_s": round(shutdown_s, 2),
        "exit_codes": codes,
        "decisions_in_store": decisions,
        "pods_in_store": pod_rows,
        "all_decisions_stored": decisions == len(pods) == len(out.decision_ids),
    }
    print(
        f"  {result['rps']:.0f} req/s  p50 {result['p50_ms']:.1f} ms  p99 {result['p99_ms']:.1f}"
        f" ms  errors {result['errors']}  decisions in store {decisions}/{len(pods)}  "
        f"(server CPU {result['server_cpu_us_per_request']:.0f} us/req, load generator "
        f"{result['loadgen_cpu_us_per_request']:.0f} us/req)",
        flush=True,
    )
    return result


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds of one replica count; errors summed over all of them."""

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 2)

    return {
        "rps": med("rps"),
        "rps_min": min(r["rps"] for r in runs),
        "rps_max": max(r["rps"] for r in runs),
        "p50_ms": med("p50_ms"),
        "p99_ms": med("p99_ms"),
        "server_cpu_us_per_request": med("server_cpu_us_per_request"),
        "errors": sum(r["errors"] for r in runs),
        "decisions_in_store": [r["decisions_in_store"] for r in runs],
        "all_decisions_stored": all(r["all_decisions_stored"] for r in runs),
    }


def machine() -> str:
    model = cpu_model()
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores ({model}), shared"


def main() -> int:
    if "--reports" in sys.argv[1:]:  # the reports storm: bench/reports_storm.py
        from bench.reports_storm import main as reports_main

        return reports_main([a for a in sys.argv[1:] if a != "--reports"])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=128, help="requests in flight")
    ap.add_argument("--replicas", default="1,2", help="comma-separated replica counts")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each replica count")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "boot_storm.json"))
    args = ap.parse_args()

    pods = fleet(args.pods)
    logs = Path(tempfile.mkdtemp(prefix="sb-storm-"))
    counts = [int(n) for n in args.replicas.split(",")]
    runs = []
    for i in range(args.rounds):
        for n in counts:
            print(f"\nround {i + 1}/{args.rounds}", end="")
            runs.append(run(n, pods, args.concurrency, logs))
    by_n = {n: summarise([r for r in runs if r["replicas"] == n]) for n in counts}
    cores = os.cpu_count() or 0
    result: dict[str, Any] = {
        "benchmark": "boot storm: distinct pods each POST /v1/select once, PostgreSQL store",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "store": "PostgreSQL 127.0.0.1:5432 (same machine), a fresh schema per run",
        "load": f"{args.pods} distinct pods over 20 clusters, {args.concurrency} requests in "
        "flight, HTTP/1.1 keep-alive (asyncio streams, uvloop), round-robin over replicas",
        "rounds": args.rounds,
        "median_by_replicas": {str(n): v for n, v in by_n.items()},
        "runs": runs,
    }
    if 1 in by_n and 2 in by_n:
        result["ratio_rps_2_over_1"] = round(by_n[2]["rps"] / by_n[1]["rps"], 3)
        result["note"] = (
            f"On this {cores}-core machine the 2 replicas, PostgreSQL and the load "
            "generator share the same CPUs, so the 2-replica figure measures contention, "
            "not scale-out; on separate machines each replica brings its own cores."
        )
    ok = all(r["errors"] == 0 and r["all_decisions_stored"] for r in runs)
    result["ok"] = ok
    print("\n" + json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    for n, r in by_n.items():
        print(
            f"{n} replica(s), median of {args.rounds}: {r['rps']:.0f} req/s, p50 "
            f"{r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, errors {r['errors']}, "
            f"decisions in store {r['decisions_in_store']} (every run: exactly one per pod: "
            f"{r['all_decisions_stored']})"
        )
    if "ratio_rps_2_over_1" in result:
        print(f"ratio 2 replicas / 1: {result['ratio_rps_2_over_1']:.2f} ({result['note']})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not ok:
        print(
            f"FAILED: errors, or decisions missing from the store (logs: {logs})", file=sys.stderr
        )
        return 1
    shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
