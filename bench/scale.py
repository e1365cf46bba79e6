"""Scale benchmark: what the service's reads and writes cost as a fleet and its history grow.

For each fleet size (1,000 / 10,000 / 100,000 distinct pods by default) it fills a fresh
store with 10 recorded decisions per pod (10,000 / 100,000 / 1,000,000 decision rows)
and one evidence result per pod (100,000 at the largest), the pods being replicas of
8 deployments per cluster (GPU generations, package sets, vLLM / SGLang / our own
kernels), with a measured-policy override on one cluster and a 10 % staged rollout on
another. Then it starts a real ``switchboard serve`` on it and measures, as medians of
repeated runs (the operations first, so that they see exactly these sizes; the select
load adds decisions):

- ``GET /v1/selections/summary``;
- the dashboard's initial load: the API calls dashboard.js makes when a viewer signs
  in (the summary, then the summary, overrides and audit together);
- ``PUT /v1/overrides/{cluster}?dry_run=true`` for one cluster and for ``*``;
- an admin ``PUT`` and ``DELETE`` of a cluster's override;
- ``POST /v1/select`` p50/p99 at a steady 300 requests/s (open loop, timed from each
  request's scheduled send), idle and while previews of ``*``, summaries, evidence
  reports, failure clears (every 2 s), or all four, run back to back, with what the
  service itself counted meanwhile (its answers over 10 / 50 ms, event-loop lag, GC
  pauses);
- the service's resident memory after it started and its peak (before and after the
  evidence is stored).

Every measured operation's input grows 10x between sizes, so the "growth per 10x"
column is the ratio of consecutive sizes: about 10 means linear in the fleet, about 1
means independent of it. Separately it reports 64,000 measurement results streaming
into one situation under policy measured (2,000 pods x 4 reports x 8 results) and how
long a select waits meanwhile and afterwards.

The store is filled through the store's own API (``Store.record_decisions`` with
answers from the real evaluator, ``Store.add_measurements``), not raw SQL, so it stays
right as the schema changes. Repetitions are cold where a cache could answer: a new
replica of a deployment boots (a new pod in the fleet's counts) before each summary and
dashboard load, whose summary's ETag is checked to have moved, and each preview proposes
a different note and expiry.

    python bench/scale.py                      # PostgreSQL, the three sizes (long)
    python bench/scale.py --sizes 1000,10000 --repeat 3 --load-rounds 1   # quicker
    python bench/scale.py --sqlite             # a SQLite file instead
    python bench/scale.py --axis overrides     # clusters x overrides (scale_overrides.py)
    python bench/scale.py --axis evidence      # stored reports, one busy situation

Needs the PostgreSQL server of the tests (127.0.0.1:5432, trust, database "test";
``--pg`` or ``SWITCHBOARD_BENCH_PG`` for another); each size gets a schema of its own,
dropped afterwards. Prints the table and writes ``bench/results/scale.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import math
import multiprocessing
import os
import platform
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/scale.py` from anywhere
    sys.path.insert(0, str(ROOT))

from mla_switchboard.core.engine_names import detection_order  # noqa: E402
from mla_switchboard.core.engines import ENGINES as ENGINE_PROFILES  # noqa: E402
from mla_switchboard.core.evaluator import (  # noqa: E402
    Decision,
    DecisionInputs,
    Refusal,
    decide,
    decide_locally,
    decision_key,
)
from mla_switchboard.core.evidence import engine_key  # noqa: E402
from mla_switchboard.core.schemas import (  # noqa: E402
    SEED_RULES,
    EngineInfo,
    MeasurementReport,
    OverrideSpec,
    SelectRequest,
)
from mla_switchboard.core.specs import format_capability  # noqa: E402
from mla_switchboard.service.ids import new_id  # noqa: E402
from mla_switchboard.service.selector import Rendered  # noqa: E402
from mla_switchboard.service.state import DecisionRecord  # noqa: E402
from mla_switchboard.service.store import Store  # noqa: E402
from mla_switchboard.service.store.db import make_engine, migrate  # noqa: E402

from bench.common import free_port, raw_select, spill_path_in  # noqa: E402
from bench.scale_support import cpu_model, product_root  # noqa: E402

TOKEN = "bench-scale-admin-token"
PG_DSN = os.environ.get("SWITCHBOARD_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
RESULTS = ROOT / "bench" / "results" / "scale.json"

# ------------------------------------------------------------------ the fleet
#
# The mix of bench/boot_storm.py (GPU generations, package sets, models) plus the
# serving engine: vLLM, SGLang, or none (our own kernels). Weights are the last column.

GPUS: list[tuple[str | None, tuple[int, int] | None, int]] = [
    ("NVIDIA H200", (9, 0), 35),
    ("NVIDIA H100 80GB HBM3", (9, 0), 25),
    ("NVIDIA B200", (10, 0), 20),
    ("NVIDIA A100-SXM4-80GB", (8, 0), 12),
    ("NVIDIA L40S", (8, 9), 5),
    (None, None, 3),  # a CPU-only canary pod
]
PACKAGE_SETS: list[tuple[dict[str, str] | None, int]] = [
    ({"torch": "2.11.0", "flashinfer": "0.7.2", "cudnn": "1.32.0"}, 40),
    ({"torch": "2.11.0", "flashinfer": "0.7.2"}, 25),
    ({"torch": "2.11.0", "flash_attn": "2.8.3"}, 20),
    ({"torch": "2.11.0"}, 10),
    (None, 5),  # the agent was told "any": assume every package
]
# what some pods ran before an image upgrade: their older decisions carry it
OLD_PACKAGES = {"torch": "2.10.0", "flashinfer": "0.6.4"}
MODELS: list[tuple[dict[str, Any], int]] = [
    ({"name": "deepseek-ai/DeepSeek-R1", "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "num_heads": 128}, 45),
    ({"name": "moonshotai/Kimi-K2-Instruct", "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "num_heads": 64}, 25),
    ({"name": "zai-org/GLM-5", "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
      "v_head_dim": 256, "num_heads": 64}, 20),
    ({"name": "deepseek-ai/DeepSeek-V2-Lite", "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "num_heads": 16}, 10),
]  # fmt: skip
# each serving engine at its newest release read, in the registry's order, then our own
# kernels/ wrappers (no engine named)
ENGINE_WEIGHTS = (50, 20)
"""How often each engine appears among the filled pods, in the registry's order (an
engine registered later: 10; no engine: 30)."""
ENGINES: list[tuple[dict[str, str] | None, int]] = [
    *(
        ({"name": e.name, "version": ENGINE_PROFILES[e.name][0].verified}, weight)
        for e, weight in zip(
            detection_order(),
            itertools.chain(ENGINE_WEIGHTS, itertools.repeat(10)),
            strict=False,
        )
    ),
    (None, 30),
]
REGIONS = ["us-east", "us-west", "eu-central", "ap-south"]

# Median TFLOP/s of a backend on an H200 at the two measured shapes (8x512, 1x8192),
# scaled per GPU; the evidence a pod reports (kept under each GPU's bf16 peak).
SPEED = {"FLASH_ATTN": (190.0, 260.0), "FLASHINFER": (260.0, 740.0),
         "CUDNN": (245.0, 630.0), "TORCH_SDPA": (6.0, 9.9)}  # fmt: skip
GPU_SCALE = {"H200": 1.0, "H100": 0.95, "B200": 2.0, "A100": 0.3, "L40S": 0.33}
SHAPES = [[512] * 8, [8192]]


def cluster_names(n: int) -> list[str]:
    """``n`` cluster names like a real fleet's (region and a number)."""
    return [f"{REGIONS[i % len(REGIONS)]}-{i:04d}" for i in range(n)]


def pick(rng: random.Random, table: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    """A row of ``table`` without its weight (the last column), drawn by weight."""
    return rng.choices([row[:-1] for row in table], weights=[row[-1] for row in table])[0]


@dataclass(frozen=True)
class Pod:
    """One pod of the fleet: the request it sends now, and how many of its recorded
    decisions (the oldest) it made before an image upgrade changed its packages."""

    request: dict[str, Any]
    upgraded_after: int = 0

    @property
    def cluster(self) -> str:
        return str(self.request["cluster"])


def deployments_of(cluster: str, count: int, rng: random.Random) -> list[dict[str, Any]]:
    """``count`` deployments of ``cluster``: what its pods send apart from their names
    (a GPU pool, a model, an image's packages, an engine, the odd requested backend). A
    deployment whose engine accepts no backend (vLLM on a CPU-only pool, say) runs our
    own kernels instead, as its agent then would: every pod gets an answer."""
    out = []
    for _ in range(count):
        device, cap = pick(rng, GPUS)
        (packages,) = pick(rng, PACKAGE_SETS)
        (model,) = pick(rng, MODELS)
        (engine,) = pick(rng, ENGINES)
        body: dict[str, Any] = {
            "cluster": cluster,
            "device": {"name": device, "capability": None if cap is None else list(cap)},
            "model": model,
            "dtype": "bfloat16",
            "packages": packages,
            "requested_backend": "FLASHINFER" if rng.random() < 0.1 else None,
            "engine": engine,
        }
        if isinstance(decide_locally(SelectRequest.model_validate(body)), Refusal):
            body["engine"] = None
        out.append(body)
    return out


def make_fleet(pods: int, clusters: int, deployments: int = 8, seed: int = 7) -> list[Pod]:
    """``pods`` distinct pods spread round-robin over ``clusters`` clusters, each pod a
    replica of one of its cluster's ``deployments``; 30 % of them upgraded their
    packages during their history. A cluster's deployments do not depend on ``pods``,
    so a larger fleet has more replicas of the same descriptions, as a real one grows:
    what a summary or a preview must tell apart stays the same while the pods grow 10x.
    Same arguments, same fleet."""
    rng = random.Random(seed)
    names = cluster_names(clusters)
    kinds = {c: deployments_of(c, deployments, random.Random(f"{seed}/{c}")) for c in names}
    fleet = []
    for i in range(pods):
        cluster = names[i % clusters]
        d = rng.randrange(deployments)
        body = kinds[cluster][d]
        app = body["model"]["name"].split("/")[1].lower()[:12].strip("-.")
        request = {
            **body,
            "node": f"{cluster}-gpu-{i // 8:05d}",
            "pod": f"{app}-{d}-{rng.getrandbits(40):010x}-{i:06d}",
        }
        upgraded = rng.randint(1, 5) if body["packages"] and rng.random() < 0.3 else 0
        fleet.append(Pod(request, upgraded))
    return fleet


def scenario_overrides(clusters: list[str]) -> dict[str, OverrideSpec]:
    """What is in force while the fleet boots: policy measured on one cluster (regret and
    exclusions have work) and a 10 % staged rollout on another (rollout progress has)."""
    return {
        clusters[0]: OverrideSpec(policy="measured", note="scale bench: measured policy"),
        clusters[1]: OverrideSpec.model_validate(
            {
                "deny": ["TRTLLM_RAGGED"],
                "note": "scale bench: staged rollout",
                "rollout": {"percent": 10},
            }
        ),
    }


# ------------------------------------------------------------------ the store


DASHBOARD_SIGNIN = ["/v1/backends", "/v1/selections/summary"]
DASHBOARD_REFRESH = [
    "/v1/selections/summary",
    "/v1/overrides",
    "/v1/audit?limit=20",
    "/v1/refusals?hours=1",
    "/v1/measurements/summary",
    "/v1/pods?limit=100",
    "/v1/pods/facets",
]
"""What service/static/dashboard.js (and pods.js) ask on sign-in and on each refresh."""


def decision_record(request: SelectRequest, request_json: str, answer: Rendered) -> DecisionRecord:
    """One recorded decision, as the service's writer stores a ``/v1/select``.

    The only place the benchmark makes a decision row: when the decisions table
    changes, this is what to adapt. ``new_id()`` is time-ordered, so a pod's later
    decisions get greater ids (the newest is its latest)."""
    decision = answer.decision
    return DecisionRecord(
        id=new_id(),
        created_at=datetime.now(UTC),
        cluster=request.cluster,
        node=request.node,
        pod=request.pod,
        backend=decision.backend.value,
        source=decision.source,
        rules_revision=SEED_RULES.revision or 0,
        request_json=request_json,
        answer_id=answer.answer_id,
        answer_json=answer.answer_json,
    )


class Progress:
    """Prints how far a long step is, its rate and the time left, every few seconds."""

    def __init__(self, what: str, total: int, unit: str, every_s: float = 5.0) -> None:
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.start = self.last = time.monotonic()

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        print(
            f"    {self.what}: {done:,}/{self.total:,} {self.unit} "
            f"({rate:,.0f}/s, ETA {eta:.0f} s)",
            flush=True,
        )

    def finish(self) -> float:
        elapsed = time.monotonic() - self.start
        print(
            f"    {self.what}: {self.total:,} {self.unit} in {elapsed:.1f} s "
            f"({self.total / max(elapsed, 1e-9):,.0f}/s)",
            flush=True,
        )
        return elapsed


class Answers:
    """The real evaluator's answer per distinct decision input, computed once (the
    service's own cache does the same: a rollout's pods share a description)."""

    def __init__(self, inputs: DecisionInputs) -> None:
        self.inputs = inputs
        self._cache: dict[tuple[Any, ...], Rendered | Refusal] = {}
        self._now = datetime.now(UTC)

    def history_entry(self, body: dict[str, Any]) -> tuple[SelectRequest, str, Rendered]:
        """The parsed request, its JSON as the service stores it, and its answer."""
        request = SelectRequest.model_validate(body)
        key = decision_key(request, self.inputs.overrides)
        hit = self._cache.get(key)
        if hit is None:
            decided = decide(request, self.inputs, now=self._now)
            hit = Rendered.of(decided, 1, request) if isinstance(decided, Decision) else decided
            self._cache[key] = hit
        if not isinstance(hit, Rendered):
            raise ValueError(f"the evaluator refuses this pod: {hit.message}: {body}")
        return request, request.model_dump_json(), hit


def open_store(url: str) -> Store:
    """A migrated, seeded store on ``url`` (what ``switchboard serve`` does at start)."""
    engine = make_engine(url)
    migrate(engine)
    store = Store(engine)
    store.config.ensure_seeded()
    return store


def fill_decisions(
    store: Store, fleet: list[Pod], per_pod: int, *, batch: int = 5000, label: str = ""
) -> dict[str, float]:
    """``per_pod`` decisions of every pod, oldest first (a pod's latest has the greatest
    id), in batches through ``Store.record_decisions``, answered by the real evaluator
    under the overrides stored now."""
    overrides = store.config.load_config().overrides
    answers = Answers(DecisionInputs(rules=SEED_RULES, overrides=overrides))
    total = len(fleet) * per_pod
    progress = Progress(f"{label}decision rows", total, "rows")
    pending: list[DecisionRecord] = []
    done = 0
    for i, pod in enumerate(fleet):
        now = answers.history_entry(pod.request)
        before = now
        if pod.upgraded_after:
            before = answers.history_entry({**pod.request, "packages": OLD_PACKAGES})
        for k in range(per_pod):
            old = k < pod.upgraded_after and k < per_pod - 1
            pending.append(decision_record(*(before if old else now)))
        if len(pending) >= batch or i == len(fleet) - 1:
            store.decisions.record_decisions(pending)
            done += len(pending)
            pending = []
            progress.update(done)
    elapsed = progress.finish()
    return {"seconds": round(elapsed, 2), "rows": total, "rows_per_s": round(total / elapsed)}


def measurable(fleet: list[Pod]) -> list[Pod]:
    """Pods whose situation evidence can match: a GPU and known packages."""
    return [p for p in fleet if p.request["device"]["capability"] and p.request["packages"]]


def report_of(
    pod: Pod, rng: random.Random, results: int = 8, wrong_rate: float = 0.004
) -> dict[str, Any]:
    """A ``switchboard bench`` report from ``pod``: four backends at two shapes, speeds
    scaled to its GPU. A FLASHINFER or CUDNN result is wrong at ``wrong_rate`` (failure
    evidence that excludes it under policy measured); FLASH_ATTN and TORCH_SDPA never
    are, so every pod keeps a backend its engine accepts."""
    req = pod.request
    gpu = next((v for k, v in GPU_SCALE.items() if k in req["device"]["name"]), 0.3)
    heads = req["model"]["num_heads"]
    out = []
    for n in range(results):
        backend = list(SPEED)[n % len(SPEED)]
        shape = SHAPES[(n // len(SPEED)) % len(SHAPES)]
        tflops = round(SPEED[backend][n // len(SPEED) % 2] * gpu * rng.uniform(0.9, 1.1), 1)
        wrong = backend in ("FLASHINFER", "CUDNN") and rng.random() < wrong_rate
        out.append(
            {
                "backend": backend,
                "impl": backend.lower(),
                "shape": {"seqlens": shape, "num_heads": heads},
                "median_ms": round(rng.uniform(0.05, 5.0), 3),
                "tflops": None if wrong else tflops,
                "correct": not wrong,
                "error": "max abs error 0.52 > tolerance 0.02" if wrong else None,
            }
        )
    keys = ("cluster", "pod", "node", "device", "model", "dtype", "packages", "engine")
    return {**{k: req.get(k) for k in keys}, "report_id": new_id(), "results": out}


def clear_body(pod: Pod, n: int) -> dict[str, Any]:
    """An admin clearing the failure evidence of ``pod``'s situation."""
    req = pod.request
    cap, m = req["device"]["capability"], req["model"]
    engine = None if req.get("engine") is None else EngineInfo.model_validate(req["engine"])
    return {
        "device": req["device"]["name"],
        "capability": format_capability(cap),
        "dims": [m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"]],
        "dtype": req["dtype"],
        "packages": req["packages"],
        "engine": engine_key(engine),
        "note": f"scale bench: fixed driver {n}",
    }


def fill_evidence(
    store: Store, fleet: list[Pod], results: int, *, seed: int = 11, label: str = ""
) -> dict[str, float]:
    """``results`` measurement results in reports of 8, each from a different pod that
    has decisions in the same situation, through ``Store.add_measurements`` (counted,
    as the service counts a report from a pod it decided for). A few threads overlap
    the round trips."""
    rng = random.Random(seed)
    pods = measurable(fleet)
    rng.shuffle(pods)
    reports = []
    left = results
    for pod in pods:
        if left <= 0:
            break
        reports.append(report_of(pod, rng, min(8, left)))
        left -= len(reports[-1]["results"])
    if left > 0:
        raise ValueError(f"{results} results need more measurable pods than {len(pods)}")
    progress = Progress(f"{label}evidence results", results, "results")
    done = [0]
    lock = threading.Lock()

    def add(body: dict[str, Any]) -> None:
        report = MeasurementReport.model_validate(body)
        store.measurements.add_measurements(report, body["report_id"], counted=True)
        with lock:
            done[0] += len(body["results"])
            progress.update(done[0])

    threads = 1 if store.engine.dialect.name == "sqlite" else 4  # SQLite: one writer
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(add, reports))
    elapsed = progress.finish()
    return {"seconds": round(elapsed, 2), "results": results, "reports": len(reports)}


# ------------------------------------------------------------------ databases


@contextmanager
def database(kind: str, pg_dsn: str, tag: str) -> Iterator[str]:
    """A fresh, empty database URL (a PostgreSQL schema, or a SQLite file), removed
    afterwards."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix=f"sb-scale-{tag}-") as d:
            yield f"sqlite:///{Path(d) / 'switchboard.db'}"
        return
    import psycopg

    schema = f"sb_scale_{tag}_{secrets.token_hex(3)}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        base = pg_dsn.split("://", 1)[1]
        yield f"postgresql+psycopg://{base}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# ------------------------------------------------------------------ the service


@dataclass
class Service:
    """A real ``switchboard serve`` process on loopback."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    started_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout: float = 600.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=timeout
        )

    def memory_mb(self) -> dict[str, float]:
        """VmRSS (now) and VmHWM (peak so far) from /proc, in MB (10^6 bytes)."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = round(int(value.split()[0]) * 1024 / 1e6, 1)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_service(url: str, log_dir: Path, timeout: float = 600.0, **env: str) -> Service:
    """Start ``python -m mla_switchboard.service.cli serve`` on ``url`` (as
    tests/conftest.py's ServiceProcess does) and wait for ``/readyz``. It runs in the
    checkout this interpreter's product comes from, which is this one unless another
    checkout's python runs this file (bench/side_by_side.py)."""
    port = free_port()
    log = log_dir / f"service-{port}.log"
    environ = {
        **os.environ,
        "SWITCHBOARD_DATABASE_URL": url,
        "SWITCHBOARD_ADMIN_TOKEN": TOKEN,
        "PYTHONUNBUFFERED": "1",
        "SWITCHBOARD_SPILL_PATH": os.environ.get("SWITCHBOARD_SPILL_PATH")
        or spill_path_in(log_dir, url),
        **env,
    }
    cmd = [sys.executable, "-m", "mla_switchboard.service.cli", "serve", "--port", str(port)]
    t0 = time.monotonic()
    with log.open("ab") as f:
        proc = subprocess.Popen(
            [*cmd, "--log-level", "warning"], cwd=product_root(), env=environ, stdout=f, stderr=f
        )
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited early:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return Service(proc, port, log, round(time.monotonic() - t0, 2))
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"service not ready in {timeout} s:\n{log.read_text()[-3000:]}")


# ------------------------------------------------------------- timed operations


def ok(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 300:
        raise RuntimeError(
            f"{response.request.method} {response.request.url} answered "
            f"{response.status_code}: {response.text[:500]}"
        )
    return response


def timed(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


WRITER_SETTLE_S = 2.0
"""The most a reboot waits for its decision to be stored (the writer's interval is
50 ms by default, ``SWITCHBOARD_FLUSH_INTERVAL_S``)."""


class Operations:
    """The measured operations against one service, each cold where a cache could
    answer, each returning its wall time in seconds."""

    def __init__(self, service: Service, fleet: list[Pod], clusters: list[str]) -> None:
        self.service = service
        self.fleet = fleet
        self.preview_scope = clusters[2]
        self.admin_cluster = clusters[3]
        self.clients = [service.client() for _ in range(len(DASHBOARD_REFRESH))]
        self.pool = ThreadPoolExecutor(len(DASHBOARD_REFRESH))
        self.rng = random.Random(5)
        self.n = 0
        self.etags: dict[str, str | None] = {}

    def check(self, response: httpx.Response) -> httpx.Response:
        """What every measured answer goes through: a refusal ends the run here (a
        subclass may count it instead, with the time it took)."""
        return ok(response)

    def close(self) -> None:
        self.pool.shutdown()
        for c in self.clients:
            c.close()

    def reboot(self) -> None:
        """A new replica of a deployment boots (a new pod in the fleet's counts): what
        makes a kept summary stale. A pod that boots again in the same situation
        changes no count, and the kept answer would reply (a lookup, not the cost).

        Then it waits until the writer stored it (``/readyz``: no decision waits for the
        database): a read waits for the decisions answered before it, and where in the
        writer's cycle the timed read arrived would otherwise add 0 to 50 ms of chance
        to the figure, not of cost."""
        self.n += 1
        pod = self.rng.choice(self.fleet)
        request = {**pod.request, "pod": f"{pod.request['pod']}-new-{self.n}"}
        self.check(self.clients[0].post("/v1/select", json=request))
        until = time.monotonic() + WRITER_SETTLE_S
        while time.monotonic() < until:
            if self.clients[0].get("/readyz").json().get("decisions_buffered") == 0:
                return
            time.sleep(0.005)

    def cold(self, response: httpx.Response, what: str) -> httpx.Response:
        """``response``, checked to be a new computation: its ETag differs from the
        last one seen for ``what`` (a kept answer would carry the same)."""
        self.check(response)
        etag = response.headers.get("etag")
        if etag is not None and etag == self.etags.get(what):
            raise RuntimeError(f"{what}: the answer was kept, the run is not cold")
        self.etags[what] = etag
        return response

    def proposal(self, deny: str) -> dict[str, Any]:
        """A proposal whose note and expiry differ every time, so a kept preview of an
        earlier one cannot answer it."""
        self.n += 1
        expires = datetime.now(UTC) + timedelta(hours=2, seconds=self.n)
        return {
            "deny": [deny],
            "note": f"scale bench proposal {self.n} {secrets.token_hex(3)}",
            "expires_at": expires.isoformat(),
        }

    def summary(self) -> float:
        self.reboot()
        return timed(lambda: self.cold(self.clients[0].get("/v1/selections/summary"), "summary"))

    def dashboard(self) -> float:
        """dashboard.js on sign-in: the backend list and the summary (which checks the
        token) at once, then who the token is, then ``refreshAll``'s panels at once."""
        self.reboot()
        c = self.clients

        def load() -> None:
            signin = [self.pool.submit(c[i].get, p) for i, p in enumerate(DASHBOARD_SIGNIN)]
            for path, f in zip(DASHBOARD_SIGNIN, signin, strict=True):
                if path == "/v1/selections/summary":
                    self.cold(f.result(), "dashboard summary")
                else:
                    self.check(f.result())
            self.check(c[0].get("/v1/whoami"))
            futures = [self.pool.submit(c[i].get, p) for i, p in enumerate(DASHBOARD_REFRESH)]
            for f in futures:
                self.check(f.result())

        return timed(load)

    def preview(self, scope: str) -> float:
        body = self.proposal("FLASHINFER")
        return timed(
            lambda: self.check(
                self.clients[0].put(f"/v1/overrides/{scope}?dry_run=true", json=body)
            )
        )

    def preview_cluster(self) -> float:
        return self.preview(self.preview_scope)

    def preview_fleet(self) -> float:
        return self.preview("*")

    def admin_put(self) -> float:
        body = self.proposal("CUDNN")
        return timed(
            lambda: self.check(
                self.clients[0].put(f"/v1/overrides/{self.admin_cluster}", json=body)
            )
        )

    def admin_delete(self) -> float:
        path = f"/v1/overrides/{self.admin_cluster}?note=scale+bench+{self.n}"
        return timed(lambda: self.check(self.clients[0].delete(path)))


def repeat(call: Callable[[], float], times: int, warmup: int = 1) -> dict[str, Any]:
    """The median of ``times`` runs after ``warmup`` untimed ones, with every run."""
    for _ in range(warmup):
        call()
    runs = [call() for _ in range(times)]
    return {"median_s": round(statistics.median(runs), 4), "runs": [round(r, 4) for r in runs]}


def measure_operations(ops: Operations, times: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # admin writes alternate: each PUT creates the override its DELETE removes
    steps: list[tuple[str, Callable[[], float]]] = [
        ("summary", ops.summary),
        ("dashboard", ops.dashboard),
        ("preview_cluster", ops.preview_cluster),
        ("preview_fleet", ops.preview_fleet),
    ]
    for name, call in steps:
        out[name] = repeat(call, times)
        print(
            f"    {name:16s} median {out[name]['median_s']:.3f} s  {out[name]['runs']}", flush=True
        )
    ops.admin_put()
    ops.admin_delete()  # warm-up
    puts, deletes = [], []
    for _ in range(times):
        puts.append(ops.admin_put())
        deletes.append(ops.admin_delete())
    for name, runs in (("admin_put", puts), ("admin_delete", deletes)):
        out[name] = {
            "median_s": round(statistics.median(runs), 4),
            "runs": [round(r, 4) for r in runs],
        }
        print(
            f"    {name:16s} median {out[name]['median_s']:.3f} s  {out[name]['runs']}", flush=True
        )
    return out


# ------------------------------------------------------- open-loop select load


def http_select(body: dict[str, Any], port: int) -> bytes:
    return raw_select(body, f"127.0.0.1:{port}", TOKEN)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length, keep = 0, True
    for line in lines[1:]:
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "content-length":
            length = int(value)
        elif key == "connection" and value.strip().lower() == "close":
            keep = False
    await reader.readexactly(length)
    return status, keep


async def paced(
    port: int, requests: list[bytes], rate: float, seconds: float, stop: Any = None
) -> dict[str, Any]:
    """Send ``requests`` (round-robin) at ``rate`` per second for ``seconds`` (or until
    ``stop`` is set), each on an idle keep-alive connection or a new one, never waiting
    for an earlier answer: an open loop. Each latency runs from the request's
    *scheduled* send time, so a stall of the server (or of this client) shows in full
    instead of delaying the requests that would have seen it."""
    loop = asyncio.get_running_loop()
    idle: list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = []  # (last used, ..)
    samples: list[tuple[float, float]] = []  # (scheduled monotonic time, latency s)
    errors: list[str] = []

    def take() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The connection used last, unless it has been idle for 2 s: the server closes
        idle keep-alive connections after 5 s, and a request sent on one as it closes
        would fail for no fault of the server's."""
        while idle:
            used, reader, writer = idle.pop()
            if loop.time() - used < 2.0:
                return reader, writer
            writer.close()
        return None

    async def one(scheduled: float, request: bytes) -> None:
        conn = take()
        for attempt in range(2):
            try:
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", port)
                reader, writer = conn
                writer.write(request)
                status, keep = await read_response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                if conn is not None:
                    conn[1].close()
                if attempt:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    return
                conn = None  # once more on a new connection (its time still counts)
                continue
            samples.append((scheduled, loop.time() - scheduled))
            if status != 200:
                errors.append(f"HTTP {status}")
            if keep:
                idle.append((loop.time(), reader, writer))
            else:
                writer.close()
            return

    start = loop.time() + 0.1
    # only the requests in flight are held: a list of every finished task (tens of
    # thousands in a long run) made each of this client's own collections slower
    tasks: set[asyncio.Task[None]] = set()
    i = 0
    while True:
        scheduled = start + i / rate
        if scheduled - start >= seconds or (stop is not None and stop.is_set()):
            break
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(scheduled, requests[i % len(requests)]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        i += 1
    _, pending = await asyncio.wait(set(tasks), timeout=120) if tasks else (set(), set())
    for t in pending:
        t.cancel()
    for _, _, writer in idle:
        writer.close()
    return {"sent": i, "samples": samples, "errors": errors, "unanswered": len(pending)}


def _paced_child(
    conn: Any, port: int, requests: list[bytes], rate: float, seconds: float, stop: Any
) -> None:
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
        run = asyncio.run
    # The load generator must not stall itself: a cyclic collection here pauses every
    # request in flight, and the pause would be booked as the service's latency. What
    # it allocates in one run is small and freed by reference counting.
    gc.disable()
    # Nor may the machine's other work delay it: on two shared cores the service, its
    # database and the background operations all want a core, and a load client
    # waiting for one books that wait as the service's. Pods are on other machines;
    # this client runs ahead of the rest where it may (as root), else as it is.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    result = run(paced(port, requests, rate, seconds, stop))
    result["client_nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    conn.send(result)
    conn.close()


class SelectLoad:
    """``paced`` in a process of its own, so the work of this process (the background
    operations) cannot delay its sends."""

    def __init__(self, port: int, requests: list[bytes], rate: float, seconds: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self._recv, send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(
            target=_paced_child,
            args=(send, port, requests, rate, seconds, self.stop),
            daemon=True,  # ended with this process, whatever happens to it
        )
        self.proc.start()

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = self._recv.recv()
        self.proc.join(30)
        return out


def latency_stats(latencies: Sequence[float]) -> dict[str, float | int]:
    lat = sorted(latencies)
    if not lat:
        return {"requests": 0}

    def pct(q: float) -> float:
        return round(lat[min(len(lat) - 1, math.ceil(q * len(lat)) - 1)] * 1000, 2)

    return {
        "requests": len(lat),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "max_ms": round(lat[-1] * 1000, 2),
    }


class Background:
    """Operations run back to back (one in flight each) in threads while the select
    load runs: previews of ``*``, summaries, or evidence reports at a steady rate."""

    def __init__(self, service: Service, fleet: list[Pod], report_rate: float) -> None:
        self.service, self.fleet, self.report_rate = service, fleet, report_rate
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []
        self.rng = random.Random(13)
        self.measurable = measurable(fleet)
        self._next_report = time.monotonic()

    def _loop(self, name: str, call: Callable[[httpx.Client], httpx.Response]) -> None:
        with self.service.client() as c:
            while not self.stop.is_set():
                try:
                    ok(call(c))
                    self.counts[name] = self.counts.get(name, 0) + 1
                except (httpx.HTTPError, RuntimeError) as exc:
                    self.errors.append(f"{name}: {exc}"[:300])

    def _reports(self, c: httpx.Client) -> httpx.Response:
        """One report from a pod with decisions, at ``report_rate`` per second."""
        delay = self._next_report - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self._next_report = max(self._next_report, time.monotonic() - 1) + 1 / self.report_rate
        pod = self.rng.choice(self.measurable)
        return c.post("/v1/measurements", json=report_of(pod, self.rng))

    def start(self, kinds: Sequence[str]) -> None:
        n = [0]

        def preview(c: httpx.Client) -> httpx.Response:
            n[0] += 1
            body = {"deny": ["FLASHINFER"], "note": f"background preview {n[0]} {time.time()}"}
            return c.put("/v1/overrides/*?dry_run=true", json=body)

        def clear(c: httpx.Client) -> httpx.Response:
            """A failure clear (every replica forgets those failures in place; it once
            rebuilt all its evidence), then a pause: an admin's pace."""
            n[0] += 1
            r = c.post("/v1/measurements/failures/clear", json=clear_body(self.measurable[0], n[0]))
            self.stop.wait(CLEAR_PAUSE_S)
            return r

        calls = {
            "previews": preview,
            "summaries": lambda c: c.get("/v1/selections/summary"),
            "reports": self._reports,
            "clears": clear,
        }
        for kind in kinds:
            t = threading.Thread(target=self._loop, args=(kind, calls[kind]), daemon=True)
            t.start()
            self.threads.append(t)

    def finish(self) -> dict[str, Any]:
        """Stop, letting the operation in flight end (so it cannot disturb the next)."""
        self.stop.set()
        for t in self.threads:
            t.join(600)
        return {"completed": dict(self.counts), "errors": self.errors[:5]}


SCENARIOS: dict[str, list[str]] = {
    "idle": [],
    "previews": ["previews"],
    "summaries": ["summaries"],
    "reports": ["reports"],
    "clears": ["clears"],
    "all": ["previews", "summaries", "reports", "clears"],
}
CLEAR_PAUSE_S = 2.0
"""Seconds between two failure clears in the 'clears' scenario."""


def measure_load(
    service: Service,
    fleet: list[Pod],
    *,
    rate: float,
    seconds: float,
    rounds: int,
    report_rate: float,
    seed: int = 3,
    scenarios: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Select latency at ``rate`` requests/s in each scenario (default ``SCENARIOS``:
    name -> the background loads it runs); the scenarios alternate
    within a round so that the shared machine's noise hits each alike. Per scenario:
    the median over rounds of p50 and p99, and the worst max."""
    rng = random.Random(seed)
    requests = [
        http_select(p.request, service.port) for p in rng.sample(fleet, min(2000, len(fleet)))
    ]
    SelectLoad(service.port, requests, rate, 2.0).result()  # warm-up
    scenarios = SCENARIOS if scenarios is None else scenarios
    per: dict[str, list[dict[str, Any]]] = {k: [] for k in scenarios}
    for r in range(rounds):
        for name, kinds in scenarios.items():
            background = Background(service, fleet, report_rate)
            seen = server_view(service)
            background.start(kinds)
            load = SelectLoad(service.port, requests, rate, seconds)
            result = load.result()
            bg = background.finish()
            server = server_diff(seen, server_view(service))
            stats = latency_stats([lat for _, lat in result["samples"]])
            stats.update(
                errors=len(result["errors"]) + result["unanswered"],
                error_samples=sorted(set(result["errors"]))[:5],
                background=bg,
                server_side=server,
                client_nice=result.get("client_nice"),
            )
            per[name].append(stats)
            print(
                f"    round {r + 1}/{rounds} {name:9s} p50 {stats.get('p50_ms', 0):7.1f} ms  "
                f"p99 {stats.get('p99_ms', 0):7.1f} ms  max {stats.get('max_ms', 0):7.1f} ms  "
                f"errors {stats['errors']}  done meanwhile {bg['completed']}\n"
                f"      service: {server['over_10ms']}/{server['over_50ms']} of "
                f"{server['answered']} answers over 10/50 ms; loop late >10/>50 ms "
                f"{server['loop_late_over_10ms']}/{server['loop_late_over_50ms']} of "
                f"{server['loop_ticks']}; gc >10 ms {server['gc_over_10ms']} of "
                f"{server['gc_collections']}",
                flush=True,
            )
    out: dict[str, Any] = {}
    for name, runs in per.items():
        out[name] = {
            "p50_ms": round(statistics.median(x["p50_ms"] for x in runs), 2),
            "p99_ms": round(statistics.median(x["p99_ms"] for x in runs), 2),
            "max_ms": max(x["max_ms"] for x in runs),
            "errors": sum(x["errors"] for x in runs),
            "rounds": runs,
        }
    return out


# ---------------------------------------------------------------- one size


def run_size(args: argparse.Namespace, pods: int, log_dir: Path) -> dict[str, Any]:
    clusters = cluster_names(args.clusters)
    fleet = make_fleet(pods, args.clusters, args.deployments, seed=args.seed)
    per_pod, results = args.decisions_per_pod, round(pods * args.results_per_pod)
    label = f"{pods:,} pods: "
    print(
        f"\n== {pods:,} pods, {pods * per_pod:,} decision rows, {results:,} evidence "
        f"results, {args.clusters} clusters ({args.store})",
        flush=True,
    )
    out: dict[str, Any] = {
        "pods": pods,
        "decision_rows": pods * per_pod,
        "evidence_results": results,
        "clusters": args.clusters,
    }
    with database(args.store, args.pg, f"{pods}") as url:
        store = open_store(url)
        for cluster, spec in scenario_overrides(clusters).items():
            store.config.put_override(
                cluster, spec, actor="scale-bench", if_match=None, preview=None
            )
        out["fill_decisions"] = fill_decisions(store, fleet, per_pod, label=label)
        # decisions only: the replica's memory before any evidence is stored
        service = start_service(url, log_dir)
        try:
            out["start_s_decisions_only"] = service.started_s
            out["rss_decisions_only_start"] = service.memory_mb()
            with service.client() as c:
                ok(c.get("/v1/selections/summary"))
                ok(
                    c.put(
                        "/v1/overrides/*?dry_run=true",
                        json={"deny": ["FLASHINFER"], "note": "rss probe"},
                    )
                )
            out["rss_decisions_only_after_summary_preview"] = service.memory_mb()
        finally:
            service.stop()
        out["fill_evidence"] = fill_evidence(store, fleet, results, label=label)
        store.engine.dispose()
        service = start_service(url, log_dir)
        ops = Operations(service, fleet, clusters)
        try:
            out["start_s"] = service.started_s
            out["rss_start"] = service.memory_mb()
            print(f"    service ready in {service.started_s:.1f} s, {out['rss_start']}", flush=True)
            out["operations"] = measure_operations(ops, args.repeat)
            out["rss_after_operations"] = service.memory_mb()
            out["load"] = measure_load(
                service,
                fleet,
                rate=args.rate,
                seconds=args.load_seconds,
                rounds=args.load_rounds,
                report_rate=args.report_rate,
            )
            out["rss_end"] = service.memory_mb()
        finally:
            ops.close()
            service.stop()
    return out


# ------------------------------------------------------ one hot situation


def run_hot(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """``hot_pods`` pods of one cluster in one situation, policy measured, report
    ``hot_reports`` times 8 results each while selects of those pods run at ``rate``;
    then the same load for ``load_seconds`` afterwards."""
    pods, reports = args.hot_pods, args.hot_reports
    total = pods * reports * 8
    print(
        f"\n== one situation: {pods:,} pods x {reports} reports x 8 results = {total:,} "
        f"results, policy measured ({args.store})",
        flush=True,
    )
    base = {
        "device": {"name": "NVIDIA H200", "capability": [9, 0]},
        "model": MODELS[0][0],
        "dtype": "bfloat16",
        "packages": PACKAGE_SETS[0][0],
        "engine": None,  # our own kernels: every backend is a candidate
    }
    fleet = [
        Pod({"cluster": "hot-0000", "node": f"hot-gpu-{i // 8:04d}", "pod": f"r1-{i:05d}", **base})
        for i in range(pods)
    ]
    rng = random.Random(17)
    out: dict[str, Any] = {"pods": pods, "reports": pods * reports, "results": total}
    with database(args.store, args.pg, "hot") as url:
        store = open_store(url)
        fill_decisions(store, fleet, 1, label="one situation: ")
        store.engine.dispose()
        service = start_service(url, log_dir)
        try:
            with service.client() as c:
                ok(c.put("/v1/overrides/hot-0000", json={"policy": "measured", "note": "hot"}))
            requests = [http_select(p.request, service.port) for p in fleet]
            SelectLoad(service.port, requests, args.rate, 2.0).result()  # warm-up
            load = SelectLoad(service.port, requests, args.rate, 3600.0)
            time.sleep(1.0)
            began = time.monotonic()
            bodies = [report_of(p, rng, wrong_rate=0.0) for _ in range(reports) for p in fleet]
            progress = Progress("one situation: reports", len(bodies), "reports")
            sent, errors = _post_reports(
                service, bodies, args.hot_rate, progress, args.hot_max_seconds
            )
            ended = time.monotonic()
            progress.total = sent
            progress.finish()
            time.sleep(max(args.config_poll_s * 4, 2.0))  # every replica reloaded
            after_from = time.monotonic()
            time.sleep(args.load_seconds)
            load.stop.set()
            result = load.result()
            out["rss_end"] = service.memory_mb()
            with service.client() as c:
                r = ok(c.post("/v1/select", json=fleet[0].request)).json()
                out["final_answer_source"] = r["source"]
                out["server_side"] = server_select_latency(c.get("/metrics").text)
        finally:
            service.stop()
    during = [lat for at, lat in result["samples"] if began <= at < ended]
    after = [lat for at, lat in result["samples"] if at >= after_from]
    out.update(
        reports_sent=sent,
        results_sent=sent * 8,
        reporting_s=round(ended - began, 2),
        reports_per_s=round(sent / max(ended - began, 1e-9), 1),
        report_errors=errors,
        select_during=latency_stats(during),
        select_after=latency_stats(after),
        select_errors=len(result["errors"]) + result["unanswered"],
    )
    print(
        f"    server-side {out.get('server_side')}; "
        f"selects while reporting {out['select_during']}, afterwards "
        f"{out['select_after']}, answer source {out['final_answer_source']}",
        flush=True,
    )
    return out


def server_select_latency(metrics: str) -> dict[str, int]:
    """How many ``/v1/select`` answers the service itself timed over 10, 50 and 100 ms
    (its latency histogram), how often its event loop ran its 50 ms timer more than
    10 / 25 / 50 ms late (a held loop delays requests before any handler's clock
    starts), and how many garbage collections held the process that long: a stall a
    client measures that none of these shows is the client's own (a process
    descheduled on a shared machine). Counts since the service started; the
    difference of two readings is what happened between them (``server_diff``)."""
    buckets: dict[str, float] = {}
    lag: dict[str, float] = {}
    gc_pause: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("switchboard_gc_pause_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            gc_pause[le] = gc_pause.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
        if line.startswith("switchboard_event_loop_lag_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            lag[le] = float(line.rsplit(" ", 1)[1])
        if line.startswith("switchboard_request_seconds_bucket{") and (
            'route="/v1/select"' in line and 'status="200"' in line
        ):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    total = buckets.get("+Inf", 0.0)
    ticks = lag.get("+Inf", 0.0)
    collections = gc_pause.get("+Inf", 0.0)
    return {
        "answered": int(total),
        "over_10ms": int(total - buckets.get("0.01", total)),
        "over_50ms": int(total - buckets.get("0.05", total)),
        "over_100ms": int(total - buckets.get("0.1", total)),
        "loop_ticks": int(ticks),
        "loop_late_over_10ms": int(ticks - lag.get("0.01", ticks)),
        "loop_late_over_25ms": int(ticks - lag.get("0.025", ticks)),
        "loop_late_over_50ms": int(ticks - lag.get("0.05", ticks)),
        "gc_collections": int(collections),
        "gc_over_10ms": int(collections - gc_pause.get("0.01", collections)),
        "gc_over_25ms": int(collections - gc_pause.get("0.025", collections)),
        "gc_over_50ms": int(collections - gc_pause.get("0.05", collections)),
    }


def server_diff(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What the service counted between two ``server_select_latency`` readings."""
    return {k: after[k] - before.get(k, 0) for k in after}


def server_view(service: Service) -> dict[str, int]:
    with service.client() as c:
        return server_select_latency(ok(c.get("/metrics")).text)


def _post_reports(
    service: Service,
    bodies: list[dict[str, Any]],
    rate: float,
    progress: Progress,
    max_seconds: float,
) -> tuple[int, int]:
    """POST the reports at most ``rate`` per second, 8 in flight at most, for at most
    ``max_seconds`` (where the service slows down as evidence grows, the rest are not
    sent). Returns (reports sent, reports refused or not counted)."""
    sent, errors = [0], [0]
    lock = threading.Lock()
    local = threading.local()
    start = time.monotonic()

    def post(i: int) -> None:
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if time.monotonic() - start > max_seconds:
            return
        if not hasattr(local, "client"):
            local.client = service.client()
        r = local.client.post("/v1/measurements", json=bodies[i])
        with lock:
            sent[0] += 1
            errors[0] += r.status_code >= 300 or not r.json().get("counted")
            progress.update(sent[0])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(post, range(len(bodies))))
    return sent[0], errors[0]


# ---------------------------------------------------------------- the table

ROWS: list[tuple[str, str, Callable[[dict[str, Any]], float | None]]] = [
    ("GET /v1/selections/summary", "s", lambda s: s["operations"]["summary"]["median_s"]),
    ("dashboard initial load (its API calls)", "s",
     lambda s: s["operations"]["dashboard"]["median_s"]),
    ("PUT /v1/overrides/{c}?dry_run=true, one cluster", "s",
     lambda s: s["operations"]["preview_cluster"]["median_s"]),
    ("PUT /v1/overrides/*?dry_run=true", "s",
     lambda s: s["operations"]["preview_fleet"]["median_s"]),
    ("admin PUT override", "s", lambda s: s["operations"]["admin_put"]["median_s"]),
    ("admin DELETE override", "s", lambda s: s["operations"]["admin_delete"]["median_s"]),
    ("select p50 at 300 req/s, idle", "ms", lambda s: s["load"]["idle"]["p50_ms"]),
    ("select p99 at 300 req/s, idle", "ms", lambda s: s["load"]["idle"]["p99_ms"]),
    ("select p99 while previews of * run", "ms", lambda s: s["load"]["previews"]["p99_ms"]),
    ("select p99 while summaries run", "ms", lambda s: s["load"]["summaries"]["p99_ms"]),
    ("select p99 while evidence reports stream", "ms",
     lambda s: s["load"]["reports"]["p99_ms"]),
    ("select p99 while failure clears run", "ms",
     lambda s: s["load"].get("clears", {}).get("p99_ms")),
    ("select p99 while all four run", "ms", lambda s: s["load"]["all"]["p99_ms"]),
    ("select p99 while all four run, x idle", "x", lambda s: _ratio(s, "all")),
    ("service RSS after start, decisions only", "MB",
     lambda s: s["rss_decisions_only_start"].get("VmRSS")),
    ("service RSS peak, decisions only", "MB",
     lambda s: s["rss_decisions_only_after_summary_preview"].get("VmHWM")),
    ("service RSS after start, with evidence", "MB", lambda s: s["rss_start"].get("VmRSS")),
    ("service RSS peak, with evidence", "MB", lambda s: s["rss_end"].get("VmHWM")),
]  # fmt: skip


def _ratio(size: dict[str, Any], scenario: str) -> float | None:
    """A scenario's select p99 over the idle one of the same run."""
    idle = size["load"]["idle"]["p99_ms"]
    loaded = size["load"].get(scenario, {}).get("p99_ms")
    return None if not idle or loaded is None else loaded / idle


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.1f}x"
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    if unit == "ms":
        return f"{value:.1f} ms"
    return f"{value:.0f} MB"


def table(sizes: dict[str, dict[str, Any]], hot: dict[str, Any] | None) -> str:
    """A Markdown table: one row per operation, one column per size, and the growth
    per 10x (the ratio of consecutive sizes' figures)."""
    keys = list(sizes)
    head = ["operation", *(f"{int(k):,} pods" for k in keys), "growth per 10x"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] if keys else []
    for label, unit, get in ROWS if keys else []:
        values = [get(sizes[k]) for k in keys]
        growth = [
            f"{b / a:.1f}x" if a and b is not None else "-" for a, b in itertools.pairwise(values)
        ]
        row = [label, *(fmt(v, unit) for v in values), ", ".join(growth) or "-"]
        lines.append("| " + " | ".join(row) + " |")
    if hot is not None:
        lines += [
            "",
            f"One situation, policy measured: {hot['results_sent']:,} of {hot['results']:,} "
            f"results ({hot['pods']:,} pods x {hot['reports'] // hot['pods']} reports x 8) "
            f"reported in {hot['reporting_s']:.1f} s ({hot['reports_per_s']:.0f} reports/s), "
            "selects at 300 req/s:",
            "",
            "| select wait | p50 | p99 | max |",
            "|---|---|---|---|",
        ]
        for name in ("select_during", "select_after"):
            s = hot[name]
            when = "while the results are reported" if name == "select_during" else "afterwards"
            lines.append(
                f"| {when} | {s.get('p50_ms', 0):.1f} ms | {s.get('p99_ms', 0):.1f} ms | "
                f"{s.get('max_ms', 0):.1f} ms |"
            )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    model = cpu_model()
    return {
        "node": platform.node(),
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "loadavg_start": list(os.getloadavg()),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Progress goes to stdout; the table is printed at the end and written, with "
        "every run's figures, to --out. See docs/scale.md.",
    )
    ap.add_argument(
        "--sizes",
        default="1000,10000,100000",
        help="fleet sizes in distinct pods, comma-separated; '' for none (default %(default)s)",
    )
    ap.add_argument(
        "--clusters",
        type=int,
        default=10,
        help="clusters the pods spread over, at least 4 (default 10; 1000 works)",
    )
    ap.add_argument(
        "--decisions-per-pod",
        type=int,
        default=10,
        help="recorded decisions per pod (default 10: 1,000,000 rows at 100,000 pods)",
    )
    ap.add_argument(
        "--results-per-pod",
        type=float,
        default=1.0,
        help="evidence results per pod, in reports of 8 (default 1.0)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="timed runs per operation, after one warm-up; medians (default 5)",
    )
    ap.add_argument(
        "--rate",
        type=float,
        default=300.0,
        help="select requests per second, open loop (default 300)",
    )
    ap.add_argument(
        "--load-seconds",
        type=float,
        default=10.0,
        help="seconds of select load per scenario and round (default 10)",
    )
    ap.add_argument(
        "--load-rounds",
        type=int,
        default=3,
        help="rounds over the load scenarios; medians (default 3)",
    )
    ap.add_argument(
        "--report-rate",
        type=float,
        default=20.0,
        help="evidence reports per second in the 'reports' scenario (default 20)",
    )
    ap.add_argument(
        "--hot-pods", type=int, default=2000, help="pods of the one-situation run (default 2000)"
    )
    ap.add_argument(
        "--hot-reports",
        type=int,
        default=4,
        help="reports of 8 results per pod in the one-situation run (default 4)",
    )
    ap.add_argument(
        "--hot-rate",
        type=float,
        default=100.0,
        help="reports per second in the one-situation run (default 100)",
    )
    ap.add_argument(
        "--hot-max-seconds",
        type=float,
        default=300.0,
        help="stop reporting in the one-situation run after this long (default 300)",
    )
    ap.add_argument("--skip-hot", action="store_true", help="leave out the one-situation run")
    ap.add_argument(
        "--sqlite", action="store_true", help="a SQLite file per size instead of PostgreSQL"
    )
    ap.add_argument(
        "--pg",
        default=PG_DSN,
        help="PostgreSQL server (default $SWITCHBOARD_BENCH_PG or %(default)s)",
    )
    ap.add_argument(
        "--deployments",
        type=int,
        default=8,
        help="distinct pod descriptions per cluster; pods are their replicas (default 8)",
    )
    ap.add_argument("--seed", type=int, default=7, help="the fleet's random seed")
    ap.add_argument("--out", default=str(RESULTS), help="JSON results (default %(default)s)")
    ap.add_argument(
        "--axis",
        choices=AXES,
        default="pods",
        help="what grows: pods (this module), overrides (clusters x overrides, "
        "bench/scale_overrides.py) or evidence (stored reports and one busy situation, "
        "bench/scale_evidence.py); each has its own --help (default %(default)s)",
    )
    args = ap.parse_args(argv)
    if args.clusters < 4:
        ap.error("--clusters: at least 4 (overrides, the previewed and the written cluster)")
    args.store = "sqlite" if args.sqlite else "postgresql"
    args.config_poll_s = float(os.environ.get("SWITCHBOARD_CONFIG_POLL_S", "0.5"))
    return args


AXES = ("pods", "overrides", "evidence")


def axis_main(argv: list[str] | None) -> Callable[[list[str] | None], int] | None:
    """The ``main`` of the module of ``--axis`` when it is not pods (None then)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--axis", choices=AXES, default="pods")
    known, _ = pre.parse_known_args(argv)
    if known.axis == "overrides":
        from bench.scale_overrides import main as overrides_main

        return overrides_main
    if known.axis == "evidence":
        from bench.scale_evidence import main as evidence_main

        return evidence_main
    return None


def main(argv: list[str] | None = None) -> int:
    other = axis_main(argv)
    if other is not None:
        return other(argv)
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    result: dict[str, Any] = {
        "benchmark": "scale: operations against a growing fleet and history (bench/scale.py)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "store": args.store,
        "parameters": {k: v for k, v in vars(args).items() if k not in ("pg", "axis")},
        "sizes": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sb-scale-logs-") as logs:
        log_dir = Path(logs)
        try:
            for pods in sizes:
                result["sizes"][str(pods)] = run_size(args, pods, log_dir)
                write(out, result, complete=False)  # a long run keeps what it measured
            result["hot_situation"] = None if args.skip_hot else run_hot(args, log_dir)
        except Exception:
            for log in sorted(log_dir.glob("*.log")):
                print(f"--- {log.name} (last lines)\n{log.read_text()[-2000:]}", file=sys.stderr)
            raise
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    print("\n" + table(result["sizes"], result["hot_situation"]))
    write(out, result, complete=True)
    print(f"\nwrote {out}")
    return 0


def write(path: Path, result: dict[str, Any], *, complete: bool) -> None:
    """The JSON results with the table; ``complete`` false while sizes remain."""
    text = table(result["sizes"], result.get("hot_situation"))
    path.write_text(json.dumps({**result, "complete": complete, "table": text}, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
