"""The agent's end-to-end time to a decision, as a booting pod sees it.

Not a test: it prints figures and writes ``bench/results/agent_latency.json``. It
starts a real ``switchboard serve`` on loopback (temporary SQLite) and measures:

* in process (``select_backend(..., build=False)``, what a serving process pays):
  a live service with a cold cache (HTTP 200, cache written), a live service with a
  warm cache (``If-None-Match`` revalidation, HTTP 304), no service configured with a
  warm cache, and the service down (connection refused) with and without a cache,
  where the agent retries until the deadline and then fails static;
* as a command (``switchboard select`` in a fresh Python process, what an init
  container pays): a dry run pretending an H200 (no torch import; a dry run asks the
  service and never uses the cache), and a warm cache with the live service on the
  real probe (torch imported to ask for the device).

    python bench/agent_latency.py [--iterations 50] [--down-deadline 2.0]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/agent_latency.py` from anywhere
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from mla_switchboard.agent import select_backend  # noqa: E402

from bench.common import free_port  # noqa: E402

TOKEN = "bench-agent-token"
MODEL = ROOT / "tests" / "agent" / "configs" / "deepseek-v3.json"
H200 = {"cluster": "bench", "packages": "any"}
"""A pod on an H200 (the probe is shown one in :func:`_on_an_h200`): not a dry run,
since a dry run (``capability``/``device_name``) neither reads nor writes the cache."""


def _on_an_h200() -> None:
    """Make the in-process probe see an H200, at the hardware boundary (as the agent
    tests' ``gpu`` fixture does): this machine may have no GPU."""
    from mla_switchboard.agent import pod as agent_pod
    from mla_switchboard.agent.probe import DeviceProbe

    agent_pod.probe_device = lambda: DeviceProbe("NVIDIA H200", (9, 0), "nvml")  # type: ignore[assignment]


def start_service(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "SWITCHBOARD_DATABASE_URL": f"sqlite:///{directory / 'switchboard.db'}",
        "SWITCHBOARD_ADMIN_TOKEN": TOKEN,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "mla_switchboard.service.cli", "serve", "--port", str(port),
         "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the service did not start")


def summarise(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p95_ms": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 2),
        "max_ms": round(ms[-1], 2),
    }


def timed(fn: Callable[[int], Any], iterations: int, expect: str) -> dict[str, Any]:
    samples = []
    for i in range(iterations):
        started = time.perf_counter()
        result = fn(i)
        samples.append(time.perf_counter() - started)
        source = result if isinstance(result, str) else result.source
        if source != expect:
            raise RuntimeError(f"expected source {expect}, got {source}")
    return {**summarise(samples), "source": expect}


def cli(url: str, cache_dir: Path, *extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "mla_switchboard.cli",
         "select", "--model", str(MODEL), "--cluster", "bench", "--url", url,
         "--cache-dir", str(cache_dir), "--format", "json", *extra],
        cwd=ROOT, env={**os.environ, "SWITCHBOARD_TOKEN": TOKEN},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout)["source"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--cli-iterations", type=int, default=5)
    parser.add_argument("--down-iterations", type=int, default=3)
    parser.add_argument("--down-deadline", type=float, default=2.0)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "agent_latency.json"
    )
    args = parser.parse_args()
    # The service-down rounds warn on every call; the table says it once.
    logging.getLogger("switchboard.agent").setLevel(logging.ERROR)

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        proc, url = start_service(base)
        with socket.socket() as s:  # a port nobody listens on: the service is down
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        warm = base / "warm"
        live = {"urls": [url], "token": TOKEN, "build": False}
        _on_an_h200()
        try:
            select_backend(MODEL, cache_dir=warm, **live, **H200)  # warm up imports + cache
            rows: dict[str, Any] = {}
            rows["live service, cold cache (200)"] = timed(
                lambda i: select_backend(MODEL, cache_dir=base / f"cold{i}", **live, **H200),
                args.iterations, "priority",
            )  # fmt: skip
            rows["live service, warm cache (304)"] = timed(
                lambda i: select_backend(MODEL, cache_dir=warm, **live, **H200),
                args.iterations, "priority",
            )  # fmt: skip
            rows["no service URL, warm cache"] = timed(
                lambda i: select_backend(MODEL, cache_dir=warm, urls=[], build=False, **H200),
                args.iterations, "cache",
            )  # fmt: skip
            down = {"urls": [dead], "build": False, "deadline": args.down_deadline}
            rows[f"service down, warm cache (deadline {args.down_deadline:g}s)"] = timed(
                lambda i: select_backend(MODEL, cache_dir=warm, **down, **H200),
                args.down_iterations, "cache",
            )  # fmt: skip
            rows[f"service down, no cache (deadline {args.down_deadline:g}s)"] = timed(
                lambda i: select_backend(MODEL, cache_dir=base / f"none{i}", **down, **H200),
                args.down_iterations, "local-fallback",
            )  # fmt: skip
            pretend = ["--capability", "9.0", "--device-name", "NVIDIA H200", "--packages", "any"]
            cli(url, warm, *pretend)
            rows["CLI process, dry run (pretend H200: no cache, no torch import)"] = timed(
                lambda i: cli(url, warm, *pretend), args.cli_iterations, "priority"
            )
            cli(url, warm)
            rows["CLI process, warm cache (304), real probe (imports torch)"] = timed(
                lambda i: cli(url, warm), args.cli_iterations, "fallback"
            )
        finally:
            proc.terminate()
            proc.wait(20)

    width = max(len(k) for k in rows)
    print(f"{'scenario':<{width}}  {'n':>3}  {'p50 ms':>8}  {'p95 ms':>8}  {'max ms':>8}  source")
    for name, row in rows.items():
        print(
            f"{name:<{width}}  {row['n']:>3}  {row['p50_ms']:>8.1f}  {row['p95_ms']:>8.1f}  "
            f"{row['max_ms']:>8.1f}  {row['source']}"
        )
    document = {
        "benchmark": "agent end-to-end time to a decision",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "model": MODEL.name,
        "scenarios": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
