"""The evidence index's operations in-process, one situation of many pods: what a
change to ``core/evidence/`` is checked against before and after.

Not a test: it prints CPU figures (``time.thread_time``, so other work on a shared
machine weighs less) for ``--pods`` pods (default 10,000) of 10 clusters, 8 results
each on two backends:

* adding them report by report (16 results a report), and in bulk (``EvidenceLoader``);
* one result at a time on the full index (the steady state);
* the median a write publishes, per tally;
* ``stage_samples`` of ten stages of 10 buckets each;
* a prune that drops the results of the first 4 hours out of 8 (a mass expiry: the
  once-a-minute prune of a steady fleet drops a few);
* what the index holds per counted sample (``tracemalloc``, after a bulk load).

    python bench/evidence_index_ops.py --pods 10000 30000
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from mla_switchboard.core.engines import OWN_ENGINE
from mla_switchboard.core.evidence import EvidenceIndex, EvidenceLoader, Observation, Situation
from mla_switchboard.core.evidence.values import median

S = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", "{}", OWN_ENGINE)
T0 = datetime(2026, 11, 30, tzinfo=UTC)
BACKENDS = ("FLASHINFER", "CUDNN")


def _observations(pods: int, rng: random.Random) -> list[Observation]:
    return [
        Observation(
            S,
            b,
            f"p{i}",
            rng.uniform(300, 700),
            ok=True,
            cluster=f"c{i % 10}",
            at=T0 + timedelta(minutes=k * 60 + i % 60),
        )
        for i in range(pods)
        for k in range(8)
        for b in BACKENDS
    ]


def _best(f: Callable[[], Any], rounds: int = 3) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(rounds):
        gc.collect()
        started = time.thread_time()
        out = f()
        times.append(time.thread_time() - started)
    return min(times), out


def _loaded(data: list[Observation]) -> EvidenceIndex:
    loader, index = EvidenceLoader(), EvidenceIndex()
    loader.add(data)
    loader.build(lambda cluster: [index])
    return index


def run(pods: int) -> str:
    rng = random.Random(1)
    data = _observations(pods, rng)

    def by_report() -> EvidenceIndex:
        index = EvidenceIndex()
        for start in range(0, len(data), 16):
            index.add(data[start : start + 16])
        return index

    t_add, index = _best(by_report, 2)
    t_load, loaded = _best(lambda: _loaded(data), 2)
    assert loaded.group(S) == index.group(S)
    extra = [
        Observation(
            S,
            "FLASHINFER",
            f"p{rng.randrange(pods)}",
            rng.uniform(300, 700),
            ok=True,
            cluster=f"c{rng.randrange(10)}",
            at=T0 + timedelta(days=1, seconds=i),
        )
        for i in range(20_000)
    ]
    t_steady, _ = _best(lambda: [index.add((o,)) for o in extra], 1)
    tallies = index._tallies[S].values()
    t_median, _ = _best(lambda: [median(t.values) for _ in range(20_000) for t in tallies])

    def stages() -> int:
        since = T0 + timedelta(hours=5)
        return sum(
            len(index.stage_samples(S, "FLASHINFER", range(b, b + 10), since))
            for b in range(0, 100, 10)
        )

    t_stage, _ = _best(stages)

    def prune() -> float:
        fresh = _loaded(data)
        started = time.thread_time()
        fresh.prune(T0 + timedelta(hours=10), timedelta(hours=6))
        return time.thread_time() - started

    t_prune = min(prune() for _ in range(2))
    tracemalloc.start()
    held = _loaded(data)
    gc.collect()
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del held
    n = len(data)
    return (
        f"{pods:,} pods, {n:,} results: report by report {t_add * 1e6 / (n / 16):.0f} us a "
        f"report, bulk {t_load:.2f} s, one more result {t_steady * 1e6 / len(extra):.1f} us, "
        f"median {t_median * 1e6 / (20_000 * len(tallies)):.2f} us, ten stages' samples "
        f"{t_stage * 1e3:.0f} ms, mass prune {t_prune * 1e3:.0f} ms, {size / n:.0f} B a result"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[10_000])
    for pods in parser.parse_args().pods:
        print(run(pods))


if __name__ == "__main__":
    main()
