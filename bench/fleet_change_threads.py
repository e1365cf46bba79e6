"""A fleet-wide change's reads in the fleet-read thread's own CPU, side by side for
checkouts, alternating: what bench/fleet_change.py measures, without HTTP and with a
figure that the shared machine's other load moves less than process CPU.

Each checkout (``--trees NAME=PATH``, each with its own ``.venv``) runs this file's
``measure`` mode on the store at ``--url`` (one bench/fleet_change.py filled, e.g.
with its overrides at ``all``): a runtime in that process, then ``--trials`` times a
fresh set of fleet reads (what a replica that just started holds) answering the
bench's sequence: the summary, then ``--rounds`` rounds of a ``*`` dry run (a deny of
FLASHINFER, a note and expiry of its own), the ``PUT`` (its preview with another note;
then the inputs in force are the change as written, with a revision of its own), the
summary after it, the ``DELETE`` (its preview), and the summary after that. The first
round's change is one those reads never saw (``first_round``); the later rounds
repeat its content with other notes and expiries (``repeated``). Each figure is
``time.thread_time`` of the fleet-read thread around the read; minimum and median
over trials, with the read's wall time in that thread beside it (``wall_*``). The
checkouts alternate (base, new, then new, base, ...) ``--rounds-of`` times, so that
the machine's load falls on both alike.

    python bench/fleet_change_threads.py --url 'postgresql+psycopg://...' \\
        --trees base=/work/base,new=.

Writes ``--out`` (JSON) and prints each checkout's medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scale import machine  # noqa: E402
from bench.scale_support import measure_in, stage, write_json  # noqa: E402


def commit_of(path: str) -> str:
    """The short commit the checkout at ``path`` is at (a figure names its code)."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True, text=True
    )
    return done.stdout.strip()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("mode", nargs="?", default="run", choices=["run", "measure"])
    ap.add_argument("--url", required=True, help="a filled store (bench/fleet_change.py)")
    ap.add_argument("--trees", default=f"new={ROOT}", help="NAME=PATH,... (each has .venv)")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rounds-of", type=int, default=2, help="alternations of the trees")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fleet_change_threads.json"))
    return ap.parse_args(argv)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """This checkout's reads on ``args.url``, in the fleet-read thread's CPU."""
    from mla_switchboard.core import rollouts
    from mla_switchboard.core.schemas import Override, OverrideSpec
    from mla_switchboard.service.config import Settings
    from mla_switchboard.service.fleet.reads import FleetReads, Proposal
    from mla_switchboard.service.runtime import Runtime

    runtime = Runtime(Settings(database_url=args.url, admin_token="x" * 32))
    runtime.start()
    try:
        base = runtime.publisher.current()
        fleet = runtime.fleet.current()
        cpu: dict[str, list[float]] = defaultdict(list)
        wall: dict[str, list[float]] = defaultdict(list)

        def change(note: str, hours: int) -> Override:
            now = datetime.now(UTC)
            spec = OverrideSpec.model_validate(
                {
                    "deny": ["FLASHINFER"],
                    "note": note,
                    "expires_at": (now + timedelta(hours=hours)).isoformat(),
                }
            )
            stored = rollouts.stored_payload("*", spec, now)
            return Override.model_validate(
                {**stored, "cluster": "*", "created_at": now, "created_by": "b", "revision": 0}
            )

        for t in range(args.trials):
            reads = FleetReads(
                runtime.fleet,
                runtime.recorder,
                runtime.trusted,
                lambda: base,
                runtime.reads.settings,
                runtime.collector,  # paused during a read, as the replica's are
            )
            inputs = replace(base, tag=(10_000 * (t + 1), base.tag[1]))
            first = partial(_summary, reads, ("s",), inputs, fleet)
            _timed((cpu, wall), reads, "first_summary", first)
            for r in range(args.rounds):
                kind = "first_round" if r == 0 else "repeated"
                dry = Proposal(override_scope="*", override=change(f"dry {t} {r}", 2 + r))
                put = Proposal(override_scope="*", override=change(f"put {t} {r}", 2 + r))
                assert put.override is not None
                written = put.override.model_copy(update={"revision": 100 + r})
                after = replace(
                    Proposal(override_scope="*", override=written).applied_to(inputs),
                    tag=(inputs.tag[0] + 1, inputs.tag[1]),
                )
                back = Proposal(override_scope="*", override=None)
                steps = (
                    ("dry_run", partial(reads._preview, dry, inputs, fleet)),
                    ("put", partial(reads._preview, put, inputs, fleet)),
                    ("summary_after_put", partial(_summary, reads, ("a", r), after, fleet)),
                    ("delete", partial(reads._preview, back, after, fleet)),
                )
                for name, step in steps:
                    _timed((cpu, wall), reads, f"{kind}.{name}", step)
                inputs = replace(inputs, tag=(inputs.tag[0] + 2, inputs.tag[1]))
                step = partial(_summary, reads, ("d", r), inputs, fleet)
                _timed((cpu, wall), reads, f"{kind}.summary_after_delete", step)
            reads.close()
        return {
            name: {
                "min_s": round(min(v), 4),
                "median_s": round(statistics.median(v), 4),
                "runs_s": [round(x, 4) for x in v],
                "wall_median_s": round(statistics.median(wall[name]), 4),
                "wall_runs_s": [round(x, 4) for x in wall[name]],
            }
            for name, v in cpu.items()
        }
    finally:
        runtime.stop()


def _summary(reads: Any, key: tuple[Any, ...], inputs: Any, fleet: Any, now: datetime) -> object:
    """The whole fleet's summary (no caller's scope) as ``reads`` works it out."""
    return reads._summary(key, inputs, fleet, now, None)


def _timed(
    into: tuple[dict[str, list[float]], dict[str, list[float]]],
    reads: Any,
    name: str,
    read: Callable[..., object],
) -> None:
    """``read(now)`` on the fleet-read thread of ``reads``: its thread CPU added to
    ``into[0][name]``, its wall time there (the yields to the event loop included) to
    ``into[1][name]``."""
    took: list[tuple[float, float]] = []

    def run() -> None:
        t0, w0 = time.thread_time(), time.perf_counter()
        read(datetime.now(UTC))
        took.append((time.thread_time() - t0, time.perf_counter() - w0))

    reads._serially(run)
    into[0][name].append(took[0][0])
    into[1][name].append(took[0][1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    names = list(trees)
    result: dict[str, Any] = {
        "benchmark": "fleet-wide change, fleet-read thread CPU (bench/fleet_change_threads.py)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "trees": {name: {"path": path, "commit": commit_of(path)} for name, path in trees.items()},
        "parameters": {k: v for k, v in vars(args).items() if k not in ("url", "mode")},
        "rounds": [],
    }
    passed = ["--trials", str(args.trials), "--rounds", str(args.rounds)]
    for r in range(args.rounds_of):
        done = {}
        for name in names if r % 2 == 0 else names[::-1]:
            stage(f"round {r + 1}/{args.rounds_of}: {name}")
            done[name] = measure_in(trees[name], __file__, args.url, *passed)
        result["rounds"].append(done)
        write_json(Path(args.out), result)
    figures = result["rounds"][0][names[0]]
    result["medians"] = {
        name: {
            f: round(
                statistics.median(x for rd in result["rounds"] for x in rd[name][f]["runs_s"]), 4
            )
            for f in figures
        }
        for name in names
    }
    result["wall_medians"] = {
        name: {
            f: round(
                statistics.median(
                    x for rd in result["rounds"] for x in rd[name][f].get("wall_runs_s", [])
                ),
                4,
            )
            for f in figures
        }
        for name in names
    }
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode == "measure":
        Path(args.out).write_text(json.dumps(measure(args)))
        return 0
    result = run(args)
    write_json(Path(args.out), result)
    for name, figures in result["medians"].items():
        print(name, json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
