"""Two checkouts of the project measured in one run: the figures a redesign must keep.

A refactor that "keeps behaviour" is only believable when the guarantees are measured
again, on the same machine at the same time as the code before it: the 2 shared cores
here move any single figure by tens of percent from one minute to the next. This runs,
for a BEFORE and an AFTER checkout (each with its own ``.venv``), alternating which goes
first so the machine's drift hits both alike:

- ``bench/select_load.py``: ``POST /v1/select`` against a bare async FastAPI endpoint
  (requests/s and p99 ratios, same rounds);
- the slow-body test (1,100 slow clients at 1,024 descriptors, selects still answered);
- kill -9 during a database outage and during a database freeze (what each loses);
- ``bench/scale.py`` at one fleet size (summary, dashboard, preview, admin write, select
  p99 idle and under load, RSS);
- with ``--axes``, the scale bench's other axes: ``overrides`` (clusters x overrides,
  bench/scale_overrides.py) and ``evidence`` (stored reports and one busy situation,
  bench/scale_evidence.py), each with the arguments of ``--overrides-args`` /
  ``--evidence-args``.

Each tool and test is run from its own checkout, as that checkout ships it, except the
overrides and evidence axes: a checkout from before they existed has no such modules, so
*this* checkout's ``bench/scale.py --axis ...`` is run by each checkout's own python
(``TREE/.venv/bin/python THIS/bench/scale.py``, in TREE): the service it starts, the
store API it fills with and the migrations are that checkout's (the bench finds them
through the interpreter's editable install, ``bench/scale_support.py``), the bench code
is the same for both.

    python bench/side_by_side.py --before ../wt-before --after . [--scale-sizes 100000]
    python bench/side_by_side.py --before ../wt-before --axes overrides,evidence \
        --skip load,tests --overrides-args="--pods 100000" \
        --out bench/results/side_by_side_scale.json

Writes ``bench/results/side_by_side.json`` (or ``--out``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

TIMING_TESTS = {
    "slow_body": (
        "tests/security/test_connection_limits.py::test_slow_body_clients_do_not_starve_selects"
    ),
    "kill9_outage": (
        "tests/reliability/test_outage.py::test_kill9_during_an_outage_loses_only_the_last_100ms"
    ),
    "kill9_freeze": (
        "tests/reliability/test_outage.py::"
        "test_kill9_while_the_database_hangs_loses_only_the_last_200ms"
    ),
}
SCALE_OPERATIONS = (
    "summary",
    "dashboard",
    "preview_cluster",
    "preview_fleet",
    "admin_put",
    "admin_delete",
)


def python_of(tree: Path) -> str:
    """The checkout's own environment: ``.venv``, else the one ``.ci/run`` made."""
    for venv in (".venv", ".ci/.venv"):
        py = tree / venv / "bin" / "python"
        if py.exists():
            return str(py)
    sys.exit(f"{tree}: no .venv (python3 -m venv .venv && .venv/bin/pip install -e '.[test]')")


def commit_of(tree: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True
    ).stdout.strip()


def select_load(tree: Path, rounds: int, duration: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [
            python_of(tree),
            "bench/select_load.py",
            f"--rounds={rounds}",
            f"--duration={duration}",
            f"--out={out.name}",
        ]
        subprocess.run(cmd, cwd=tree, check=True, capture_output=True)
        r = json.loads(Path(out.name).read_text())
    keep = ("rps", "p99_ms", "cpu_us_per_request")
    return {
        "switchboard": {k: r["switchboard"][k] for k in keep},
        "bare": {k: r["bare"][k] for k in keep},
        "ratio_rps": r["ratio_rps"],
        "ratio_p99": r["ratio_p99"],
        "all_decisions_stored": r.get("all_decisions_stored"),
    }


def timing_test(tree: Path, test_id: str) -> dict[str, Any]:
    """One timing test, run alone from ``tree``: whether it passed, how long it took and
    the figures it prints (the kill -9 tests print what was lost)."""
    start = time.monotonic()
    proc = subprocess.run(
        [
            python_of(tree),
            "-m",
            "pytest",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "-q",
            "-s",
            test_id,
        ],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    printed = [
        line.strip()
        for line in proc.stdout.splitlines()
        if re.search(r"\d", line) and not re.match(r"^[.sFE]+\s*(\[|$)", line.strip())
    ]
    return {
        "passed": proc.returncode == 0,
        "seconds": round(time.monotonic() - start, 1),
        "printed": printed[-8:],
    }


def scale(tree: Path, sizes: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [python_of(tree), "bench/scale.py", f"--sizes={sizes}", "--repeat=3"]
        cmd += ["--load-rounds=1", "--load-seconds=6", "--skip-hot", f"--out={out.name}"]
        subprocess.run(cmd, cwd=tree, check=True, capture_output=True)
        r = json.loads(Path(out.name).read_text())
    found: dict[str, Any] = {}
    for size, s in r["sizes"].items():
        ops = s.get("operations", {})
        found[size] = {
            "ops_median_s": {k: ops[k]["median_s"] for k in SCALE_OPERATIONS if k in ops},
            "select_p99_ms": {k: v.get("p99_ms") for k, v in s.get("load", {}).items()},
            "rss_start_mib": s.get("rss_start", {}).get("VmRSS"),
            "start_s": s.get("start_s"),
        }
    return found


AXES = ("pods", "overrides", "evidence")


def scale_axis(tree: Path, axis: str, extra: list[str]) -> dict[str, Any]:
    """This checkout's ``bench/scale.py --axis AXIS`` run by ``tree``'s python, in
    ``tree`` (module docstring); its progress goes to stderr as it runs. The figures it
    wrote, less the per-round detail of its load runs."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [python_of(tree), str(ROOT / "bench" / "scale.py"), f"--axis={axis}", *extra]
        cmd.append(f"--out={out.name}")
        print("  " + shlex.join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, cwd=tree, check=True, stdout=sys.stderr)
        r = json.loads(Path(out.name).read_text())
    return _trim(r)


def merged_table(before: str, after: str) -> str:
    """Two runs' Markdown tables of the same shape as one, each cell "before -> after"
    (the tables one after the other when their shapes differ)."""
    b_lines, a_lines = before.splitlines(), after.splitlines()
    if len(b_lines) != len(a_lines):
        return f"before:\n{before}\n\nafter:\n{after}"
    out = []
    for b, a in zip(b_lines, a_lines, strict=True):
        b_cells, a_cells = b.split("|"), a.split("|")
        if (
            b == a
            or len(b_cells) != len(a_cells)
            or set(b) <= set("|-")
            or b_cells[1] != a_cells[1]
        ):
            out.append(b if b == a or len(b_cells) != len(a_cells) else a)
            continue
        cells = [b_cells[1]] + [
            x if x.strip() == y.strip() else f" {x.strip()} -> {y.strip()} "
            for x, y in zip(b_cells[2:-1], a_cells[2:-1], strict=True)
        ]
        out.append("|" + "|".join(cells) + "|")
    return "\n".join(out)


def _trim(value: Any) -> Any:
    """``value`` without the bulky per-round lists (``rounds``, ``bursts``)."""
    if isinstance(value, dict):
        return {k: _trim(v) for k, v in value.items() if k not in ("rounds", "bursts")}
    if isinstance(value, list):
        return [_trim(v) for v in value]
    return value


def alternate(
    before: Path, after: Path, times: int, measure: Callable[[Path], Any]
) -> dict[str, list[Any]]:
    """``measure`` on both trees ``times`` times, the first tree alternating."""
    runs: dict[str, list[Any]] = {"before": [], "after": []}
    for i in range(times):
        order = [("before", before), ("after", after)]
        for name, tree in order if i % 2 == 0 else reversed(order):
            print(f"  {name} ({tree.name}) run {i + 1}", file=sys.stderr, flush=True)
            runs[name].append(measure(tree))
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="checkout of the code before")
    ap.add_argument("--after", type=Path, default=ROOT, help="checkout of the code after")
    ap.add_argument("--load-repeats", type=int, default=2, help="select_load runs per tree")
    ap.add_argument("--load-rounds", type=int, default=3, help="rounds per select_load run")
    ap.add_argument("--load-duration", type=int, default=6, help="seconds per round")
    ap.add_argument("--test-repeats", type=int, default=1, help="runs of each timing test")
    ap.add_argument("--scale-sizes", default="10000", help="bench/scale.py --sizes ('' skips)")
    ap.add_argument(
        "--axes",
        default="pods",
        help=f"scale axes, comma-separated, of {', '.join(AXES)} (default pods: --scale-sizes)",
    )
    ap.add_argument(
        "--overrides-args",
        default="",
        help="arguments for bench/scale.py --axis overrides, with '=': --overrides-args='--quick'",
    )
    ap.add_argument(
        "--evidence-args",
        default="",
        help="arguments for bench/scale.py --axis evidence, with '=': --evidence-args='--quick'",
    )
    ap.add_argument("--skip", default="", help="comma-separated: load, tests, scale")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/side_by_side.json")
    args = ap.parse_args()
    before, after = args.before.resolve(), args.after.resolve()
    skip = set(filter(None, args.skip.split(",")))
    axes = [a.strip() for a in args.axes.split(",") if a.strip()]
    if set(axes) - set(AXES):
        ap.error(f"--axes: unknown {sorted(set(axes) - set(AXES))}; choose from {AXES}")
    result: dict[str, Any] = {
        "benchmark": "the same guarantees measured on two checkouts, alternating, one run",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"vm {platform.machine()} {os.cpu_count()} cores (shared)",
        "before": commit_of(before),
        "after": commit_of(after),
    }
    if "load" not in skip:
        print("select_load", file=sys.stderr)
        result["select_load"] = alternate(
            before,
            after,
            args.load_repeats,
            lambda t: select_load(t, args.load_rounds, args.load_duration),
        )
    if "tests" not in skip:
        for name, test_id in TIMING_TESTS.items():
            print(name, file=sys.stderr)
            result[name] = alternate(
                before, after, args.test_repeats, lambda t, i=test_id: timing_test(t, i)
            )
    if "pods" in axes and args.scale_sizes and "scale" not in skip:
        print(f"scale {args.scale_sizes}", file=sys.stderr)
        result["scale"] = alternate(before, after, 1, lambda t: scale(t, args.scale_sizes))
    for axis in (a for a in axes if a != "pods"):
        extra = shlex.split(getattr(args, f"{axis}_args"))
        print(f"scale, axis {axis} {shlex.join(extra)}", file=sys.stderr)
        runs = alternate(before, after, 1, lambda t, a=axis, x=extra: scale_axis(t, a, x))
        result[f"scale_{axis}"] = runs
        text = merged_table(runs["before"][0]["table"], runs["after"][0]["table"])
        result[f"scale_{axis}_table"] = text
        print(f"\nscale, axis {axis}: before -> after\n{text}\n", file=sys.stderr, flush=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")  # a long run keeps it
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
