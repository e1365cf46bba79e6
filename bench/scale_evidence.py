"""Scale bench, evidence axis: what a year of stored reports and one busy situation cost.

Two parts, each on stores filled for the purpose (``bench/evidence_fill.py``: the rows
``Store.add_measurements`` writes, with the time each report was sent, in bulk):

**Stored reports** (``--reports``, default 10,000 / 100,000 / 1,000,000): reports of 6
or 7 results spread evenly over ``--days`` (365) from the pods of a fleet of ``--pods``
(10,000, over 10 clusters, the fleet of bench/scale.py with ``--decisions-per-pod``
recorded decisions each); each report comes from a pod name of its own (pods are
redeployed; a year's reports come from pods long gone), 97 % counted, 0.4 % of the
FLASHINFER and CUDNN results wrong. The rows go into the table as migration
``BULK_REVISION`` made it; then the product's own migrations bring the store to head
(timed: a migration that derives tables from the rows does its work here), and the
decisions are stored through the store's API. Then a replica starts ``--starts`` times
(default 2: the first start after the fill, then the steady state), and each start
records the time until ``/readyz`` answers 200, the service's CPU by then, its RSS
after start and its peak (VmHWM), and the evidence it holds (``GET
/v1/measurements/summary``: groups and samples).

**One situation** (``--hot-pods``, default 1,000 / 10,000 / 100,000): that many pods of
one cluster, all in one situation (H200, DeepSeek-R1's dims, one package set, our own
kernels) under policy ``measured``, each with one decision and ``--hot-reports``
reports of 8 results spread over the evidence window, and 60 more at its edge, one
expiring each minute for an hour after the fill (so that every prune has one to drop,
at every size; a store kept with ``--keep-fill`` for longer has none left). A replica starts on
it; once its start-up work is done, ``POST /v1/select`` runs at ``--rate`` per second
(open loop, bench/scale.py's client) for ``--load-seconds`` (idle), then ``--reloads``
times a full evidence reload is asked for while the same load runs (the store's
``evidence_epoch`` is moved, as a replica of an older release does when an admin
clears failures: the service rebuilds every index from the store), then the load runs
for ``--prune-wait-s`` (the service prunes expired evidence once a minute). No metric
says when a reload or a prune begins or ends: every thread's CPU is sampled from
/proc every 0.1 s, and each is found as a burst of CPU on one background thread (the
service runs its background threads at a lower priority, which tells them from the
event loop). A reload is timed from the epoch's move to its thread's last CPU
(noticing it takes up to ``SWITCHBOARD_CONFIG_POLL_S``, 0.5 s), its CPU is its
thread's and the whole process's over that time; the prune is the largest burst of
that same thread in the minute. Select p50/p99 are taken over the requests sent
during each. Any ``switchboard_evidence*`` metric the service has is recorded around
each reload.

A reload that runs longer than a minute is followed at once by the prune that became
due meanwhile, on the same thread: its figure then includes one prune.

    python bench/scale.py --axis evidence                 # PostgreSQL, every size (long)
    python bench/scale.py --axis evidence --quick         # smallest sizes, ~2-3 min
    python bench/scale.py --axis evidence --sqlite --reports 10000 --hot-pods 1000

Writes ``bench/results/scale_evidence.json`` (after each size) and prints the tables.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/scale_evidence.py` from anywhere
    sys.path.insert(0, str(ROOT))

from mla_switchboard.core.schemas import OverrideSpec  # noqa: E402
from mla_switchboard.service.store import Store  # noqa: E402
from mla_switchboard.service.store.db import make_engine, migrate  # noqa: E402

from bench.evidence_fill import BULK_REVISION, Plan, in_window, write_plan  # noqa: E402
from bench.scale import (  # noqa: E402
    MODELS,
    PACKAGE_SETS,
    PG_DSN,
    Pod,
    SelectLoad,
    Service,
    fill_decisions,
    http_select,
    latency_stats,
    machine,
    make_fleet,
    measurable,
    start_service,
)
from bench.scale_support import (  # noqa: E402
    Databases,
    ThreadSampler,
    bump_evidence_epoch,
    metric_diff,
    metric_lines,
    migrate_to,
    process_cpu_s,
    product_commit,
    product_root,
    stage,
    wait_for_burst_end,
    write_json,
)

RESULTS = ROOT / "bench" / "results" / "scale_evidence.json"
HOT_CLUSTER = "hot-0000"
EVIDENCE_METRICS = ("switchboard_evidence",)
MAX_AGE_DAYS = float(os.environ.get("SWITCHBOARD_MEASURED_MAX_AGE_DAYS", "30"))


def ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


QUICK: dict[str, Any] = {
    "reports": "1000,10000",
    "pods": 1000,
    "decisions_per_pod": 2,
    "hot_pods": "300,1000",
    "reloads": 1,
    "load_seconds": 3.0,
    "prune_sizes": "1000",
    "prune_wait_s": 65.0,
}
"""``--quick``: the smallest sizes, about two minutes (a minute of it waiting for a prune)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--axis", default="evidence", help=argparse.SUPPRESS)
    ap.add_argument("--reports", default="10000,100000,1000000", help="stored reports per size")
    ap.add_argument("--days", type=float, default=365.0, help="the reports span this many days")
    ap.add_argument("--pods", type=int, default=10_000, help="the fleet whose pods report")
    ap.add_argument("--clusters", type=int, default=10, help="clusters of that fleet")
    ap.add_argument("--decisions-per-pod", type=int, default=10, help="its recorded decisions")
    ap.add_argument("--starts", type=int, default=2, help="replica starts per size (>= 1)")
    ap.add_argument("--hot-pods", default="1000,10000,100000", help="pods in one situation")
    ap.add_argument("--hot-reports", type=int, default=1, help="reports of 8 per hot pod")
    ap.add_argument("--reloads", type=int, default=2, help="full reloads timed per hot size")
    ap.add_argument("--rate", type=float, default=300.0, help="selects per second, open loop")
    ap.add_argument("--load-seconds", type=float, default=10.0, help="idle select load")
    ap.add_argument(
        "--prune-wait-s",
        type=float,
        default=70.0,
        help="select load while waiting for a prune (once a minute; 0 skips)",
    )
    ap.add_argument(
        "--prune-sizes",
        default="",
        help="hot sizes whose prune is waited for (default: every one)",
    )
    ap.add_argument("--reload-timeout-s", type=float, default=1800.0)
    ap.add_argument("--start-timeout-s", type=float, default=1800.0)
    ap.add_argument("--skip-reports", action="store_true", help="only the one-situation part")
    ap.add_argument("--skip-hot", action="store_true", help="only the stored-reports part")
    ap.add_argument("--sqlite", action="store_true", help="SQLite files instead of PostgreSQL")
    ap.add_argument("--pg", default=PG_DSN, help="PostgreSQL server (default %(default)s)")
    ap.add_argument(
        "--keep-fill",
        action="store_true",
        help="keep each filled store (named after the product's commit and the fill's "
        "parameters) and reuse it next time; runs then go on a copy",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smallest sizes: 1,000 and 10,000 reports over 1,000 pods, 300 and 1,000 hot "
        "pods, one reload, 3 s loads, the prune of the larger size only",
    )
    ap.add_argument("--out", default=str(RESULTS), help="JSON results (default %(default)s)")
    if ap.parse_known_args(argv)[0].quick:  # smaller defaults; what is given still wins
        ap.set_defaults(**QUICK)
    args = ap.parse_args(argv)
    args.store = "sqlite" if args.sqlite else "postgresql"
    args.starts = max(1, args.starts)
    return args


# ------------------------------------------------------------------ stores


def fill_key(args: argparse.Namespace, *parts: object) -> str:
    """A short name for one fill: the product's commit and everything the fill reads."""
    text = json.dumps([product_commit(), args.store, args.seed, *parts], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def filled(
    args: argparse.Namespace, dbs: Databases, name: str, fill: Any
) -> tuple[str, dict[str, Any]]:
    """The URL to run on: ``name`` filled by ``fill(url)`` (its figures returned), or,
    with ``--keep-fill``, a copy of the one a run before filled."""
    dbs.templates.add(name)
    if args.keep_fill and dbs.exists(name):
        stage(f"reusing the filled store {name}")
        figures: dict[str, Any] = {"reused": name}
    else:
        url = dbs.create(name)
        figures = fill(url)
    figures["store_mb"] = dbs.size_mb(name)
    url = dbs.clone(name) if args.keep_fill else dbs.url(name)
    return url, figures


def bulk_then_head(url: str, plans: list[Plan], label: str) -> dict[str, Any]:
    """The schema at ``BULK_REVISION``, the plans' rows in bulk, then the product's
    later migrations (timed)."""
    engine = make_engine(url)
    migrate_to(engine, BULK_REVISION)
    engine.dispose()
    out = {"measurements": write_plan(url, plans, label)}
    engine = make_engine(url)
    t0 = time.monotonic()
    migrate(engine)
    out["migrate_to_head_s"] = round(time.monotonic() - t0, 2)
    engine.dispose()
    return out


def seeded_store(url: str) -> Store:
    engine = make_engine(url)
    migrate(engine)  # at head already: nothing to do
    store = Store(engine)
    store.config.ensure_seeded()
    return store


# ------------------------------------------------------------------ stored reports


def fill_reports(args: argparse.Namespace, url: str, reports: int) -> dict[str, Any]:
    fleet = make_fleet(args.pods, args.clusters, seed=args.seed)
    now = datetime.now(UTC)
    plan = Plan(
        measurable(fleet),
        reports,
        now - timedelta(days=args.days),
        now - timedelta(minutes=1),
        seed=args.seed,
    )
    label = f"{reports:,} reports: "
    out = bulk_then_head(url, [plan], label)
    out["reports_in_window"] = in_window(plan, timedelta(days=MAX_AGE_DAYS), now)
    store = seeded_store(url)
    try:
        out["decisions"] = fill_decisions(store, fleet, args.decisions_per_pod, label=label)
    finally:
        store.engine.dispose()
    return out


def evidence_held(service: Service) -> dict[str, Any]:
    """What the replica's evidence summary lists (groups, samples) and how long it took."""
    with service.client() as c:
        t0 = time.perf_counter()
        r = c.get("/v1/measurements/summary")
        took = time.perf_counter() - t0
    if r.status_code != 200:
        return {"status": r.status_code, "seconds": round(took, 3)}
    body = r.json()
    groups = body if isinstance(body, list) else body.get("items", body.get("groups", []))
    return {
        "seconds": round(took, 3),
        "groups": len(groups),
        "samples": sum(int(g.get("samples", 0)) for g in groups if isinstance(g, dict)),
    }


def one_start(url: str, log_dir: Path, timeout_s: float) -> dict[str, Any]:
    service = start_service(url, log_dir, timeout=timeout_s)
    try:
        out: dict[str, Any] = {
            "ready_s": service.started_s,
            "cpu_s_at_ready": round(process_cpu_s(service.proc.pid), 2),
            "rss_at_ready": service.memory_mb(),
        }
        time.sleep(2.0)  # what the background threads do right after start
        out["evidence"] = evidence_held(service)
        out["rss_after"] = service.memory_mb()
        out["cpu_s_after"] = round(process_cpu_s(service.proc.pid), 2)
        return out
    finally:
        service.stop()


def run_reports(
    args: argparse.Namespace, dbs: Databases, reports: int, log_dir: Path
) -> dict[str, Any]:
    stage(f"stored reports {reports:,}: fill ({args.store})")
    name = f"sbe_r{reports}_" + fill_key(
        args, "reports", reports, args.days, args.pods, args.clusters, args.decisions_per_pod
    )
    url, fill = filled(args, dbs, name, lambda u: fill_reports(args, u, reports))
    out: dict[str, Any] = {"reports": reports, "fill": fill, "starts": []}
    for k in range(args.starts):
        stage(f"stored reports {reports:,}: start {k + 1}/{args.starts}")
        start = one_start(url, log_dir, args.start_timeout_s)
        out["starts"].append(start)
        stage(
            f"stored reports {reports:,}: ready in {start['ready_s']:.1f} s "
            f"({start['cpu_s_at_ready']:.1f} s CPU), RSS {start['rss_after']}, "
            f"evidence {start['evidence']}"
        )
    return out


# ------------------------------------------------------------------ one situation


def hot_fleet(pods: int) -> list[Pod]:
    """``pods`` pods of one cluster in one situation (bench/scale.py's run_hot)."""
    base = {
        "device": {"name": "NVIDIA H200", "capability": [9, 0]},
        "model": MODELS[0][0],
        "dtype": "bfloat16",
        "packages": PACKAGE_SETS[0][0],
        "engine": None,  # our own kernels: every backend is a candidate
    }
    return [
        Pod({"cluster": HOT_CLUSTER, "node": f"hot-gpu-{i // 8:05d}", "pod": f"r1-{i:06d}", **base})
        for i in range(pods)
    ]


EXPIRING = 60
"""One-situation reports placed at the window's edge, one a minute for the hour after
the fill: every prune in that hour has a report to drop, whatever the size."""


def fill_hot(args: argparse.Namespace, url: str, pods: int) -> dict[str, Any]:
    fleet = hot_fleet(pods)
    now = datetime.now(UTC)
    edge = now - timedelta(days=MAX_AGE_DAYS)
    common: dict[str, Any] = {
        "results": (8,),
        "counted_share": 1.0,
        "wrong_rate": 0.0,
        "per_incarnation": None,
    }
    expiring = Plan(
        fleet[:EXPIRING],
        min(EXPIRING, pods),
        edge + timedelta(seconds=30),
        edge + timedelta(seconds=30 + 60 * EXPIRING),
        seed=args.seed + 1,
        **common,
    )
    rest = Plan(
        fleet,
        pods * args.hot_reports,
        edge + timedelta(seconds=30 + 60 * EXPIRING),
        now - timedelta(minutes=1),
        seed=args.seed,
        **common,
    )
    out = bulk_then_head(url, [expiring, rest], f"one situation, {pods:,} pods: ")
    store = seeded_store(url)
    try:
        out["decisions"] = fill_decisions(store, fleet, 1, label=f"one situation, {pods:,}: ")
        spec = OverrideSpec(policy="measured", note="scale bench: one busy situation")
        config = store.config
        config.put_override(HOT_CLUSTER, spec, actor="scale-bench", if_match=None, preview=None)
    finally:
        store.engine.dispose()
    return out


MIN_WINDOW_S = 1.0
"""Select latency around a reload or prune shorter than this is taken over this long
(centred on it): a p99 of the thirty requests sent during a 0.1 s prune says nothing."""


def during(samples: list[tuple[float, float]], start: float, end: float) -> dict[str, Any]:
    """Select latency of the requests scheduled between ``start`` and ``end``
    (widened to ``MIN_WINDOW_S``), with the window's length."""
    if end - start < MIN_WINDOW_S:
        middle = (start + end) / 2
        start, end = middle - MIN_WINDOW_S / 2, middle + MIN_WINDOW_S / 2
    stats = latency_stats([lat for at, lat in samples if start <= at <= end])
    return {**stats, "window_s": round(end - start, 2)}


def settle(sampler: ThreadSampler, since: float, what: str) -> dict[str, Any] | None:
    """Wait until the background threads' start-up work (first prune, scope builds)
    is done, so the idle load does not measure it."""
    burst = wait_for_burst_end(sampler, since, first_within_s=3.0, timeout_s=600.0)
    if burst is None:
        return None
    stage(f"{what}: start-up background work {burst.cpu_s:.2f} s CPU, done")
    return burst.shown(since)


def run_hot(
    args: argparse.Namespace, dbs: Databases, pods: int, log_dir: Path, prune: bool
) -> dict[str, Any]:
    what = f"one situation, {pods:,} pods"
    stage(f"{what}: fill ({args.store})")
    name = f"sbe_h{pods}_" + fill_key(args, "hot", pods, args.hot_reports, MAX_AGE_DAYS)
    url, fill = filled(args, dbs, name, lambda u: fill_hot(args, u, pods))
    out: dict[str, Any] = {"pods": pods, "results": pods * args.hot_reports * 8, "fill": fill}
    stage(f"{what}: start")
    service = start_service(url, log_dir, timeout=args.start_timeout_s)
    pid = service.proc.pid
    ready_at = time.monotonic()
    out["ready_s"] = service.started_s
    out["cpu_s_at_ready"] = round(process_cpu_s(pid), 2)
    out["rss_at_ready"] = service.memory_mb()
    fleet = hot_fleet(pods)
    rng = random.Random(args.seed)
    requests = [http_select(p.request, service.port) for p in rng.sample(fleet, min(2000, pods))]
    try:
        with ThreadSampler(pid, every_s=0.1) as sampler:
            out["start_background"] = settle(sampler, ready_at, what)
            SelectLoad(service.port, requests, args.rate, 2.0).result()  # warm-up
            stage(f"{what}: idle select load, {args.load_seconds:g} s")
            t0 = time.monotonic()
            cpu0 = process_cpu_s(pid)
            idle = SelectLoad(service.port, requests, args.rate, args.load_seconds).result()
            idle_cpu_rate = (process_cpu_s(pid) - cpu0) / max(time.monotonic() - t0, 1e-9)
            out["idle"] = {
                **latency_stats([lat for _, lat in idle["samples"]]),
                "errors": len(idle["errors"]) + idle["unanswered"],
                "process_cpu_per_s": round(idle_cpu_rate, 3),
            }
            stage(f"{what}: idle {out['idle']}")
            out["reloads"] = [
                one_reload(args, service, url, sampler, requests, idle_cpu_rate, what, k)
                for k in range(args.reloads)
            ]
            if prune:
                out["prune"] = watch_prune(args, service, sampler, requests, out["reloads"], what)
            out["rss_end"] = service.memory_mb()
    finally:
        service.stop()
    summarize_hot(out)
    return out


def one_reload(
    args: argparse.Namespace,
    service: Service,
    url: str,
    sampler: ThreadSampler,
    requests: list[bytes],
    idle_cpu_rate: float,
    what: str,
    k: int,
) -> dict[str, Any]:
    """One full reload asked for while selects run; its time, CPU and their latency."""
    load = SelectLoad(service.port, requests, args.rate, 3600.0)
    time.sleep(1.0)
    with service.client() as c:
        before = metric_lines(c, EVIDENCE_METRICS)
    stage(f"{what}: reload {k + 1}/{args.reloads}: moving evidence_epoch")
    asked = time.monotonic()
    bump_evidence_epoch(url)

    def note(seconds: float, cpu: float) -> None:
        stage(f"{what}: reload {k + 1}: {seconds:.0f} s, {cpu:.1f} s CPU on its thread so far")

    burst = wait_for_burst_end(sampler, asked, timeout_s=args.reload_timeout_s, progress=note)
    time.sleep(0.5)
    load.stop.set()
    result = load.result()
    with service.client() as c:
        metrics = metric_diff(before, metric_lines(c, EVIDENCE_METRICS))
    out: dict[str, Any] = {"metrics": metrics, "rss_after": service.memory_mb()}
    if burst is None:  # a reload too small for the 0.1 s sampler: the process, since the ask
        ended = time.monotonic()
        samples = sampler.snapshot()
        at_ask = next(s for at, s in samples if at >= asked)
        process = sum(c.cpu_s for c in samples[-1][1].values()) - sum(
            c.cpu_s for c in at_ask.values()
        )
        out.update(
            seen=False,
            after_ask_s=round(ended - asked, 2),
            process_cpu_s=round(process, 2),
            process_cpu_less_idle_s=round(process - idle_cpu_rate * (ended - asked), 2),
            select_after_ask=during(result["samples"], asked, ended),
        )
        stage(
            f"{what}: reload {k + 1}: no background burst seen after the epoch moved; "
            f"the process used {process:.2f} s CPU in the {ended - asked:.1f} s after "
            f"({out['process_cpu_less_idle_s']:.2f} s over idle), select {out['select_after_ask']}"
        )
        return out
    samples = sampler.snapshot()
    at_ask = next(s for at, s in samples if at >= asked)
    at_end = next((s for at, s in samples if at >= burst.end), samples[-1][1])
    process = sum(c.cpu_s for c in at_end.values()) - sum(c.cpu_s for c in at_ask.values())
    wall = burst.end - asked
    out.update(
        seen=True,
        tid=burst.tid,
        wall_s=round(wall, 2),
        noticed_after_s=round(burst.start - asked, 2),
        thread_cpu_s=round(burst.cpu_s, 2),
        process_cpu_s=round(process, 2),
        process_cpu_less_idle_s=round(process - idle_cpu_rate * wall, 2),
        select=during(result["samples"], asked, burst.end),
        select_errors=len(result["errors"]) + result["unanswered"],
    )
    stage(
        f"{what}: reload {k + 1}: {wall:.2f} s, {burst.cpu_s:.2f} s CPU on its thread "
        f"({process:.2f} s the process), select {out['select']}, metrics {metrics or '-'}"
    )
    return out


def watch_prune(
    args: argparse.Namespace,
    service: Service,
    sampler: ThreadSampler,
    requests: list[bytes],
    reloads: list[dict[str, Any]],
    what: str,
) -> dict[str, Any]:
    """Selects for ``prune_wait_s`` (the service prunes once a minute), then the
    prune found in it: the largest burst of the thread that did the reloads (of any
    background thread when no reload was seen)."""
    stage(f"{what}: select load for {args.prune_wait_s:g} s, waiting for a prune")
    t0 = time.monotonic()
    result = SelectLoad(service.port, requests, args.rate, args.prune_wait_s).result()
    bursts = sampler.bursts(t0, t0 + args.prune_wait_s + 1, min_cpu_s=0.001)
    tids = {r.get("tid") for r in reloads if r.get("tid") is not None}
    candidates = [b for b in bursts if not tids or b.tid in tids] or bursts
    out: dict[str, Any] = {
        "select_whole_wait": latency_stats([lat for _, lat in result["samples"]]),
        "bursts": [b.shown(t0) for b in sorted(bursts, key=lambda b: -b.cpu_s)[:20]],
    }
    if not candidates:
        out["seen"] = False
        stage(f"{what}: no prune burst (under 1 ms of CPU) in {args.prune_wait_s:g} s")
        return out
    prune = max(candidates, key=lambda b: b.cpu_s)
    out.update(
        seen=True,
        wall_s=round(prune.end - prune.start, 2),
        cpu_s=round(prune.cpu_s, 3),
        select=during(result["samples"], prune.start, prune.end),
    )
    stage(f"{what}: prune {out['wall_s']:.2f} s, {out['cpu_s']:.3f} s CPU, select {out['select']}")
    return out


def summarize_hot(out: dict[str, Any]) -> None:
    """Medians over the reloads, and p99 ratios to idle."""
    seen = [r for r in out.get("reloads", []) if r.get("seen")]
    idle = out.get("idle", {}).get("p99_ms")
    s: dict[str, Any] = {"reloads_seen": len(seen)}
    if seen:
        for key in ("wall_s", "thread_cpu_s", "process_cpu_s", "process_cpu_less_idle_s"):
            s[f"reload_{key}"] = round(statistics.median(r[key] for r in seen), 2)
        p99 = [r["select"].get("p99_ms") for r in seen if r["select"].get("p99_ms") is not None]
        s["reload_select_p99_ms"] = max(p99) if p99 else None
    unseen = [r for r in out.get("reloads", []) if r.get("seen") is False]
    if unseen and not seen:  # reloads too small to be a burst: the process after each ask
        s["reload_process_cpu_less_idle_s"] = round(
            statistics.median(r["process_cpu_less_idle_s"] for r in unseen), 2
        )
        p99 = [r["select_after_ask"].get("p99_ms") for r in unseen]
        p99 = [p for p in p99 if p is not None]
        s["reload_select_p99_ms"] = max(p99) if p99 else None
    prune = out.get("prune") or {}
    if prune.get("seen"):
        s["prune_wall_s"], s["prune_cpu_s"] = prune["wall_s"], prune["cpu_s"]
        s["prune_select_p99_ms"] = prune["select"].get("p99_ms")
    elif prune:
        s["prune_select_p99_ms"] = prune["select_whole_wait"].get("p99_ms")
        s["prune_seen"] = False
    for name in ("reload", "prune"):
        p99 = s.get(f"{name}_select_p99_ms")
        s[f"{name}_select_p99_x_idle"] = round(p99 / idle, 2) if p99 and idle else None
    out["summary"] = s


# ------------------------------------------------------------------ tables


def _f(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.1f}x"
    if unit == "s":
        if value < 0.1:
            return f"{value:.3f} s"
        return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"
    if unit == "ms":
        return f"{value:.1f} ms"
    if unit == "MB":
        return f"{value:.0f} MB"
    return f"{value:,}"


Row = tuple[str, str, Callable[[dict[str, Any]], Any]]


def growth_table(what: str, sizes: dict[str, Any], rows: list[Row]) -> list[str]:
    """A Markdown table: a row per figure, a column per size, and the ratio of
    consecutive sizes' figures (times and memory)."""
    keys = list(sizes)
    head = [what, *(f"{int(k):,}" for k in keys), "growth from size to size"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, unit, get in rows:
        values = [get(sizes[k]) for k in keys]
        growth = [
            f"{b / a:.1f}x" if a and b is not None and unit in ("s", "MB") else "-"
            for a, b in itertools.pairwise(values)
        ]
        cells = [label, *(_f(v, unit) for v in values), ", ".join(growth) or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def reports_table(sizes: dict[str, Any]) -> list[str]:
    if not sizes:
        return []

    def start(s: dict[str, Any], i: int) -> dict[str, Any]:
        return s["starts"][min(i, len(s["starts"]) - 1)]

    rows: list[Row] = [
        ("measurement results stored", "", lambda s: s["fill"].get("measurements", {}).get("rows")),
        ("reports in the evidence window", "", lambda s: s["fill"].get("reports_in_window")),
        ("fill (bulk rows)", "s", lambda s: s["fill"].get("measurements", {}).get("seconds")),
        ("migrations after the fill", "s", lambda s: s["fill"].get("migrate_to_head_s")),
        ("first start: until /readyz 200", "s", lambda s: start(s, 0)["ready_s"]),
        ("first start: CPU by then", "s", lambda s: start(s, 0)["cpu_s_at_ready"]),
        ("second start: until /readyz 200", "s", lambda s: start(s, 1)["ready_s"]),
        ("second start: CPU by then", "s", lambda s: start(s, 1)["cpu_s_at_ready"]),
        ("RSS after start", "MB", lambda s: start(s, 1)["rss_after"].get("VmRSS")),
        ("RSS peak", "MB", lambda s: start(s, 1)["rss_after"].get("VmHWM")),
        ("samples held (evidence summary)", "", lambda s: start(s, 1)["evidence"].get("samples")),
    ]
    return growth_table("stored reports", sizes, rows)


def hot_table(sizes: dict[str, Any]) -> list[str]:
    if not sizes:
        return []
    rows: list[Row] = [
        ("results stored", "", lambda s: s["fill"].get("measurements", {}).get("rows")),
        ("start: until /readyz 200", "s", lambda s: s["ready_s"]),
        ("full reload, wall", "s", lambda s: s["summary"].get("reload_wall_s")),
        ("full reload, CPU of its thread", "s", lambda s: _sum(s, "reload_thread_cpu_s")),
        ("full reload, CPU of the process", "s", lambda s: _sum(s, "reload_process_cpu_s")),
        ("prune, wall", "s", lambda s: s["summary"].get("prune_wall_s")),
        ("prune, CPU", "s", lambda s: s["summary"].get("prune_cpu_s")),
        ("select p50 idle", "ms", lambda s: s.get("idle", {}).get("p50_ms")),
        ("select p99 idle", "ms", lambda s: s.get("idle", {}).get("p99_ms")),
        ("select p99 during reloads", "ms", lambda s: s["summary"].get("reload_select_p99_ms")),
        ("  x idle", "x", lambda s: s["summary"].get("reload_select_p99_x_idle")),
        ("select p99 during the prune", "ms", lambda s: s["summary"].get("prune_select_p99_ms")),
        ("  x idle", "x", lambda s: s["summary"].get("prune_select_p99_x_idle")),
        ("RSS peak", "MB", lambda s: (s.get("rss_end") or {}).get("VmHWM")),
    ]
    return growth_table("pods in one situation", sizes, rows)


def _sum(size: dict[str, Any], key: str) -> Any:
    return size["summary"].get(key)


def table(result: dict[str, Any]) -> str:
    parts = reports_table(result.get("reports", {}))
    hot = hot_table(result.get("one_situation", {}))
    if parts and hot:
        parts.append("")
    return "\n".join(parts + hot)


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    result: dict[str, Any] = {
        "benchmark": "scale, evidence axis: stored reports and one busy situation "
        "(bench/scale_evidence.py)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "product": {"tree": str(product_root()), "commit": product_commit()},
        "store": args.store,
        "parameters": {k: v for k, v in vars(args).items() if k not in ("pg", "axis")},
        "max_age_days": MAX_AGE_DAYS,
        "reports": {},
        "one_situation": {},
    }
    hot_sizes = [] if args.skip_hot else ints(args.hot_pods)
    prune_sizes = set(ints(args.prune_sizes)) if args.prune_sizes else set(hot_sizes)
    dbs = Databases(args.store, args.pg)
    with tempfile.TemporaryDirectory(prefix="sb-scale-evidence-logs-") as logs:
        log_dir = Path(logs)
        try:
            for n in [] if args.skip_reports else ints(args.reports):
                result["reports"][str(n)] = run_reports(args, dbs, n, log_dir)
                write_json(out, {**result, "complete": False, "table": table(result)})
            for pods in hot_sizes:
                prune = args.prune_wait_s > 0 and pods in prune_sizes
                result["one_situation"][str(pods)] = run_hot(args, dbs, pods, log_dir, prune)
                write_json(out, {**result, "complete": False, "table": table(result)})
        except Exception:
            for log in sorted(log_dir.glob("*.log")):
                print(f"--- {log.name} (last lines)\n{log.read_text()[-2000:]}", file=sys.stderr)
            raise
        finally:
            dbs.cleanup(frozenset(dbs.templates) if args.keep_fill else frozenset())
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    text = table(result)
    print("\n" + text)
    write_json(out, {**result, "complete": True, "table": text})
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
