"""How long the fleet reads hold the interpreter in one piece, side by side for
checkouts: the steps of the fleet-read and worker threads that no switch interval can
cut (one C call, or the objects a return drops freed at once), in thread CPU time.

A select waits for the longest of these when it arrives during one, so they bound
select p99 while summaries and ``*`` dry runs run; unlike p99, thread CPU does not
move with the shared machine's other load. Each checkout (``--trees NAME=PATH``, each
with its own ``.venv``) starts a replica on the same store with
``bench/gil_steps/sitecustomize.py`` loaded, which keeps every step over 1 ms with
its place, then answers ``--reads`` rounds of: a pod boots (the summary is not a kept
one), the summary, a ``*`` dry run. The checkouts alternate over ``--rounds``.

    python bench/gil_steps.py --trees base=/work/base,new=.          # fills a store
    python bench/gil_steps.py --url postgresql+psycopg://... --trees ...   # a filled one

Writes ``--out`` (JSON) and prints each checkout's counts and longest steps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fleet_change import PG_DSN, put_level  # noqa: E402
from bench.scale import (  # noqa: E402
    Operations,
    cluster_names,
    database,
    fill_decisions,
    fill_evidence,
    make_fleet,
    ok,
    open_store,
    start_service,
)
from bench.scale_support import measure_in, stage, write_json  # noqa: E402

HOOK = Path(__file__).resolve().parent / "gil_steps"
BOUNDS_MS = (1, 2, 5, 10)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("mode", nargs="?", default="run", choices=["run", "measure"])
    ap.add_argument("--pods", type=int, default=100_000)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--reads", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--trees", default=f"new={ROOT}")
    ap.add_argument("--pg", default=PG_DSN)
    ap.add_argument("--url", help="a store already filled (else one is filled and dropped)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gil_steps.json"))
    return ap.parse_args(argv)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """This checkout's replica: ``--reads`` summaries and ``*`` dry runs, its steps."""
    fleet = make_fleet(args.pods, args.clusters, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="sb-gil-steps-") as logs:
        steps_file = Path(logs) / "steps.json"
        service = start_service(
            args.url,
            Path(logs),
            PYTHONPATH=str(HOOK),
            SB_GIL_STEPS=str(steps_file),
            SWITCHBOARD_FLEET_READ_BUDGET_S="600",  # the profile slows the reads
        )
        ops = Operations(service, fleet, cluster_names(args.clusters))
        c = ops.clients[0]
        try:
            ok(c.get("/v1/selections/summary"))
            for i in range(args.reads):
                ops.reboot()
                ok(c.get("/v1/selections/summary"))
                body = {"deny": ["FLASHINFER"], "note": f"gil steps {i} {time.time()}"}
                ok(c.put("/v1/overrides/*?dry_run=true", json=body))
            time.sleep(2.5)  # the hook writes its file every second
        finally:
            ops.close()
            service.stop()
        steps = json.loads(steps_file.read_text()) if steps_file.exists() else []
    return {
        "reads": args.reads,
        "over_ms": {str(b): sum(1 for d, _ in steps if d > b) for b in BOUNDS_MS},
        "longest_ms": steps[0][0] if steps else 0.0,
        "longest": steps[:12],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    result: dict[str, Any] = {
        "benchmark": "uninterrupted steps of fleet reads (bench/gil_steps.py)",
        "parameters": {k: v for k, v in vars(args).items() if k not in ("mode", "url")},
        "trees": {
            name: {
                "path": str(Path(path).resolve()),
                "commit": subprocess.run(
                    ["git", "rev-parse", "--short", "HEAD"],
                    cwd=path,
                    capture_output=True,
                    text=True,
                ).stdout.strip(),
            }
            for name, path in trees.items()
        },
        "rounds": [],
    }
    if args.url is None:
        with database("postgresql", args.pg, "gs") as url:
            stage("filling the store")
            store = open_store(url)
            clusters = cluster_names(args.clusters)
            fleet = make_fleet(args.pods, args.clusters, seed=args.seed)
            fill_decisions(store, fleet, 1)
            fill_evidence(store, fleet, args.pods // 4)
            store.engine.dispose()
            put_level(url, clusters, "all", set())
            _rounds(args, url, trees, result)
    else:
        _rounds(args, args.url, trees, result)
    return result


def _rounds(
    args: argparse.Namespace, url: str, trees: dict[str, str], result: dict[str, Any]
) -> None:
    names = list(trees)
    for r in range(args.rounds):
        done = {}
        for name in names if r % 2 == 0 else names[::-1]:
            stage(f"round {r + 1}/{args.rounds}: {name}")
            done[name] = measure_in(
                trees[name],
                __file__,
                url,
                *(f"--pods={args.pods}", f"--clusters={args.clusters}"),
                *(f"--reads={args.reads}", f"--seed={args.seed}"),
            )
        result["rounds"].append(done)
        write_json(Path(args.out), result)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode == "measure":
        write_json(Path(args.out), measure(args))
        return 0
    result = run(args)
    write_json(Path(args.out), result)
    for r, done in enumerate(result["rounds"]):
        for name, m in done.items():
            print(f"round {r + 1} {name}: steps over 1/2/5/10 ms {m['over_ms']}, longest")
            for d, where in m["longest"][:5]:
                print(f"    {d:6.2f} ms  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
