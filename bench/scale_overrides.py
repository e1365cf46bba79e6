"""Scale bench, clusters x overrides axis: what a thousand clusters with their own
overrides cost the service's reads and writes.

For each cluster count (``--clusters``, default 10 / 100 / 1,000) it fills a fresh store
with bench/scale.py's fleet of ``--pods`` pods (default 10,000; ``--pods 100000`` for
the issue's target) spread over those clusters, with their recorded decisions and one
evidence result per pod (through the store's API, as bench/scale.py does). Then, level
by level (``--levels``, default none / tenth / half / all of the clusters), admins put
an override on more clusters: every second override staged (a 10 % rollout), the
others policy ``measured``, a deny, or a deny for one model family. The overrides are
written the way users write them, one ``PUT /v1/overrides/{cluster}`` at a time through
the API, each timed (for at most ``--write-budget-s`` per level; the rest then go
through the store's API and the total is extrapolated from the last writes). At each
level a replica starts again (start-up time, CPU by then, RSS) and the bench measures,
with bench/scale.py's ``Operations`` (cold: a new pod boots before each read and the
ETag is checked to have moved): ``GET /v1/selections/summary``, the dashboard's first
load, a dry-run ``PUT`` of one cluster's override and of ``*``, an admin ``PUT`` and
``DELETE`` of one cluster's override (put back afterwards), and ``POST /v1/select``
p50/p99 at ``--rate`` per second idle and while summaries and previews of ``*`` run
back to back; RSS at the end. A refusal (a 503 past the service's read budget) is
recorded with the time it took, and the run goes on.

Growth is reported as ratios: 10x the overrides on the same clusters (``all`` over
``tenth``: 100 -> 1,000 overrides at 1,000 clusters), and 10x the clusters with an
override on each.

    python bench/scale.py --axis overrides                  # PostgreSQL, 10 / 100 / 1,000
    python bench/scale.py --axis overrides --pods 100000    # the issue's target fleet
    python bench/scale.py --axis overrides --quick          # ~2 min
    python bench/scale.py --axis overrides --sqlite --clusters 1000 --pods 5000

Writes ``bench/results/scale_overrides.json`` (after each level) and prints the table.
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/scale_overrides.py` from anywhere
    sys.path.insert(0, str(ROOT))

from mla_switchboard.core.schemas import OverrideSpec  # noqa: E402
from mla_switchboard.service.store import Store  # noqa: E402
from mla_switchboard.service.store.db import make_engine  # noqa: E402

from bench.scale import (  # noqa: E402
    PG_DSN,
    Operations,
    Pod,
    Service,
    cluster_names,
    database,
    fill_decisions,
    fill_evidence,
    fmt,
    machine,
    make_fleet,
    measure_load,
    ok,
    open_store,
    start_service,
)
from bench.scale_support import (  # noqa: E402
    attempt,
    process_cpu_s,
    product_commit,
    product_root,
    stage,
    write_json,
)

RESULTS = ROOT / "bench" / "results" / "scale_overrides.json"
LEVELS: dict[str, Callable[[int], bool]] = {
    "none": lambda i: False,
    "tenth": lambda i: i % 10 == 0,
    "half": lambda i: i % 2 == 0,
    "all": lambda i: True,
}
"""Which clusters (by index) carry an override at each level; each level's clusters
include the previous level's, so going up only adds overrides."""
EXTRA_SETTLE_S = 0.35
NOT_COLD = "the run is not cold"
LOAD_SCENARIOS = {"idle": [], "summaries+previews": ["summaries", "previews"]}


def override_body(i: int, cluster: str) -> dict[str, Any]:
    """Cluster ``i``'s override, as an admin PUTs it. Staged when ``(i // 2) % 2``:
    every second override at each level is staged (clusters 2, 6, 10, ... of half,
    10, 30, 50, ... of tenth, 2, 3, 6, 7, ... of all). No override denies a pod of
    bench/scale.py's fleet its last backend (a deny of FLASHINFER would refuse SGLang
    on A100 and L40S pools: the selects would count 409s)."""
    note = f"scale bench: {cluster}"
    if (i // 2) % 2:
        deny = ["CUDNN"] if i % 3 else ["TRTLLM_RAGGED"]
        return {"deny": deny, "note": f"{note}, staged", "rollout": {"percent": 10}}
    kind = (i // 4) % 3
    if kind == 0:
        return {"policy": "measured", "note": f"{note}, measured"}
    if kind == 1:  # none of these leaves a pod of the fleet without a backend
        return {"deny": ["CUDNN", "TOKENSPEED_MLA"], "note": f"{note}, deny"}
    return {"deny": ["TRTLLM_RAGGED"], "model": "deepseek-ai/*", "note": f"{note}, one family"}


QUICK: dict[str, Any] = {
    "clusters": "10,100",
    "pods": 1000,
    "decisions_per_pod": 2,
    "levels": "tenth,all",
    "repeat": 2,
    "load_rounds": 1,
    "load_seconds": 3.0,
}
"""``--quick``: the smallest sizes, about two minutes."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--axis", default="overrides", help=argparse.SUPPRESS)
    ap.add_argument("--clusters", default="10,100,1000", help="cluster counts (at least 4)")
    ap.add_argument(
        "--levels", default="none,tenth,half,all", help="which clusters carry an override"
    )
    ap.add_argument("--pods", type=int, default=10_000, help="pods of the fleet")
    ap.add_argument("--decisions-per-pod", type=int, default=10)
    ap.add_argument("--results-per-pod", type=float, default=1.0, help="evidence results per pod")
    ap.add_argument("--deployments", type=int, default=8, help="pod descriptions per cluster")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per operation (medians)")
    ap.add_argument("--rate", type=float, default=300.0, help="selects per second, open loop")
    ap.add_argument("--load-seconds", type=float, default=10.0)
    ap.add_argument("--load-rounds", type=int, default=2)
    ap.add_argument(
        "--write-budget-s",
        type=float,
        default=300.0,
        help="per level, write overrides through the API for at most this long; the rest "
        "through the store's API (default %(default)s)",
    )
    ap.add_argument("--sqlite", action="store_true", help="a SQLite file instead of PostgreSQL")
    ap.add_argument("--pg", default=PG_DSN, help="PostgreSQL server (default %(default)s)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="10 and 100 clusters, 1,000 pods, levels tenth and all, short loads",
    )
    ap.add_argument("--out", default=str(RESULTS), help="JSON results (default %(default)s)")
    if ap.parse_known_args(argv)[0].quick:  # smaller defaults; what is given still wins
        ap.set_defaults(**QUICK)
    args = ap.parse_args(argv)
    args.cluster_counts = [int(c) for c in args.clusters.split(",") if c.strip()]
    if any(c < 4 for c in args.cluster_counts):
        ap.error("--clusters: at least 4 each (the previewed and the written cluster)")
    wanted = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    unknown = set(wanted) - set(LEVELS)
    if unknown:
        ap.error(f"--levels: unknown {sorted(unknown)}; choose from {list(LEVELS)}")
    args.level_names = [lv for lv in LEVELS if lv in wanted]  # in increasing order
    args.store = "sqlite" if args.sqlite else "postgresql"
    return args


# ------------------------------------------------------------------ operations


class CountingOperations(Operations):
    """bench/scale.py's operations, counting a refusal instead of ending the run: at
    the sizes this axis reaches, the code before it answered the summary with a 503
    after its read budget, and that time is the figure."""

    def __init__(self, service: Service, fleet: list[Pod], clusters: list[str]) -> None:
        super().__init__(service, fleet, clusters)
        self.refusals: list[str] = []
        # the new pods' names must differ from those an earlier level's operations
        # booted on the same store: a pod that boots again moves no count
        self.n = secrets.randbelow(10**6) * 10**4

    def reboot(self) -> None:
        """bench/scale.py's new pod, with more time for the writer to store it: on a
        loaded machine its batch can take longer than three flush intervals, and the
        read then finds the answer it kept (``cold`` says so)."""
        super().reboot()
        time.sleep(EXTRA_SETTLE_S)

    def check(self, response: httpx.Response) -> httpx.Response:
        if response.status_code >= 300:
            self.refusals.append(
                f"{response.request.method} {response.request.url.path} "
                f"{response.status_code}: {response.text[:120]}"
            )
        return response


def timed_runs(ops: CountingOperations, call: Callable[[], float], times: int) -> dict[str, Any]:
    """``call`` once untimed, then ``times`` times: the median, every run, and the
    refusals among the timed runs."""
    runs: list[float] = []
    refused: list[str] = []
    for k in range(times + 1):
        before = len(ops.refusals)
        try:
            seconds = call()
        except RuntimeError as exc:
            if NOT_COLD not in str(exc):
                raise
            print(f"    {exc}: once more", flush=True)
            seconds = call()  # the writer was late: a new pod again, then the read
        if k:
            runs.append(seconds)
            refused.extend(ops.refusals[before:])
    return {
        "median_s": round(statistics.median(runs), 4),
        "runs": [round(r, 4) for r in runs],
        "refused": len(refused),
        "refusals": refused[:3],
    }


def measure_operations(ops: CountingOperations, times: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    steps: list[tuple[str, Callable[[], float]]] = [
        ("summary", ops.summary),
        ("dashboard", ops.dashboard),
        ("preview_cluster", ops.preview_cluster),
        ("preview_fleet", ops.preview_fleet),
    ]
    for name, call in steps:
        out[name] = timed_runs(ops, call, times)
        _print_op(name, out[name])
    # each PUT creates the override its DELETE removes
    puts: list[float] = []
    deletes: list[float] = []
    refused: dict[str, list[str]] = {"admin_put": [], "admin_delete": []}
    for k in range(times + 1):
        for name, call, runs in (
            ("admin_put", ops.admin_put, puts),
            ("admin_delete", ops.admin_delete, deletes),
        ):
            before = len(ops.refusals)
            seconds = call()
            if k:
                runs.append(seconds)
                refused[name].extend(ops.refusals[before:])
    for name, runs in (("admin_put", puts), ("admin_delete", deletes)):
        out[name] = {
            "median_s": round(statistics.median(runs), 4),
            "runs": [round(r, 4) for r in runs],
            "refused": len(refused[name]),
            "refusals": refused[name][:3],
        }
        _print_op(name, out[name])
    return out


def _print_op(name: str, figures: dict[str, Any]) -> None:
    refused = (
        f"  REFUSED {figures['refused']}: {figures['refusals'][:1]}" if figures["refused"] else ""
    )
    print(
        f"    {name:16s} median {figures['median_s']:.3f} s  {figures['runs']}{refused}", flush=True
    )


# ------------------------------------------------------------------ writing overrides


def write_overrides(
    service: Service, url: str, clusters: list[str], todo: list[int], budget_s: float
) -> dict[str, Any]:
    """Cluster ``todo``'s overrides, one ``PUT`` at a time through the API for at most
    ``budget_s``, the rest through the store's API (``put_override``, no preview: what
    the service's write stores, less the preview it computes for the audit)."""
    times: list[float] = []
    errors: list[str] = []
    t0 = last = time.monotonic()
    with service.client() as c:
        for i in todo:
            if time.monotonic() - t0 > budget_s:
                break
            body = override_body(i, clusters[i])
            outcome = attempt(
                lambda c=c, i=i, body=body: ok(c.put(f"/v1/overrides/{clusters[i]}", json=body))
            )
            times.append(outcome.seconds)
            if outcome.error:
                errors.append(outcome.error)
            if time.monotonic() - last > 10:
                last = time.monotonic()
                stage(
                    f"  overrides written through the API: {len(times):,}/{len(todo):,}, "
                    f"last {times[-1]:.3f} s"
                )
    rest = todo[len(times) :]
    if rest:
        stage(f"  write budget spent: {len(rest):,} overrides through the store's API")
        engine = make_engine(url)
        store = Store(engine)
        for i in rest:
            spec = OverrideSpec.model_validate(override_body(i, clusters[i]))
            store.config.put_override(
                clusters[i], spec, actor="scale-bench", if_match=None, preview=None
            )
        engine.dispose()
    out: dict[str, Any] = {
        "overrides": len(todo),
        "through_api": len(times),
        "through_store": len(rest),
        "api_seconds": round(sum(times), 2),
        "errors": len(errors),
        "error_samples": errors[:3],
    }
    if times:
        ordered = sorted(times)
        out["per_write_ms"] = {
            "median": round(1000 * statistics.median(times), 1),
            "p90": round(1000 * ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 1),
            "max": round(1000 * ordered[-1], 1),
            "first_10_median": round(1000 * statistics.median(times[:10]), 1),
            "last_10_median": round(1000 * statistics.median(times[-10:]), 1),
        }
        tail = times[-20:]
        out["all_through_api_s"] = round(sum(times) + len(rest) * sum(tail) / len(tail), 1)
        out["all_through_api_extrapolated"] = bool(rest)
    return out


# ------------------------------------------------------------------ one cluster count


def measure_level(
    args: argparse.Namespace,
    service: Service,
    fleet: list[Pod],
    clusters: list[str],
    with_override: set[int],
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "overrides": len(with_override),
        "staged": sum(1 for i in with_override if (i // 2) % 2),
        "start_s": service.started_s,
        "cpu_s_at_ready": round(process_cpu_s(service.proc.pid), 2),
        "rss_start": service.memory_mb(),
    }
    ops = CountingOperations(service, fleet, clusters)
    try:
        out["operations"] = measure_operations(ops, args.repeat)
    finally:
        ops.close()
    admin = 3  # Operations writes clusters[3]'s override: put its own back
    if admin in with_override:
        with service.client() as c:
            ok(
                c.put(
                    f"/v1/overrides/{clusters[admin]}", json=override_body(admin, clusters[admin])
                )
            )
    out["rss_after_operations"] = service.memory_mb()
    out["load"] = measure_load(
        service,
        fleet,
        rate=args.rate,
        seconds=args.load_seconds,
        rounds=args.load_rounds,
        report_rate=20.0,
        scenarios=LOAD_SCENARIOS,
    )
    out["rss_end"] = service.memory_mb()
    return out


def run_clusters(args: argparse.Namespace, count: int, log_dir: Path) -> dict[str, Any]:
    clusters = cluster_names(count)
    fleet = make_fleet(args.pods, count, args.deployments, seed=args.seed)
    what = f"{count:,} clusters"
    results = round(args.pods * args.results_per_pod)
    out: dict[str, Any] = {"clusters": count, "pods": args.pods, "levels": {}}
    with database(args.store, args.pg, f"ov{count}") as url:
        stage(f"{what}: fill {args.pods:,} pods ({args.store})")
        store = open_store(url)
        label = f"{what}: "
        out["fill_decisions"] = fill_decisions(store, fleet, args.decisions_per_pod, label=label)
        out["fill_evidence"] = fill_evidence(store, fleet, results, label=label)
        store.engine.dispose()
        written: set[int] = set()
        service: Service | None = None
        try:
            for level in args.level_names:
                todo = [i for i in range(count) if LEVELS[level](i) and i not in written]
                writes = None
                if todo:
                    if service is None:
                        service = start_service(url, log_dir)
                    stage(f"{what}: writing {len(todo):,} overrides one at a time (level {level})")
                    writes = write_overrides(service, url, clusters, todo, args.write_budget_s)
                    written.update(todo)
                    stage(f"{what}: written {_writes_line(writes)}")
                if service is not None:
                    service.stop()
                stage(f"{what}, {len(written):,} overrides: start")
                service = start_service(url, log_dir)
                stage(f"{what}, {len(written):,} overrides: ready in {service.started_s:.1f} s")
                figures = measure_level(args, service, fleet, clusters, written)
                figures["writes"] = writes
                out["levels"][level] = figures
                stage(f"{what}, {len(written):,} overrides: done")
        finally:
            if service is not None:
                service.stop()
    return out


def _writes_line(w: dict[str, Any]) -> str:
    per = w.get("per_write_ms", {})
    return (
        f"{w['through_api']:,} through the API in {w['api_seconds']:.1f} s "
        f"(median {per.get('median', 0):.0f} ms, last 10 {per.get('last_10_median', 0):.0f} ms)"
        + (f", {w['through_store']:,} through the store" if w["through_store"] else "")
    )


# ------------------------------------------------------------------ tables

ROWS: list[tuple[str, str, Callable[[dict[str, Any]], Any], str | None]] = [
    ("GET /v1/selections/summary", "s", lambda s: _op(s, "summary"), "summary"),
    ("dashboard first load", "s", lambda s: _op(s, "dashboard"), "dashboard"),
    ("preview of one cluster's", "s", lambda s: _op(s, "preview_cluster"), "preview_cluster"),
    ("preview of *", "s", lambda s: _op(s, "preview_fleet"), "preview_fleet"),
    ("admin PUT override", "s", lambda s: _op(s, "admin_put"), "admin_put"),
    ("admin DELETE override", "s", lambda s: _op(s, "admin_delete"), "admin_delete"),
    ("select p50, idle", "ms", lambda s: s["load"]["idle"]["p50_ms"], None),
    ("select p99, idle", "ms", lambda s: s["load"]["idle"]["p99_ms"], None),
    ("select p99, summaries+previews", "ms", lambda s: _loaded(s)["p99_ms"], None),
    ("  x idle", "x", lambda s: _ratio(s), None),
    ("start: until /readyz 200", "s", lambda s: s["start_s"], None),
    ("RSS after start", "MB", lambda s: s["rss_start"].get("VmRSS"), None),
    ("RSS peak", "MB", lambda s: s["rss_end"].get("VmHWM"), None),
    ("this level's writes via the API", "s", lambda s: _writes(s).get("api_seconds"), None),
    ("  one write, median", "ms", lambda s: _writes(s).get("per_write_ms", {}).get("median"), None),
]  # fmt: skip
"""(label, unit, figure of one level, the operation whose refusals the cell shows)"""


def _op(level: dict[str, Any], name: str) -> float | None:
    return level.get("operations", {}).get(name, {}).get("median_s")


def _loaded(level: dict[str, Any]) -> dict[str, Any]:
    return level["load"]["summaries+previews"]


def _writes(level: dict[str, Any]) -> dict[str, Any]:
    return level.get("writes") or {}


def _refused(level: dict[str, Any], name: str) -> int:
    return int(level.get("operations", {}).get(name, {}).get("refused", 0))


def _ratio(level: dict[str, Any]) -> float | None:
    idle = level["load"]["idle"]["p99_ms"]
    loaded = level["load"]["summaries+previews"]["p99_ms"]
    return loaded / idle if idle else None


OP_NAMES = ("summary", "dashboard", "preview_cluster", "preview_fleet", "admin_put", "admin_delete")


def growth(result: dict[str, Any]) -> dict[str, Any]:
    """Ratios: 10x the overrides on the same clusters (all / tenth), and 10x the
    clusters with an override on every one (all at consecutive counts)."""
    out: dict[str, Any] = {}
    counts = result["clusters"]
    for key, size in counts.items():
        levels = size["levels"]
        if "tenth" in levels and "all" in levels:
            a, b = levels["tenth"], levels["all"]
            label = f"{a['overrides']:,} -> {b['overrides']:,} overrides, {int(key):,} clusters"
            out[label] = _ratios(a, b)
    keys = [k for k in counts if "all" in counts[k]["levels"]]
    for k1, k2 in itertools.pairwise(keys):
        a, b = counts[k1]["levels"]["all"], counts[k2]["levels"]["all"]
        out[f"{int(k1):,} -> {int(k2):,} clusters, an override on each"] = _ratios(a, b)
    return out


def _ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    ratios: dict[str, float | None] = {}
    for name in OP_NAMES:
        x, y = _op(a, name), _op(b, name)
        ratios[name] = round(y / x, 2) if x and y is not None else None
    x, y = a["load"]["summaries+previews"]["p99_ms"], b["load"]["summaries+previews"]["p99_ms"]
    ratios["select_p99_loaded"] = round(y / x, 2) if x else None
    return ratios


def table(result: dict[str, Any]) -> str:
    columns: list[tuple[str, dict[str, Any]]] = []
    for key, size in result["clusters"].items():
        for level in size["levels"].values():
            columns.append((f"{int(key):,} cl. / {level['overrides']:,} ov.", level))
    if not columns:
        return ""
    head = ["operation", *(c for c, _ in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, unit, get, op in ROWS:
        cells = []
        for _, level in columns:
            try:
                value = get(level)
            except (KeyError, TypeError):
                value = None
            cell = fmt(value, unit)
            if op is not None and _refused(level, op):
                cell += f" ({_refused(level, op)} refused)"
            cells.append(cell)
        lines.append("| " + " | ".join([label, *cells]) + " |")
    ratios = result.get("growth") or {}
    if ratios:
        lines += ["", "| growth | " + " | ".join(OP_NAMES) + " | select p99 loaded |"]
        lines.append("|" + "---|" * (len(OP_NAMES) + 2))
        for label, r in ratios.items():
            cells = [f"{v:.2f}x" if v is not None else "-" for v in r.values()]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    result: dict[str, Any] = {
        "benchmark": "scale, clusters x overrides axis (bench/scale_overrides.py)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "product": {"tree": str(product_root()), "commit": product_commit()},
        "store": args.store,
        "parameters": {
            k: v for k, v in vars(args).items() if k not in ("pg", "axis", "cluster_counts")
        },
        "read_budget_s": os.environ.get("SWITCHBOARD_FLEET_READ_BUDGET_S", "the service's default"),
        "clusters": {},
    }
    with tempfile.TemporaryDirectory(prefix="sb-scale-overrides-logs-") as logs:
        log_dir = Path(logs)
        try:
            for count in args.cluster_counts:
                result["clusters"][str(count)] = run_clusters(args, count, log_dir)
                result["growth"] = growth(result)
                write_json(out, {**result, "complete": False, "table": table(result)})
        except Exception:
            for log in sorted(log_dir.glob("*.log")):
                print(f"--- {log.name} (last lines)\n{log.read_text()[-2000:]}", file=sys.stderr)
            raise
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    result["growth"] = growth(result)
    text = table(result)
    print("\n" + text)
    write_json(out, {**result, "complete": True, "table": text})
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
