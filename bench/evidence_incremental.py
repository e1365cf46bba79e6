"""Evidence start and reload, in process, side by side with another checkout in one run.

Not a test: it prints figures and writes ``bench/results/evidence_incremental.json``.
On a PostgreSQL store already filled (``--url``; e.g. ``bench/scale_evidence.py``'s
one-situation fill kept with ``--keep-fill``, or its ``fill_hot``), each checkout's own
python runs, in a fresh process each:

* ``start``: a ``Runtime``'s first evidence load (``evidence_sync.full_reload()``), with
  no snapshot in the store (the whole window read) and, where the checkout keeps them,
  with the snapshot the run before made (``start_from_snapshot``);
* ``reload``: two reloads after that start (``evidence_sync.reload()``: a rebuild of
  every index in the older code, in place in the newer).

Each figure is the process's CPU (``resource.getrusage``) beside wall time, and its
RSS and peak RSS (VmRSS / VmHWM) after the step.

    python bench/evidence_incremental.py --before ../base --url postgresql+psycopg://...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/evidence_incremental.py` from anywhere
    sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "results" / "evidence_incremental.json"

from bench.side_by_side import commit_of  # noqa: E402

CHILD = r"""
import json, resource, sys, time
from mla_switchboard.service.config import Settings
from mla_switchboard.service.runtime import Runtime

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def rss():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            out[line.split(":")[0]] = round(int(line.split()[1]) / 1024, 1)
    return out

def step(name, fn, out):
    c0, t0 = cpu(), time.perf_counter()
    fn()
    wall, used = time.perf_counter() - t0, cpu() - c0
    out[name] = {"wall_s": round(wall, 2), "cpu_s": round(used, 2), **rss()}
    note = getattr(sync, "last_load", None)
    if note is not None:
        out[name]["load"] = dict(vars(note))

mode, url = sys.argv[1], sys.argv[2]
rt = Runtime(Settings(database_url=url))
try:
    rt.prepare_store()
except Exception as exc:  # an older checkout on a store a newer one migrated further
    print(f"store left as it is: {type(exc).__name__}", file=sys.stderr)
sync = rt.evidence_sync
out = {"before_load": rss()}
if mode == "clean" and getattr(rt.store, "snapshots", None) is not None:
    from sqlalchemy import inspect, text
    with rt.engine.begin() as conn:
        conn.execute(text("DELETE FROM evidence_snapshots"))
        if inspect(conn).has_table("evidence_snapshot_parts"):
            conn.execute(text("DELETE FROM evidence_snapshot_parts"))
step("start", sync.full_reload, out)
if mode == "clean" and hasattr(sync, "save_snapshot"):
    step("save_snapshot", sync.save_snapshot, out)
step("reload_1", sync.reload, out)
step("reload_2", sync.reload, out)
print(json.dumps(out))
"""


def run(tree: Path, mode: str, url: str) -> dict[str, Any]:
    python = tree / ".venv" / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", CHILD, mode, url], cwd=tree, capture_output=True, text=True
    )
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="checkout of the code before")
    ap.add_argument("--after", type=Path, default=ROOT, help="checkout of the code after")
    ap.add_argument("--url", required=True, help="a filled PostgreSQL store (SQLAlchemy URL)")
    ap.add_argument("--label", default="", help="what the store holds, for the record")
    ap.add_argument(
        "--snapshot-starts-of",
        choices=("after", "both"),
        default="after",
        help="whose start from its own snapshot is run too (both: when the code before "
        "keeps snapshots as well)",
    )
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "evidence start and reload in process, side by side, one run",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} shared cores, no GPU",
        "loadavg_start": os.getloadavg(),
        "store": args.label,
    }
    for side, tree in (("before", args.before.resolve()), ("after", args.after.resolve())):
        print(f"{side}: {tree}", file=sys.stderr, flush=True)
        result[side] = {"commit": commit_of(tree), "clean": run(tree, "clean", args.url)}
        print(json.dumps(result[side]["clean"]), file=sys.stderr, flush=True)
        if args.snapshot_starts_of in (side, "both"):  # from the snapshot it just left
            result[side]["start_from_snapshot"] = run(tree, "snapshot", args.url)
            print(json.dumps(result[side]["start_from_snapshot"]), file=sys.stderr, flush=True)
    result["loadavg_end"] = os.getloadavg()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
