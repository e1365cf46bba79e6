"""Evidence memory by clusters: the same pods' results held over 10 or 1,000 clusters.

In a fresh process per case, ``EvidenceIndex`` objects as a replica keeps them (one for
the whole fleet, one per cluster for the clusters that trust only their own evidence)
are filled with one result per pod and backend (two backends, one situation), and the
Python heap they hold is read with ``tracemalloc`` (allocations, not RSS: the
allocator's slack is another process's noise). With ``--before DIR`` the same runs on
another checkout's code (its own ``.venv``) in the same run.

    python bench/evidence_memory.py [--pods 100000] [--before ../base]

Writes ``bench/results/evidence_memory.json``.
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

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time, tracemalloc
from datetime import UTC, datetime, timedelta
from mla_switchboard.core.evidence import EvidenceIndex, Observation, Situation
pods, clusters = int(sys.argv[1]), int(sys.argv[2])
S = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", "{}", "switchboard")
t0 = datetime(2026, 11, 30, tzinfo=UTC)
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
fleet = EvidenceIndex(per_pod=3)
own = [EvidenceIndex(per_pod=3) for _ in range(clusters)]
started = time.process_time()
for start in range(0, pods, 1000):
    batch = [
        Observation(S, backend, f"pod-{i}", 100.0 + i % 50, ok=True,
                    cluster=f"c{i % clusters}", at=t0 + timedelta(seconds=i), impl="fa3")
        for i in range(start, min(pods, start + 1000))
        for backend in ("FLASHINFER", "FLASH_ATTN")
    ]
    fleet.add(batch)
    by_cluster = {}
    for o in batch:
        by_cluster.setdefault(o.cluster, []).append(o)
    for name, mine in by_cluster.items():
        own[int(name[1:])].add(mine)
cpu = time.process_time() - started
held = tracemalloc.get_traced_memory()[0] - before
print(json.dumps({"pods": pods, "clusters": clusters, "heap_mib": round(held / 2**20, 1),
                  "fill_cpu_s": round(cpu, 2)}))
"""


def run(python: str, cwd: Path, pods: int, clusters: int) -> dict[str, object]:
    out = subprocess.run(
        [python, "-c", CHILD, str(pods), str(clusters)],
        cwd=cwd, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=100_000)
    ap.add_argument("--clusters", default="10,1000")
    ap.add_argument("--before", type=Path, help="a checkout of older code with its .venv")
    ap.add_argument("--out", default=str(ROOT / "bench/results/evidence_memory.json"))
    args = ap.parse_args()
    versions = {"now": (sys.executable, ROOT)}
    if args.before:
        before = args.before.resolve()
        versions["before"] = (str(before / ".venv/bin/python"), before)
    result: dict[str, object] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({os.cpu_count()} cores, shared, no GPU)",
        "what": "EvidenceIndex heap (tracemalloc) for one result per pod and backend, "
        "2 backends, 1 situation; a fleet index plus one per cluster",
    }
    for name, (python, cwd) in versions.items():
        result[name] = [run(python, cwd, args.pods, int(n)) for n in args.clusters.split(",")]
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
