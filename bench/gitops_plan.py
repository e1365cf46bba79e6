"""What ``switchboard overrides plan`` and ``apply`` cost on a large fleet: a file of
``--clusters`` overrides (one per cluster, bench/scale_overrides.py's mix: staged,
measured, denies) at ``--pods`` pods, through a real ``switchboard serve``.

It fills a fresh store (bench/scale.py's fleet and decisions, through the store's
API), writes every cluster's override through the store, starts the service, exports
the file (``GET /v1/overrides`` + ``/v1/rules``, as ``switchboard overrides export``)
and times, as medians of ``--repeat`` cold runs (each changes another cluster, or
another note, so no kept answer serves it):

- the first plan with a change after the start (it reads every cluster's groups once);
- ``POST /v1/plan`` of the exported file (nothing changes: every override compared);
- a plan changing one cluster's override, and ten clusters' overrides;
- a plan adding a fleet-wide ``*`` override (every cluster replayed);
- ``POST /v1/apply`` of ten changed overrides (plan, then apply with its ETags).

    python bench/gitops_plan.py --sqlite --pods 10000
    python bench/gitops_plan.py --pods 100000          # PostgreSQL (the tests' server)

Writes ``bench/results/gitops_plan.json`` and prints the figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mla_switchboard.core.schemas import OverrideSpec  # noqa: E402
from mla_switchboard.service.gitops.cli import export_text  # noqa: E402
from mla_switchboard.service.gitops.lines import read_file  # noqa: E402

from bench.scale import (  # noqa: E402
    PG_DSN,
    cluster_names,
    database,
    fill_decisions,
    make_fleet,
    ok,
    open_store,
    start_service,
)
from bench.scale_overrides import override_body  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "gitops_plan.json"


def median_s(call: Callable[[int], object], repeat: int) -> dict[str, float]:
    times = []
    for i in range(repeat):
        t0 = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - t0)
    return {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", type=int, default=100_000)
    p.add_argument("--clusters", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--sqlite", action="store_true", help="a SQLite file instead of PostgreSQL")
    p.add_argument("--pg", default=PG_DSN)
    args = p.parse_args(argv)
    clusters = cluster_names(args.clusters)
    fleet = make_fleet(args.pods, args.clusters)
    out: dict[str, Any] = {"pods": args.pods, "clusters": args.clusters, "overrides": len(clusters)}
    kind = "sqlite" if args.sqlite else "postgresql"
    out["store"] = kind
    with database(kind, args.pg, "gitops") as url, tempfile.TemporaryDirectory() as logs:
        store = open_store(url)
        out["fill"] = fill_decisions(store, fleet, 1, label="gitops bench: ")
        for i, cluster in enumerate(clusters):
            spec = OverrideSpec.model_validate(override_body(i, cluster))
            store.config.put_override(cluster, spec, actor="bench", if_match=None, preview=None)
        store.engine.dispose()
        service = start_service(url, Path(logs))
        try:
            with service.client() as c:
                items = ok(c.get("/v1/overrides")).json()["items"]
                text = export_text(items, ok(c.get("/v1/rules")).json())
                document = read_file(text)
                assert not isinstance(document, list), document
                base = document.sent()
                out["file_lines"] = text.count("\n")
                ok(c.post("/v1/plan", json={"file": base}))

                def plan(changed: dict[str, Any]) -> dict[str, Any]:
                    file = {**base, "overrides": {**base["overrides"], **changed}}
                    answer = ok(c.post("/v1/plan", json={"file": file})).json()
                    assert answer["summary"]["update"] + answer["summary"]["create"] == len(
                        changed
                    ), answer["summary"]
                    return answer

                def changed(first: int, n: int, tag: str) -> dict[str, Any]:
                    return {
                        clusters[k]: {"deny": ["CUDNN"], "note": f"gitops bench {tag} {k}"}
                        for k in range(first, min(first + n, args.clusters))
                    }

                counter = itertools.count()
                # the first preview after a start reads every cluster's groups once
                out["first_plan_after_start"] = median_s(
                    lambda i: plan(changed(args.clusters - 1, 1, "first")), 1
                )
                out["plan_unchanged"] = median_s(lambda i: plan({}), args.repeat)
                out["plan_one_changed"] = median_s(
                    lambda i: plan(changed(next(counter) % args.clusters, 1, "one")), args.repeat
                )
                out["plan_ten_changed"] = median_s(
                    lambda i: plan(changed(10 * i, 10, "ten")), args.repeat
                )
                out["plan_fleet_override"] = median_s(
                    lambda i: plan({"*": {"deny": ["CUDNN"], "note": f"fleet {i}"}}), args.repeat
                )

                def apply(i: int) -> None:
                    more = changed(args.clusters // 2 + 10 * i, 10, f"apply {i}")
                    file = {**base, "overrides": {**base["overrides"], **more}}
                    p = ok(c.post("/v1/plan", json={"file": file})).json()
                    ok(c.post("/v1/apply", json={"file": file, "etags": p["etags"]}))
                    base["overrides"].update(more)  # the next apply starts from this one

                out["plan_and_apply_ten"] = median_s(apply, args.repeat)
        finally:
            service.stop()
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
