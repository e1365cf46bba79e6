"""Fleet-wide change bench: what a ``*`` override costs the service, side by side for
two checkouts in one run.

One fleet (``--pods`` pods over ``--clusters`` clusters, bench/scale.py's deployments,
one recorded decision per pod and ``--results-per-pod`` evidence results) is filled
once on PostgreSQL. Then, for each level of per-cluster overrides (``--levels``: a
tenth, then all of the clusters, bench/scale_overrides.py's bodies, every second one a
10 % staged rollout: 100 and 1,000 overrides at 1,000 clusters, 50 and 500 staged),
each checkout (``--trees``: NAME=PATH, each with its own ``.venv``) starts a replica on
that same store and measures, with the replica's process CPU (``/proc``) beside each
wall time:

- ``PUT /v1/overrides/*?dry_run=true`` (a deny of FLASHINFER, a new note each time, so
  no kept preview answers it);
- the real ``PUT /v1/overrides/*`` and the summary read right after it, then
  ``DELETE /v1/overrides/*`` and the summary right after that (medians of
  ``--repeat``; the store is as it was afterwards). The warm-up round is kept apart
  (``first_round``): its change is one the replica never saw, so nothing was carried
  for it, where the measured rounds repeat its content with another note and expiry;
- ``POST /v1/select`` p50/p99 at ``--rate``/s idle and while summaries and ``*`` dry
  runs run back to back (bench/scale.py's open-loop client).

``--alternate N`` measures only the operations (no select load), in ``N`` rounds that
alternate the checkouts, each checkout's figures the medians over all its rounds' runs.
``--interleave N`` measures only the select load, in ``N`` rounds that alternate the
checkouts (base, new, then new, base, ...), a fresh replica of each per round, so
that a shared machine's noise falls on both alike; each tree's figure is the median
over rounds, idle and busy from the same round.

Growth is the ratio of a figure at the top level to the same at the first (100 -> 1,000
overrides). Each checkout's replica is started by its own python running this file
(``measure``), so the service is that checkout's and the bench the same code for both.

    python bench/fleet_change.py --trees base=/work/base,new=.            # the target
    python bench/fleet_change.py --pods 2000 --clusters 40 --repeat 1 \\
        --load-seconds 2 --trees new=.                                      # a small run
    python bench/fleet_change.py --levels all --alternate 3 \\
        --trees base=/work/base,new=.                                      # operations only
    python bench/fleet_change.py --levels all --interleave 5 \\
        --trees base=/work/base,new=.                                      # select p99 only

Writes ``bench/results/fleet_change.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scale import (  # noqa: E402
    Operations,
    cluster_names,
    database,
    fill_decisions,
    fill_evidence,
    machine,
    make_fleet,
    measure_load,
    ok,
    open_store,
    start_service,
)
from bench.scale_overrides import LEVELS, override_body  # noqa: E402
from bench.scale_support import measure_in, process_cpu_s, stage, write_json  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "fleet_change.json"
PG_DSN = "postgresql://postgres@127.0.0.1:5432/bench_effects"
MACHINE = "2 shared cores, no GPU"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("mode", nargs="?", default="run", choices=["run", "measure"])
    ap.add_argument("--pods", type=int, default=100_000)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--levels", default="tenth,all", help="bench/scale_overrides.py's levels")
    ap.add_argument("--results-per-pod", type=float, default=0.25)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--load-seconds", type=float, default=8.0)
    ap.add_argument("--load-rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--interleave", type=int, default=0, help="select load only, N alternating rounds"
    )
    ap.add_argument(
        "--alternate",
        type=int,
        default=0,
        help="the operations only (no select load), N rounds alternating the checkouts",
    )
    ap.add_argument("--load-only", action="store_true", help=argparse.SUPPRESS)  # measure
    ap.add_argument("--skip-load", action="store_true", help=argparse.SUPPRESS)  # measure
    ap.add_argument("--trees", default=f"new={ROOT}", help="NAME=PATH,... (each has .venv)")
    ap.add_argument("--pg", default=PG_DSN, help="PostgreSQL database (default %(default)s)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--url", help=argparse.SUPPRESS)  # measure: the store
    return ap.parse_args(argv)


# ------------------------------------------------------------------ one replica


def _timed_cpu(pid: int, call: Any) -> tuple[float, float]:
    """Wall seconds of ``call()`` and the replica's CPU seconds meanwhile."""
    cpu0, t0 = process_cpu_s(pid), time.perf_counter()
    call()
    return time.perf_counter() - t0, process_cpu_s(pid) - cpu0


def _fleet_body(n: int) -> dict[str, Any]:
    """A fleet-wide deny whose note and expiry differ every time (never a kept answer)."""
    expires = datetime.now(UTC) + timedelta(hours=2, seconds=n)
    return {
        "deny": ["FLASHINFER"],
        "note": f"fleet change bench {n} {time.time()}",
        "expires_at": expires.isoformat(),
    }


def _median(runs: list[tuple[float, float]]) -> dict[str, Any]:
    return {
        "median_s": round(statistics.median(w for w, _ in runs), 4),
        "cpu_median_s": round(statistics.median(c for _, c in runs), 4),
        "runs_s": [round(w, 4) for w, _ in runs],
        "cpu_s": [round(c, 4) for _, c in runs],
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """This checkout's replica on ``args.url``: the operations, then the select load."""
    fleet = make_fleet(args.pods, args.clusters, seed=args.seed)
    clusters = cluster_names(args.clusters)
    with tempfile.TemporaryDirectory(prefix="sb-fleet-change-") as logs:
        service = start_service(args.url, Path(logs))
        pid = service.proc.pid
        ops = Operations(service, fleet, clusters)
        # the pods it boots are named apart from those of the replicas before it on
        # this store: a pod booted again in the same situation changes no count, and
        # the "steady" summary after it would be a kept answer for all but the first
        ops.n = time.time_ns() // 1_000_000 % 10**9 * 100
        c = ops.clients[0]
        try:
            out: dict[str, Any] = {"start_s": service.started_s, "cpu_s_at_ready": None}
            out["cpu_s_at_ready"] = round(process_cpu_s(pid), 2)
            t, cpu = _timed_cpu(pid, lambda: ok(c.get("/v1/selections/summary")))
            out["first_summary"] = {"s": round(t, 4), "cpu_s": round(cpu, 4)}
            if args.load_only:
                ok(c.put("/v1/overrides/*?dry_run=true", json=_fleet_body(0)))  # warm
                out["select"] = _select_load(service, fleet, args, pid)
                return out
            runs: dict[str, list[tuple[float, float]]] = {
                k: []
                for k in (
                    "dry_run",
                    "put",
                    "summary_after_put",
                    "delete",
                    "summary_after_delete",
                    "summary_steady",
                )
            }
            for r in range(args.repeat + 1):  # the first round warms up
                keep = r > 0
                body = _fleet_body(r)
                dry = _timed_cpu(
                    pid, lambda b=body: ok(c.put("/v1/overrides/*?dry_run=true", json=b))
                )
                ops.reboot()  # a pod boots: the next summary is not a kept one
                steady = _timed_cpu(pid, lambda: ok(c.get("/v1/selections/summary")))
                # another note: the write previews its own change, not the dry run's
                written = {**body, "note": f"{body['note']} written"}
                put = _timed_cpu(pid, lambda b=written: ok(c.put("/v1/overrides/*", json=b)))
                after_put = _timed_cpu(pid, lambda: ok(c.get("/v1/selections/summary")))
                delete = _timed_cpu(
                    pid, lambda r=r: ok(c.delete(f"/v1/overrides/*?note=bench+{r}"))
                )
                after_delete = _timed_cpu(pid, lambda: ok(c.get("/v1/selections/summary")))
                if not keep:  # a change never seen before: nothing carried for it yet
                    out["first_round"] = {
                        k: {"s": round(v[0], 4), "cpu_s": round(v[1], 4)}
                        for k, v in (
                            ("dry_run", dry),
                            ("put", put),
                            ("summary_after_put", after_put),
                            ("delete", delete),
                            ("summary_after_delete", after_delete),
                        )
                    }
                if keep:
                    runs["dry_run"].append(dry)
                    runs["summary_steady"].append(steady)
                    runs["put"].append(put)
                    runs["summary_after_put"].append(after_put)
                    runs["delete"].append(delete)
                    runs["summary_after_delete"].append(after_delete)
                stage(
                    f"  round {r}: dry run {dry[0]:.3f} s, put {put[0]:.3f} s, summary "
                    f"{after_put[0]:.3f} s, delete {delete[0]:.3f} s, summary "
                    f"{after_delete[0]:.3f} s"
                )
            out["operations"] = {k: _median(v) for k, v in runs.items()}
            if args.skip_load:
                return out
            out["select"] = _select_load(service, fleet, args, pid)
            out["rss_mb"] = service.memory_mb()
            return out
        finally:
            ops.close()
            service.stop()


def _select_load(service: Any, fleet: Any, args: argparse.Namespace, pid: int) -> dict[str, Any]:
    """Select p50/p99 idle and while summaries and ``*`` dry runs run back to back, with
    the reads completed meanwhile and the replica's CPU over the whole load."""
    cpu0 = process_cpu_s(pid)
    load = measure_load(
        service,
        fleet,
        rate=args.rate,
        seconds=args.load_seconds,
        rounds=args.load_rounds,
        report_rate=1.0,
        scenarios={"idle": [], "summaries+previews": ["summaries", "previews"]},
    )
    out: dict[str, Any] = {
        k: {
            **{x: v[x] for x in ("p50_ms", "p99_ms", "max_ms", "errors")},
            "completed": [r["background"]["completed"] for r in v["rounds"]],
        }
        for k, v in load.items()
    }
    idle = load["idle"]["p99_ms"]
    busy = load["summaries+previews"]["p99_ms"]
    out["p99_busy_over_idle"] = round(busy / idle, 2) if idle else None
    out["cpu_s"] = round(process_cpu_s(pid) - cpu0, 2)
    return out


# ------------------------------------------------------------------ the run


def put_level(url: str, clusters: list[str], level: str, done: set[int]) -> int:
    """The overrides of ``level`` not yet stored, through the store's API."""
    from mla_switchboard.core.schemas import OverrideSpec
    from mla_switchboard.service.store import Store
    from mla_switchboard.service.store.db import make_engine

    engine = make_engine(url)
    store = Store(engine)
    todo = [i for i in range(len(clusters)) if LEVELS[level](i) and i not in done]
    for i in todo:
        spec = OverrideSpec.model_validate(override_body(i, clusters[i]))
        store.config.put_override(
            clusters[i], spec, actor="fleet-bench", if_match=None, preview=None
        )
        done.add(i)
    engine.dispose()
    return len(done)


def run(args: argparse.Namespace) -> dict[str, Any]:
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    clusters = cluster_names(args.clusters)
    fleet = make_fleet(args.pods, args.clusters, seed=args.seed)
    result: dict[str, Any] = {
        "benchmark": "fleet-wide override change (bench/fleet_change.py)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**machine(), "described": MACHINE},
        "store": "postgresql (same machine)",
        "parameters": {k: v for k, v in vars(args).items() if k not in ("url", "mode")},
        "trees": {},
        "levels": {},
    }
    for name, path in trees.items():
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True, text=True
        ).stdout.strip()
        result["trees"][name] = {"path": str(Path(path).resolve()), "commit": head}
    with database("postgresql", args.pg, "fc") as url:
        stage("filling the store")
        store = open_store(url)
        done: set[int] = set()
        levels = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
        put_level(url, clusters, levels[0], done)
        fill = {
            "decisions": fill_decisions(store, fleet, 1),
            "evidence": fill_evidence(store, fleet, int(args.pods * args.results_per_pod)),
        }
        store.engine.dispose()
        result["fill"] = fill
        for level in levels:
            overrides = put_level(url, clusters, level, done)
            staged = sum(1 for i in done if (i // 2) % 2)
            entry: dict[str, Any] = {"overrides": overrides, "staged": staged, "trees": {}}
            result["levels"][level] = entry
            if args.interleave:
                _Alternating(args, url, trees, entry, result).interleaved()
                continue
            if args.alternate:
                _Alternating(args, url, trees, entry, result).alternated()
                continue
            for name, path in trees.items():
                stage(f"{level}: {overrides} overrides ({staged} staged), {name}")
                entry["trees"][name] = _measure_in(path, url, args)
                write_json(Path(args.out), result)
    result["growth"] = growth(result, levels, list(trees))
    return result


def _measure_in(path: str, url: str, args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    """``measure`` run by the checkout at ``path`` (its own python) on ``url``."""
    return measure_in(path, __file__, url, *_passed(args), *extra)


@dataclass
class _Alternating:
    """One level's rounds that alternate the checkouts (``--interleave``,
    ``--alternate``): the run's arguments, the store, the checkouts, the level's entry
    and the whole result (written after every round)."""

    args: argparse.Namespace
    url: str
    trees: dict[str, str]
    entry: dict[str, Any]
    result: dict[str, Any]

    def rounds(self, n: int, keep: Callable[[dict[str, Any]], Any], *extra: str) -> None:
        """``n`` rounds of ``measure`` (with ``extra``), a fresh replica of each
        checkout per round, the order alternating (base, new, then new, base, ...) so
        that a shared machine's noise falls on all alike; what ``keep`` takes of each
        answer goes to ``entry["rounds"]``."""
        names = list(self.trees)
        self.entry["rounds"] = []
        for r in range(n):
            order = names if r % 2 == 0 else names[::-1]
            done: dict[str, Any] = {}
            for name in order:
                stage(f"round {r + 1}/{n}: {name}")
                done[name] = keep(_measure_in(self.trees[name], self.url, self.args, *extra))
            self.entry["rounds"].append(done)
            write_json(Path(self.args.out), self.result)

    def of(self, name: str) -> list[Any]:
        """What was kept of checkout ``name`` in every round."""
        return [r[name] for r in self.entry["rounds"]]

    def interleaved(self) -> None:
        """``--interleave``: one select-load round per checkout at a time, the order
        alternating, then each checkout's medians over its rounds."""
        self.rounds(self.args.interleave, lambda one: one["select"],
                    "--load-only", "--load-rounds", "1")  # fmt: skip
        for name in self.trees:
            rounds = self.of(name)
            self.entry["trees"][name] = {
                "select": {
                    "idle_p99_ms": [x["idle"]["p99_ms"] for x in rounds],
                    "busy_p99_ms": [x["summaries+previews"]["p99_ms"] for x in rounds],
                    "p99_busy_over_idle": [x["p99_busy_over_idle"] for x in rounds],
                    "idle_p99_median_ms": _med(x["idle"]["p99_ms"] for x in rounds),
                    "busy_p99_median_ms": _med(x["summaries+previews"]["p99_ms"] for x in rounds),
                    "ratio_median": _med(
                        x["p99_busy_over_idle"] for x in rounds if x["p99_busy_over_idle"]
                    ),
                    "cpu_s": [x["cpu_s"] for x in rounds],
                }
            }

    def alternated(self) -> None:
        """``--alternate``: the operations (no select load) by a fresh replica of one
        checkout at a time, the order alternating; each checkout's figure is the median
        over every measured run of every round (and of the first rounds, a change never
        seen, apart)."""
        self.rounds(self.args.alternate, lambda one: one, "--skip-load")
        for name in self.trees:
            rounds = self.of(name)
            ops: dict[str, Any] = {}
            for f in (*FIGURES, "summary_steady"):
                walls = [w for x in rounds for w in x["operations"][f]["runs_s"]]
                cpus = [c for x in rounds for c in x["operations"][f]["cpu_s"]]
                ops[f] = _median(list(zip(walls, cpus, strict=True)))
            first = {
                f: _median(
                    [(x["first_round"][f]["s"], x["first_round"][f]["cpu_s"]) for x in rounds]
                )
                for f in FIGURES
            }
            self.entry["trees"][name] = {"operations": ops, "first_round": first}


def _med(values: Any) -> float:
    return round(statistics.median(values), 2)


def _passed(args: argparse.Namespace) -> list[str]:
    keys = ("pods", "clusters", "repeat", "rate", "load_seconds", "load_rounds", "seed")
    return [x for k in keys for x in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]


FIGURES = ("dry_run", "put", "summary_after_put", "delete", "summary_after_delete")


def growth(result: dict[str, Any], levels: list[str], trees: list[str]) -> dict[str, Any]:
    """Per checkout: each figure at the top level over the same at the first."""
    if len(levels) < 2:
        return {}
    out: dict[str, Any] = {}
    low, high = result["levels"][levels[0]]["trees"], result["levels"][levels[-1]]["trees"]
    for tree in trees:
        a, b = low[tree]["operations"], high[tree]["operations"]
        out[tree] = {f: round(b[f]["median_s"] / a[f]["median_s"], 2) for f in FIGURES}
        out[f"{tree} cpu"] = {
            f: round(b[f]["cpu_median_s"] / a[f]["cpu_median_s"], 2)
            for f in FIGURES
            if a[f]["cpu_median_s"]
        }
    return out


def table(result: dict[str, Any]) -> str:
    lines = []
    trees = list(result["trees"])
    head = " | ".join(f"{t} wall (CPU)" for t in trees)
    lines.append(f"| level | operation | {head} |")
    lines.append("|---|---|" + "---|" * len(trees))
    for level, entry in result["levels"].items():
        label = f"{level} ({entry['overrides']}, {entry['staged']} staged)"
        for f in (*FIGURES, "summary_steady"):
            cells = []
            for t in trees:
                op = entry["trees"].get(t, {}).get("operations", {}).get(f)
                cells.append(
                    "-" if op is None else f"{op['median_s']:.3f} s ({op['cpu_median_s']:.3f} s)"
                )
            lines.append(f"| {label} | {f} | {' | '.join(cells)} |")
        for f in ("dry_run", "put"):  # the first round: a change the replica never saw
            firsts = [entry["trees"].get(t, {}).get("first_round", {}).get(f) for t in trees]
            if any(x is not None and "median_s" in x for x in firsts):
                cells = [
                    "-" if x is None else f"{x['median_s']:.3f} s ({x['cpu_median_s']:.3f} s)"
                    for x in firsts
                ]
                lines.append(f"| {label} | first round: {f} | {' | '.join(cells)} |")
        cells = []
        if not any(entry["trees"].get(t, {}).get("select") for t in trees):
            continue  # --alternate: the operations only
        for t in trees:
            s = entry["trees"].get(t, {}).get("select", {})
            if "ratio_median" in s:  # --interleave: medians over rounds
                cells.append(
                    f"idle {s['idle_p99_median_ms']} ms, busy {s['busy_p99_median_ms']} ms "
                    f"({s['ratio_median']}x; rounds {s['p99_busy_over_idle']})"
                )
                continue
            cells.append(
                f"idle {s.get('idle', {}).get('p99_ms')} ms, busy "
                f"{s.get('summaries+previews', {}).get('p99_ms')} ms "
                f"({s.get('p99_busy_over_idle')}x)"
            )
        lines.append(f"| {label} | select p99 | {' | '.join(cells)} |")
    for t, g in result.get("growth", {}).items():
        lines.append(f"growth {t}: " + ", ".join(f"{k} {v}x" for k, v in g.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode == "measure":
        write_json(Path(args.out), measure(args))
        return 0
    result = run(args)
    write_json(Path(args.out), result)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
