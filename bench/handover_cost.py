"""What handing the GIL to the event loop costs a background thread, and what it buys
the loop (``service/priority.py``: ``let_the_loop_in``).

Two measurements, each in this one process, nothing else of the service loaded:

- ``cost``: the same fixed Python work (dictionary reads) on one thread, with a
  ``time.sleep(0)`` every 0.5 ms, every 2 ms, or never; the thread's CPU
  (``time.thread_time``) and wall time, medians of ``--repeat``;
- ``latency``: a thread waiting on a socket (as the event loop does) that another
  process writes to every 2-6 ms, beside a CPU-bound thread that yields every 0.5 ms
  or never (the switch interval then hands the GIL over): from the write to the
  waiting thread's Python code running, p50 / p99 / max; twice more with the yielding
  thread's timer slack at 1 ns (``timer_slack_ns``), where a ``time.sleep(0)`` is
  shorter than the waiting thread's wake-up.

    python bench/handover_cost.py            # ~40 s

Writes ``bench/results/handover_cost.json`` and prints both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scale_support import cpu_model  # noqa: E402

OUT = ROOT / "bench" / "results" / "handover_cost.json"


def work(yield_every: float | None, steps: int = 60_000) -> tuple[float, float, int]:
    """Fixed work with a yield every ``yield_every`` s (None: never): thread CPU, wall,
    yields made."""
    table = {i: i for i in range(5000)}
    x, at, yields = 0, 0.0, 0
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for _ in range(steps):
        for i in range(0, 5000, 50):
            x += table[i]
        if yield_every is not None:
            now = time.monotonic()
            if now >= at:
                time.sleep(0)
                yields += 1
                at = now + yield_every
    return time.thread_time() - cpu0, time.perf_counter() - wall0, yields


def cost(repeat: int) -> dict[str, Any]:
    runs: dict[str, list[tuple[float, float, int]]] = {"never": [], "0.5 ms": [], "2 ms": []}
    every = {"never": None, "0.5 ms": 0.0005, "2 ms": 0.002}
    for _ in range(repeat):  # alternating, so that the machine's load falls on all alike
        for name in runs:
            runs[name].append(work(every[name]))
    out: dict[str, Any] = {
        name: {
            "cpu_s": round(statistics.median(r[0] for r in v), 4),
            "wall_s": round(statistics.median(r[1] for r in v), 4),
            "cpu_runs_s": [round(r[0], 4) for r in v],
            "yields": v[0][2],
        }
        for name, v in runs.items()
    }
    for name in ("0.5 ms", "2 ms"):  # per round, over the run without yields beside it
        ratios = [a[0] / b[0] for a, b in zip(runs[name], runs["never"], strict=True)]
        out[name]["cpu_over_never"] = round(statistics.median(ratios), 3)
    return out


_WRITER = """
import random, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
random.seed(1)
for _ in range(int(sys.argv[2])):
    time.sleep(random.uniform(0.002, 0.006))
    s.sendall(("%.9f\\n" % time.perf_counter()).encode())
s.close()
"""


PR_SET_TIMERSLACK = 29  # prctl(2)


def timer_slack(ns: int) -> int | None:
    """Set the calling thread's timer slack (Linux ``prctl``); the one it had, or None
    where it cannot be read or set."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    had = libc.prctl(30, 0, 0, 0, 0)  # PR_GET_TIMERSLACK
    if had < 0 or libc.prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0) != 0:
        return None
    return int(had)


def latency(
    yields: bool, interval: float, writes: int, slack_ns: int | None = None
) -> dict[str, Any]:
    """The waiting thread's delay per write, beside a CPU-bound thread; ``slack_ns``:
    the CPU-bound thread's timer slack meanwhile (what a ``time.sleep(0)`` sleeps),
    else the kernel's default."""
    was = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(server.getsockname()[1]), str(writes)]
    )
    conn, _ = server.accept()
    late: list[float] = []

    def waiting() -> None:
        poll = select.epoll()
        poll.register(conn.fileno(), select.EPOLLIN)
        buf = b""
        while True:
            if not poll.poll(1.0):
                continue
            data = conn.recv(4096)
            t = time.perf_counter()
            if not data:
                return
            buf += data
            *lines, buf = buf.split(b"\n")
            if lines:
                late.append(t - float(lines[-1]))

    waiter = threading.Thread(target=waiting)
    waiter.start()
    had = timer_slack(slack_ns) if slack_ns is not None else None
    x, at = 0, 0.0
    while waiter.is_alive():  # the CPU-bound thread
        for i in range(200):
            x += i * i
        if yields:
            now = time.monotonic()
            if now >= at:
                time.sleep(0)
                at = now + 0.0005
    writer.wait()
    server.close()
    sys.setswitchinterval(was)
    if had is not None:
        timer_slack(had)
    late.sort()
    return {
        "yields_every_0_5_ms": yields,
        "timer_slack_ns": slack_ns,
        "switch_interval_ms": interval * 1000,
        "n": len(late),
        "p50_us": round(late[len(late) // 2] * 1e6),
        "p99_us": round(late[int(len(late) * 0.99)] * 1e6),
        "max_us": round(late[-1] * 1e6),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--writes", type=int, default=600)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "handing the GIL to the event loop (bench/handover_cost.py)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": (
            f"{cpu_model() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}"
        ),
        "cost": cost(args.repeat),
        "latency": [
            latency(True, 0.001, args.writes),
            latency(False, 0.001, args.writes),
            latency(True, 0.001, args.writes),
            latency(False, 0.001, args.writes),
            # a sleep of 1 ns of slack is short (15 us): does the loop still get in?
            latency(True, 0.001, args.writes, slack_ns=1),
            latency(True, 0.001, args.writes, slack_ns=1),
        ],
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
