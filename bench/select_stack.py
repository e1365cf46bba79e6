"""``POST /v1/select`` through three HTTP stacks of one uvicorn process, same run.

Does the raw ASGI select handler (service/api/select_asgi.py) still earn its place, or
can a FastAPI route answer selects as fast as a bare FastAPI endpoint does? One
``switchboard``-like server (the real app, runtime, limits and guarded protocol, as
``switchboard serve`` builds them) answers, on the same event loop:

- ``raw``: ``POST /v1/select`` as served, by the raw ASGI handler;
- ``fastapi``: the same request through FastAPI's middleware, router and the select
  route (``/bench/fastapi/v1/select``, rewritten to ``/v1/select`` and handed to
  FastAPI as the app hands every other path): what select costs with the raw handler
  removed;
- ``floor``: a bare ``async def`` FastAPI endpoint of the same app that takes the same
  request model and returns a constant JSON (as bench/bare_app.py), and
  ``floor_no_body``: one that does not even read the body.

wrk (Debian package ``wrk``) drives a mix of distinct pods at each in turn
(bench/select_mix.lua), the order rotated every round; beside each run's wall-clock
requests/s and latency the server process's own CPU per request (Linux /proc, read
once the decisions of the run are written: a select's recording is part of its cost),
the steadier figure on a shared machine. The figures that matter are ratios within a
round, and their median over the rounds.

    python bench/select_stack.py [--rounds 3] [--duration 6] [--connections 32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/select_stack.py` from anywhere
    sys.path.insert(0, str(ROOT))

from mla_switchboard.core.schemas import SelectRequest  # noqa: E402

from bench.common import free_port  # noqa: E402
from bench.select_load import TOKEN, cpu_seconds, run_wrk, start  # noqa: E402

PATHS = {
    "raw": "/v1/select",
    "fastapi": "/bench/fastapi/v1/select",
    "floor": "/bench/floor",
    "floor_no_body": "/bench/floor-no-body",
}
FASTAPI_PREFIX = "/bench/fastapi"
CONSTANT = {"backend": "FLASH_ATTN", "source": "priority"}
READING = (
    "On a shared 2-core machine, requests/s swings with the other jobs (a run's ratio "
    "can be 0.4x or 1.5x in the next round); CPU per request is the steady figure, and "
    "on a saturated server the one that sets its throughput (cores / CPU per request). "
    "Compare the rounds' ratios and their median, CPU first."
)


async def floor(body: SelectRequest) -> dict[str, str]:
    """The floor: what FastAPI costs to take the request model and answer a constant."""
    return CONSTANT


async def floor_no_body() -> dict[str, str]:
    return CONSTANT


def serve(port: int) -> None:
    """The server: the app as ``switchboard serve`` runs it, plus the bench's paths."""
    import uvicorn
    from fastapi import FastAPI
    from mla_switchboard.service.api.app import create_app
    from mla_switchboard.service.api.conn_events import ConnectionEvents
    from mla_switchboard.service.api.server import server_options, with_limits
    from mla_switchboard.service.config import Settings
    from mla_switchboard.service.runtime import Runtime
    from starlette.types import Receive, Scope, Send

    settings = Settings()
    runtime = Runtime(settings)
    runtime.prepare_store()
    app = create_app(runtime=runtime)

    app.post("/bench/floor")(floor)
    app.post("/bench/floor-no-body")(floor_no_body)
    # matched right after /v1/select (the app's first route): no variant pays for
    # trying the app's other routes
    routes = app.router.routes
    routes[1:1] = [routes.pop(), routes.pop()]

    async def variants(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith(FASTAPI_PREFIX):
            # as the app serves any path but the raw handler's (SwitchboardAPI.__call__)
            scope = {**scope, "path": path[len(FASTAPI_PREFIX) :], "raw_path": b""}
            assert app.edge is not None and app.store_deadline is not None
            with app.store_deadline.serving(scope["method"]):
                await FastAPI.__call__(app, scope, receive, app.edge.wrap(scope, send))
            return
        await app(scope, receive, send)

    events = ConnectionEvents(runtime.metrics)
    uvicorn.run(
        with_limits(variants, settings, events),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        **server_options(settings, events),
    )


def settle(url: str, most_s: float = 20.0) -> None:
    """Wait until the server's decision writer has nothing buffered, so that the CPU of
    writing a run's decisions is counted to that run (not to the next one)."""
    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline:
        text = httpx.get(f"{url}/metrics", timeout=5).text
        if any(line == "switchboard_decisions_buffered 0.0" for line in text.splitlines()):
            return
        time.sleep(0.1)


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return {
        "rps": round(med("rps"), 1),
        "p50_ms": med("p50_us") / 1000,
        "p99_ms": med("p99_us") / 1000,
        "cpu_us_per_request": round(med("cpu_us_per_request"), 1),
        "non2xx": sum(int(r["non2xx"]) for r in runs),
        "socket_errors": sum(int(r["socket_errors"]) for r in runs),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sb-stack-"))
    port = free_port()
    env = {
        **os.environ,
        "SWITCHBOARD_DATABASE_URL": f"sqlite:///{tmp / 'bench.db'}",
        "SWITCHBOARD_ADMIN_TOKEN": TOKEN,
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", str(port)]
    server = start(cmd, env, f"http://127.0.0.1:{port}/readyz")
    url = f"http://127.0.0.1:{port}"
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in PATHS}
    ratios: list[dict[str, float]] = []
    try:
        for path in PATHS.values():  # warm-up, not counted
            os.environ["SELECT_PATH"] = path
            run_wrk(url, 2, args.connections)
        names = list(PATHS)
        for i in range(args.rounds):
            order = names[i % len(names) :] + names[: i % len(names)]
            got: dict[str, dict[str, float]] = {}
            for name in order:
                os.environ["SELECT_PATH"] = PATHS[name]
                cpu0 = cpu_seconds(server.pid)
                r = run_wrk(url, args.duration, args.connections)
                settle(url)  # the decisions it made written: their CPU counted to it
                r["wall_s"] = r["duration_us"] / 1e6
                r["cpu_s"] = cpu_seconds(server.pid) - cpu0
                r["cpu_us_per_request"] = r["cpu_s"] / r["requests"] * 1e6
                r["load_average_1m"] = os.getloadavg()[0]
                runs[name].append(r)
                got[name] = r
                print(
                    f"round {i + 1}/{args.rounds} {name:14s} {r['rps']:8.0f} req/s  "
                    f"p50 {r['p50_us'] / 1000:6.2f} ms  p99 {r['p99_us'] / 1000:6.2f} ms  "
                    f"cpu/req {r['cpu_us_per_request']:5.0f} us  non-2xx {r['non2xx']}  "
                    f"load {r['load_average_1m']:.1f}",
                    flush=True,
                )
            ratios.append(
                {
                    f"{a}_vs_{b}_{kind}": (
                        got[a]["rps"] / got[b]["rps"]
                        if kind == "rps"
                        else got[b]["cpu_us_per_request"] / got[a]["cpu_us_per_request"]
                    )
                    for a in ("raw", "fastapi")
                    for b in ("floor", "floor_no_body")
                    for kind in ("rps", "cpu")
                }
                | {"fastapi_vs_raw_rps": got["fastapi"]["rps"] / got["raw"]["rps"]}
            )
    finally:
        server.terminate()
        server.wait(60)
    keys = ratios[0].keys()
    return {
        "runs": runs,
        "ratios_per_round": ratios,
        "ratios_median": {k: round(statistics.median(r[k] for r in ratios), 3) for k in keys},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=6, help="seconds per run")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--machine", default="2-core CI-class VM, shared with other jobs")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "select_stack.json"))
    ap.add_argument("--append", action="store_true", help="keep the sessions already in --out")
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return 0
    if shutil.which("wrk") is None:
        print("bench: needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    measured = measure(args)
    import fastapi
    import uvicorn

    session = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{args.machine} ({platform.machine()}, {os.cpu_count()} cores)",
        "server": f"uvicorn {uvicorn.__version__}, fastapi {fastapi.__version__}",
        "load": f"wrk -t1 -c{args.connections}, {args.duration} s per run, {args.rounds} "
        "rounds (order rotated), 10,000 distinct pods (bench/select_mix.lua)",
        "paths": PATHS,
        "load_average_1m": sorted(
            {round(r["load_average_1m"], 1) for v in measured["runs"].values() for r in v}
        ),
        "median": {name: summary(runs) for name, runs in measured["runs"].items()},
        "ratios_median": measured["ratios_median"],
        "ratios_per_round": measured["ratios_per_round"],
        "runs": measured["runs"],
    }
    print(json.dumps({k: session[k] for k in ("median", "ratios_median")}, indent=2))
    out = Path(args.out)
    earlier = json.loads(out.read_text())["sessions"] if args.append and out.exists() else []
    result = {
        "benchmark": "POST /v1/select: raw ASGI handler vs FastAPI route vs bare FastAPI "
        "endpoint (floor), one uvicorn process, same run",
        "reading": READING,
        "sessions": [*earlier, session],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
