"""Every MLA shape the spec accepts, run on the GPU at hand against the fp32 reference.

Why: the spec (``core/specs.py``) answers which backend may serve a model's dims; an
answer is only worth something if the backend's kernel then runs those dims. For each
dims class below, each dtype and each backend the spec accepts on this GPU, the
wrapper runs ragged batches (lengths 1, 37, 513, 2,048), causal and not, as
self-attention and as a context chunk, with 16 heads, and its output and LSE are
compared with the fp32 reference (``kernels.measure.reference_check``, the tolerances
of ``default_tolerances``). A backend the spec refuses here is listed with the spec's
reason; one whose package is missing, with the wrapper's.

    python3 -m bench.shape_sweep --out bench/results/h200/shapes.json

``tests/kernels/test_shape_coverage.py`` (CPU) fails when the spec accepts a dims class
for a capability with no passing result committed here, nor a written reason why it
cannot run on the machines lent to the project (``UNTESTED_MAJORS``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from mla_switchboard.core.engine_rules.switchboard import SWITCHBOARD
from mla_switchboard.core.engines import ENGINE_REGISTRY
from mla_switchboard.core.specs import (
    KERNEL_PACKAGES,
    SPECS,
    Backend,
    Capability,
    Dtype,
    MLADims,
    SelectionContext,
)

DIMS_CLASSES: dict[str, MLADims] = {
    "deepseek-r1": MLADims(128, 64, 128),
    "kimi-linear": MLADims(192, 64, 256),
    "qk128-v128": MLADims(64, 64, 128),
    "qk192-v64": MLADims(128, 64, 64),
    "qk256-norope": MLADims(256, 0, 256),
    "minicpm3-like": MLADims(64, 32, 64),
}
"""The dims classes of MLA models seen in the field, by (qk_nope, qk_rope, v): the
DeepSeek-R1/V3 dims, Kimi-Linear's, and the other head-dim pairs the spec's limits let
through (q/k 128 with v 128; q/k 192 with a narrower v; q/k 256 without rope; small
MiniCPM3-like heads, q/k 96 with v 64)."""

DTYPES = (Dtype.BFLOAT16, Dtype.FLOAT16)
SEQLENS = (1, 37, 513, 2048)
HEADS = 16
CASES = tuple(
    (causal, chunk) for causal in (True, False) for chunk in (False, True)
)  # (causal, context chunk)

UNTESTED_MAJORS: dict[int, str] = {
    8: "no Ampere or Ada GPU is lent to this project; the FA2 paths that run there "
    "(FlashInfer's JIT FA2, PyTorch's bundled FA2) ran on the H200 for the same dims",
    10: "no Blackwell GPU is lent to this project: FlashInfer's CUTLASS kernel, "
    "TRTLLM_RAGGED, TOKENSPEED_MLA and FA4 have not run here",
    11: "no Thor-class GPU is lent to this project",
    12: "no consumer Blackwell GPU is lent to this project",
}
"""Capability majors the spec accepts backends on but no machine here can test, and why."""


def accepted(backend: Backend, cap: Capability, dims: MLADims, dtype: Dtype) -> list[str]:
    """Why a pod running our own kernels would not be answered ``backend`` for these
    dims on ``cap`` (empty: it would), every package assumed present: the spec table's
    reasons and the neutral profile's, as the evaluator joins them."""
    return SWITCHBOARD.refusals(backend, SelectionContext(cap, dims, dtype, packages=None), None)


def run_case(
    backend: Backend, dims: MLADims, dtype: Dtype, *, causal: bool, chunk: bool
) -> dict[str, Any]:
    """One check of ``backend``'s wrapper on this GPU, as a JSON-ready dict."""
    from mla_switchboard import kernels
    from mla_switchboard.kernels.base import BackendUnavailable
    from mla_switchboard.kernels.measure import reference_check

    scale = 1.0 / math.sqrt(dims.qk_head_dim)
    try:
        inst = _instance(kernels, backend, dims, dtype, scale)
    except (BackendUnavailable, ImportError) as exc:
        return {"status": "unavailable", "reason": str(exc)}
    res = reference_check(
        inst,
        seqlens=list(SEQLENS),
        causal=causal,
        dtype=dtype.value,
        device="cuda",
        q_shorter_than_kv=chunk,
    )
    return {
        "status": "passed" if res.ok else "failed",
        "impl": inst.impl,
        "max_abs_err_out": res.max_abs_err_out,
        "max_abs_err_lse": res.max_abs_err_lse,
        "error": res.error,
    }


_INSTANCES: dict[tuple[Any, ...], Any] = {}


def _instance(kernels: Any, backend: Backend, dims: MLADims, dtype: Dtype, scale: float) -> Any:
    key = (backend, dims, dtype)
    if key not in _INSTANCES:
        _INSTANCES[key] = kernels.get(backend.value).create(
            HEADS, dims.qk_nope_head_dim, dims.qk_rope_head_dim, dims.v_head_dim,
            scale, dtype.value, "cuda",
        )  # fmt: skip
    return _INSTANCES[key]


def warm(backend: Backend, dims: MLADims, dtype: Dtype) -> str:
    """Build ``backend``'s kernel for these dims (a JIT build: FlashInfer compiles each
    (head dims, dtype) on first use, 70-80 s on the H200's host) and run it once."""
    from mla_switchboard import kernels
    from mla_switchboard.kernels.measure import make_inputs

    started = time.monotonic()
    try:
        inst = _instance(kernels, backend, dims, dtype, 1.0 / math.sqrt(dims.qk_head_dim))
        x = make_inputs(
            num_heads=HEADS, qk_head_dim=dims.qk_head_dim, v_head_dim=dims.v_head_dim,
            seqlens_q=[1, 37], dtype=dtype.value, device="cuda",
        )  # fmt: skip
        inst.prefill(**x, return_lse=True)
    except Exception as exc:  # reported by the sweep itself, with the reference
        return f"{backend} {dims} {dtype}: {type(exc).__name__}: {exc}"
    return f"{backend} {dims} {dtype}: built in {time.monotonic() - started:.0f} s"


def warm_all(cap: Capability, backends: set[Backend], workers: int) -> None:
    """The JIT builds of every accepted shape of ``backends``, ``workers`` at a time in
    processes of their own (the builds share the library's on-disk cache)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs = [
        (backend, dims, dtype)
        for dims in DIMS_CLASSES.values()
        for dtype in DTYPES
        for backend in backends
        if not accepted(backend, cap, dims, dtype)
    ]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        for line in pool.map(_warm_job, jobs):
            print("warm:", line, flush=True)


def _warm_job(job: tuple[Backend, MLADims, Dtype]) -> str:
    return warm(*job)


def sweep(
    cap: Capability, deadline_s: float | None = None, out: Path | None = None
) -> list[dict[str, Any]]:
    """Every (backend, dims class, dtype) on ``cap``: refused with the spec's reasons,
    or run over ``CASES``; written to ``out`` (when given) after each row, so a run
    cut short still leaves what it found."""
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    for name, dims in DIMS_CLASSES.items():
        for dtype in DTYPES:
            for backend in SPECS:
                row: dict[str, Any] = {
                    "backend": backend.value,
                    "dims_class": name,
                    "dims": [dims.qk_nope_head_dim, dims.qk_rope_head_dim, dims.v_head_dim],
                    "dtype": dtype.value,
                }
                reasons = accepted(backend, cap, dims, dtype)
                if reasons:
                    rows.append({**row, "status": "refused", "reasons": reasons})
                    continue
                if deadline_s is not None and time.monotonic() - started > deadline_s:
                    rows.append({**row, "status": "not run", "reason": "past the deadline"})
                    continue
                checks = []
                for causal, chunk in CASES:
                    checks.append(
                        {"causal": causal, "chunk": chunk}
                        | run_case(backend, dims, dtype, causal=causal, chunk=chunk)
                    )
                status = _overall(checks)
                rows.append({**row, "status": status, "checks": checks})
                print(f"{backend.value:14} {name:14} {dtype.value:9} {status}", flush=True)
                if status != "passed":
                    print(json.dumps(checks, default=str), flush=True)
                if out is not None:
                    write(out, rows, time.monotonic() - started)
    return rows


def _overall(checks: list[dict[str, Any]]) -> str:
    statuses = {c["status"] for c in checks}
    if statuses == {"passed"}:
        return "passed"
    if "failed" in statuses:
        return "failed"
    return statuses.pop() if len(statuses) == 1 else "mixed"


def machine() -> dict[str, Any]:
    import importlib

    import torch

    found: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn_library": torch.backends.cudnn.version(),
        "python": sys.version.split()[0],
    }
    engines = [e.distribution for e in ENGINE_REGISTRY if e.distribution is not None]
    for name in [*KERNEL_PACKAGES, *engines]:
        try:
            found[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as exc:  # absent, or a build that fails at import
            found[name] = f"not importable ({type(exc).__name__})"
    return found


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def write(out: Path, rows: list[dict[str, Any]], seconds: float) -> None:
    result = {
        "benchmark": "MLA shape sweep: every accepted (backend, dims class, dtype) against "
        "the fp32 reference (bench/shape_sweep.py)",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "seqlens": list(SEQLENS),
        "heads": HEADS,
        "cases": [{"causal": causal, "chunk": chunk} for causal, chunk in CASES],
        "seconds": round(seconds, 1),
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=None, help="seconds; then stop")
    parser.add_argument(
        "--warm", type=int, default=0, help="JIT-build FlashInfer's kernels first, N at a time"
    )
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: the sweep needs one (see bench/gpu_run.sh)")
        return 2
    cap = Capability(*torch.cuda.get_device_capability(0))
    started = time.monotonic()
    if args.warm:
        warm_all(cap, {Backend.FLASHINFER}, args.warm)
    left = None if args.deadline is None else args.deadline - (time.monotonic() - started)
    rows = sweep(cap, left, args.out)
    write(args.out, rows, time.monotonic() - started)
    bad = [r for r in rows if r["status"] not in ("passed", "refused")]
    print(f"wrote {args.out}: {len(rows)} rows, {len(bad)} neither passed nor refused")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
