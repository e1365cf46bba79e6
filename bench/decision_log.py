"""What the decision log costs a select: the select path with the log on and off.

One process, one ``Runtime`` per mode on an SQLite file of its own, started as the
service starts it (its log thread and drainer running beside the loop). Each round
runs both modes back to back, in alternating order, so that the shared machine's
noise hits both alike: ``Decider.decide`` for distinct pods (half of them of a new
shape, so half miss the selector's cache) for ``--duration`` seconds, then a flush.
Reported per mode: selects a second of wall time, and per second of the process's
CPU time until every one of them is stored (the log thread's encoding and syncs and
the drainer's writes included), their medians over the rounds and the ratios on / off.
On a shared machine the wall figure follows the machine's load; the CPU figure is
the steadier one.

    python bench/decision_log.py [--rounds 5] [--duration 4]

Writes bench/results/decision_log.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mla_switchboard.core.schemas import SelectRequest  # noqa: E402
from mla_switchboard.service.config import Settings  # noqa: E402
from mla_switchboard.service.runtime import Runtime  # noqa: E402

from tests.reliability.conftest import select_body  # noqa: E402

REQUESTS = 40_000  # distinct pods a round cycles through (a pod may decide again)


def requests(n: int, tag: str) -> list[SelectRequest]:
    out = []
    for i in range(n):
        body = select_body(f"bench-{tag}", f"pod-{i}")
        body["model"]["num_heads"] = 128 if i % 2 else 16 + (i // 2) % 97  # half: other shapes
        out.append(SelectRequest.model_validate(body))
    return out


def one_round(log_on: bool, duration_s: float, reqs: list[SelectRequest]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="sb-log-") as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'sb.db'}",
            spill_path=str(Path(tmp) / "spill.jsonl"),
            journal=log_on,
        )
        runtime = Runtime(settings)
        runtime.start()
        try:
            decide = runtime.decider.decide
            n = 0
            wall0, cpu0 = time.monotonic(), time.process_time()
            deadline = wall0 + duration_s
            while time.monotonic() < deadline:
                start = n % REQUESTS
                for r in reqs[start : start + 200]:
                    decide(r)
                n += 200
            wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
            flushed = runtime.recorder.flush(60)
            # every decision stored (and logged): the drainer's and log's work for them
            cpu_all = time.process_time() - cpu0
            stored = runtime.store.decisions.count_decisions()
        finally:
            runtime.stop()
    return {
        "selects": n,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "cpu_until_stored_s": round(cpu_all, 3),
        "selects_per_s": round(n / wall),
        "selects_per_cpu_s": round(n / cpu_all),
        "all_stored": flushed and stored == n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--out", default=str(ROOT / "bench/results/decision_log.json"))
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"log_on": [], "log_off": []}
    reqs = requests(REQUESTS, "round")  # each round has a database of its own
    for i in range(args.rounds):
        order = [True, False] if i % 2 == 0 else [False, True]
        for on in order:
            got = one_round(on, args.duration, reqs)
            runs["log_on" if on else "log_off"].append(got)
            print(("on " if on else "off"), got, flush=True)

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    summary = {
        mode: {
            "selects_per_s_median": median(mode, "selects_per_s"),
            "selects_per_cpu_s_median": median(mode, "selects_per_cpu_s"),
        }
        for mode in runs
    }
    ratios = [
        on["selects_per_s"] / off["selects_per_s"]
        for on, off in zip(runs["log_on"], runs["log_off"], strict=True)
    ]
    cpu_ratios = [
        on["selects_per_cpu_s"] / off["selects_per_cpu_s"]
        for on, off in zip(runs["log_on"], runs["log_off"], strict=True)
    ]
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), load average "
        f"{os.getloadavg()[0]:.1f} at the end",
        "what": "Decider.decide in-process for distinct pods (half new shapes), the "
        "runtime's log thread and drainer running; SQLite file",
        "duration_s": args.duration,
        "summary": summary,
        "ratio_on_off_wall_median": round(statistics.median(ratios), 3),
        "ratio_on_off_cpu_median": round(statistics.median(cpu_ratios), 3),
        "ratio_on_off_wall_per_round": [round(r, 3) for r in ratios],
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("summary", "ratio_on_off_wall_median")}, indent=1))


if __name__ == "__main__":
    main()
