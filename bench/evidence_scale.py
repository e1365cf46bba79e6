"""What evidence costs as its history grows: the index, the service's reads, memory.

Not a test: it prints figures and writes ``bench/results/evidence_scale.json``. In one
run, for 16,000 / 32,000 / 64,000 results in **one situation** (2,000 pods of one
cluster booting again and again, two backends):

* ``index_build_s``: an ``EvidenceIndex`` built from them, in reports of 256 results
  (best of three);
* ``index_add_report_ms``: one more report of 256 results added to it (median of 50);
* ``service_full_load_s``: a ``Runtime`` on a SQLite file holding them, reading them
  at start (what a replica does at start);
* ``service_add_report_ms``: ``runtime.evidence_sync.apply_local`` of one report of 256 results (all
  its indexes and the new inputs; median of 50), and ``select_after_report_ms``: the
  decision that follows it (a cache miss, under policy ``measured``; median of 50);
* with ``--baseline-rev REV``: the index of that revision (``git show``), built the
  same way, for comparison.

Then, in a fresh process, the resident memory of a ``Runtime`` that loaded 100,000
results (12,500 pods over 10 clusters, every result counted: the most the bound lets
one hold), against the same process before the load.

    python bench/evidence_scale.py [--baseline-rev 9f4a5a0]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "evidence_scale.json"
SIZES = (16_000, 32_000, 64_000)
PODS = 2_000
REPORT = 256

from mla_switchboard.core.engines import OWN_ENGINE  # noqa: E402
from mla_switchboard.core.evaluator import decide  # noqa: E402
from mla_switchboard.core.evidence import (  # noqa: E402
    EvidenceIndex,
    Observation,
    Situation,
    packages_key,
)
from mla_switchboard.core.schemas import OverrideSpec, SelectRequest  # noqa: E402
from mla_switchboard.service.config import Settings  # noqa: E402
from mla_switchboard.service.runtime import Runtime  # noqa: E402
from mla_switchboard.service.store.models import MeasurementRow  # noqa: E402
from sqlalchemy import insert  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

PACKAGES = {"torch": "2.11.0", "flashinfer": "0.7.2", "cudnn": "1.32.0"}
SITUATION = Situation(
    "NVIDIA H200", "9.0", "128,64,128", "bfloat16", packages_key(PACKAGES), OWN_ENGINE
)
REQUEST = SelectRequest.model_validate(
    {
        "cluster": "prod-east",
        "pod": "r1-0",
        "device": {"name": "NVIDIA H200", "capability": [9, 0]},
        "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
        "dtype": "bfloat16",
        "packages": PACKAGES,
    }
)


def results(n: int, *, pods: int = PODS, clusters: int = 1, start: int = 0) -> list[dict[str, Any]]:
    """``n`` result rows in one situation, 30 s apart, reports of 32 results per pod."""
    began = datetime.now(UTC) - timedelta(days=25)
    return [
        {
            "report_id": f"r{(i // 32):07d}",
            "at": began + timedelta(seconds=30 * i),
            "cluster": f"prod-{i % clusters}" if clusters > 1 else "prod-east",
            "pod": f"pod-{(i // 4) % pods}",
            "device_name": SITUATION.device,
            "capability": SITUATION.capability,
            "dims": SITUATION.dims,
            "num_heads": 128,
            "dtype": SITUATION.dtype,
            "packages": SITUATION.packages,
            "backend": "FLASHINFER" if i % 2 else "CUDNN",
            "impl": "bench",
            "shape": "{}",
            "median_ms": 1.0,
            "tflops": 400.0 + (i * 7919) % 300,
            "correct": True,
            "engine": SITUATION.engine,
            "counted": True,
        }
        for i in range(start, start + n)
    ]


def observations(rows: list[dict[str, Any]]) -> list[Observation]:
    return [
        Observation(
            SITUATION, r["backend"], r["pod"], r["tflops"], ok=True, cluster=r["cluster"],
            at=r["at"], impl=r["impl"], source=f"m:{r['report_id']}:{k}",
        )
        for k, r in enumerate(rows)
    ]  # fmt: skip


def build_s(module: ModuleType, obs: list[Observation], rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        started = time.perf_counter()
        index = module.EvidenceIndex()
        for k in range(0, len(obs), REPORT):
            index = _add(index, obs[k : k + REPORT])
        best = min(best, time.perf_counter() - started)
    return best


def _add(index: Any, batch: list[Observation]) -> Any:
    if hasattr(index, "add"):
        index.add(batch)
        return index
    return index.with_observations(batch)  # an index that cannot change in place


def median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 3)


def new_reports(count: int, n_before: int) -> list[list[Observation]]:
    rows = results(count * REPORT, start=n_before)
    obs = observations(rows)
    for k, o in enumerate(obs):  # a report of its own each, so none is a duplicate
        object.__setattr__(o, "source", f"m:bench-new-{k // REPORT}:{k % REPORT}")
    return [obs[k : k + REPORT] for k in range(0, len(obs), REPORT)]


def bench_index(n: int) -> dict[str, float]:
    obs = observations(results(n))
    build = build_s(sys.modules["mla_switchboard.core.evidence"], obs)
    index = EvidenceIndex(obs)
    timings = []
    for report in new_reports(50, n):
        started = time.perf_counter()
        index.add(report)
        timings.append(time.perf_counter() - started)
    return {"index_build_s": round(build, 4), "index_add_report_ms": median_ms(timings)}


def bench_service(n: int, directory: Path) -> dict[str, float]:
    url = f"sqlite:///{directory / f'sb-{n}.db'}"
    runtime = Runtime(Settings(database_url=url))
    runtime.prepare_store()
    with Session(runtime.engine) as s, s.begin():
        s.execute(insert(MeasurementRow), results(n))
    runtime.start()
    try:
        started = time.perf_counter()
        runtime.evidence_sync.reload()
        full = time.perf_counter() - started
        _measured_policy(runtime)
        adds, selects = [], []
        for report in new_reports(50, n):
            started = time.perf_counter()
            runtime.evidence_sync.apply_local(report)
            adds.append(time.perf_counter() - started)
            started = time.perf_counter()
            runtime.selector.select(REQUEST, runtime.publisher.current())
            selects.append(time.perf_counter() - started)
        now = datetime.now(UTC)
        answer = decide(
            REQUEST, runtime.trusted.inputs_for(REQUEST, runtime.publisher.current(), now), now=now
        )
        assert getattr(answer, "source", None) == "measured", answer
        return {
            "service_full_load_s": round(full, 4),
            "service_add_report_ms": median_ms(adds),
            "select_after_report_ms": median_ms(selects),
        }
    finally:
        runtime.stop()


def _measured_policy(runtime: Runtime) -> None:
    """Policy ``measured`` for the cluster, as an admin's PUT stores it."""
    spec = OverrideSpec.model_validate({"policy": "measured", "note": "bench"})
    runtime.store.config.put_override("prod-east", spec, actor="bench", if_match=None, preview=None)
    runtime.live.reload()


def baseline(rev: str, sizes: tuple[int, ...]) -> dict[str, float]:
    """The index of revision ``rev``, built the same way (the module from ``git show``)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:core/evidence.py"], cwd=ROOT, check=True, capture_output=True,
        text=True,
    ).stdout  # fmt: skip
    spec = importlib.util.spec_from_loader("evidence_baseline", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:core/evidence.py", "exec"), module.__dict__)
    return {str(n): round(build_s(module, observations(results(n)), rounds=1), 4) for n in sizes}


def rss_child(url: str) -> None:
    """In a fresh process: RSS before and after a Runtime loads the store."""
    before = _status_kb("VmRSS")
    runtime = Runtime(Settings(database_url=url))
    started = time.perf_counter()
    runtime.start()
    load = time.perf_counter() - started
    gc.collect()
    summary = runtime.publisher.current().evidence.summary()
    print(
        json.dumps(
            {
                "rss_before_mb": round(before / 1024, 1),
                "rss_after_mb": round(_status_kb("VmRSS") / 1024, 1),
                "peak_rss_mb": round(_status_kb("VmHWM") / 1024, 1),
                "start_s": round(load, 3),
                "counted_samples": sum(g["samples"] for g in summary),
                "clusters": len(runtime.trusted._current.clusters),
            }
        )
    )
    runtime.stop()


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def bench_rss(directory: Path, n: int = 100_000) -> dict[str, Any]:
    url = f"sqlite:///{directory / 'sb-rss.db'}"
    runtime = Runtime(Settings(database_url=url))
    runtime.prepare_store()
    with Session(runtime.engine) as s, s.begin():
        for k in range(0, n, 10_000):
            s.execute(insert(MeasurementRow), results(10_000, pods=12_500, clusters=10, start=k))
    runtime.engine.dispose()
    out = subprocess.run(
        [sys.executable, __file__, "--rss-child", url], check=True, capture_output=True, text=True
    ).stdout
    return {"results": n, "pods": 12_500, "clusters": 10, **json.loads(out.splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-rev", help="also build the index of this git revision")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child(args.rss_child)
        return
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in SIZES:
            figures[str(n)] = {**bench_index(n), **bench_service(n, Path(tmp))}
            print(n, "results in one situation:", figures[str(n)], flush=True)
        rss = bench_rss(Path(tmp))
        print("100,000 results loaded:", rss, flush=True)
    result: dict[str, Any] = {
        "benchmark": "evidence cost as the history of one situation grows",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {_cpus()} CPUs, Python {platform.python_version()}",
        "report_results": REPORT,
        "pods": PODS,
        "one_situation": figures,
        "memory": rss,
    }
    if args.baseline_rev:
        result["baseline"] = {"rev": args.baseline_rev, "index_build_s": {}}
        result["baseline"]["index_build_s"] = baseline(args.baseline_rev, SIZES)
        print(f"baseline {args.baseline_rev}:", result["baseline"]["index_build_s"])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", OUT.relative_to(ROOT))


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
