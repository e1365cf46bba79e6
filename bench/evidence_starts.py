"""Service starts on a year of stored reports, two checkouts on one fill, in one run.

``bench/scale.py --axis evidence`` fills a store per checkout (at 1,000,000 reports,
3-6 minutes each on the 2-core machine). The rows do not depend on the checkout, so
this fills once (``bench/scale_evidence.py``'s ``fill_reports`` with its default
fleet, kept as the database ``sbe_starts_rN``, reused when present: drop it for a fill
of today, the window being counted back from now) and
gives each checkout a copy of it, on which that checkout's service starts ``--starts``
times (the first start finds no evidence snapshot and leaves one, the next start from
it), as ``bench/scale_evidence.py`` times a start: until ``/readyz``, the process's CPU
by then, its RSS and peak (VmRSS / VmHWM) at ready and 2 s later. Each checkout's own
python runs this checkout's bench code in its own tree (the service, the store API and
the migrations are that checkout's; ``bench/side_by_side.py`` says why).

    python bench/evidence_starts.py --before ../base --reports 100000,1000000

Writes ``bench/results/evidence_starts.json`` (or ``--out``).
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
if str(ROOT) not in sys.path:  # `python bench/evidence_starts.py` from anywhere
    sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "results" / "evidence_starts.json"

from bench.side_by_side import commit_of  # noqa: E402

CHILD = r"""
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bench import scale_evidence as se
from bench.scale_support import Databases

template, reports, starts = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
args = se.parse_args([])
dbs = Databases("postgresql", args.pg)
fill = None
if not dbs.exists(template):
    url = dbs.create(template)
    fill = se.fill_reports(args, url, reports)
url = dbs.clone(template)
out = {"fill": fill, "starts": []}
with tempfile.TemporaryDirectory() as logs:
    for _ in range(starts):
        out["starts"].append(se.one_start(url, Path(logs), args.start_timeout_s))
        print(json.dumps(out["starts"][-1]), file=sys.stderr, flush=True)
dbs.cleanup(keep=frozenset({template}))
print(json.dumps(out))
"""


def run(tree: Path, template: str, reports: int, starts: int) -> dict[str, Any]:
    python = tree / ".venv" / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", CHILD, str(ROOT), template, str(reports), str(starts)],
        cwd=tree,
        stdout=subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="checkout of the code before")
    ap.add_argument("--after", type=Path, default=ROOT, help="checkout of the code after")
    ap.add_argument("--reports", default="100000,1000000", help="stored reports per size")
    ap.add_argument("--starts", type=int, default=2, help="starts per checkout and size")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "service starts on stored reports, two checkouts on one fill, one run",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} shared cores, no GPU",
        "loadavg_start": os.getloadavg(),
        "commits": {"before": commit_of(args.before), "after": commit_of(args.after)},
        "sizes": {},
    }
    for k, reports in enumerate(int(n) for n in args.reports.split(",")):
        template = f"sbe_starts_r{reports}"
        sides = [("before", args.before), ("after", args.after)]
        size: dict[str, Any] = {}
        for side, tree in sides if k % 2 == 0 else sides[::-1]:  # alternating who is first
            print(f"{reports:,} reports, {side}: {tree}", file=sys.stderr, flush=True)
            size[side] = run(tree.resolve(), template, reports, args.starts)
            size[side]["loadavg"] = os.getloadavg()
        result["sizes"][str(reports)] = size
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    result["loadavg_end"] = os.getloadavg()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
