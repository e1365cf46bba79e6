"""``switchboard bench``: measure every backend that is valid on this pod, on its own GPU.

Why: static priority lists are guesses frozen in code; the fleet's own GPUs can say
which MLA prefill kernel is fastest for the model it really serves. The bench runs
every backend the torch-free specs accept for this pod (probed capability, packages
that really import, the model's dims and dtype) on a few representative prefill
shapes with the model's own head count, and reports each result with the exact
situation (device name, capability, dims, dtype, package versions) the service keys
its evidence by.

Two rules shape it:

* **Correct before fast.** Each backend is first compared with the fp32 reference
  (``kernels.measure.reference_check``) on small ragged batches: causal, a context
  chunk (fewer queries than keys, bottom-right mask) and non-causal. A backend that
  fails, or does not build, is reported ``correct: false`` with the error and never
  with a speed, so the service can exclude it instead of crowning it.
* **The budget is a promise.** No new step (a backend's check, or one backend on one
  shape) starts once the budget is spent; what was left out is listed as skipped and
  not reported. Steps run breadth-first (every backend's check, then every backend on
  the first shape, ...) so that a tight budget still yields comparable numbers for
  all backends on the same shape. ``select --measure`` runs the bench in a child
  process (:func:`measure_in_child`) so that even a kernel JIT-compiling past the
  budget cannot hold the boot.

Importing this module does not import torch; :func:`run_bench` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mla_switchboard.agent.api import PodDescription, describe_pod
from mla_switchboard.agent.errors import BadInputError
from mla_switchboard.agent.model_config import ModelDims
from mla_switchboard.agent.notes import Notes, log
from mla_switchboard.core.schemas import MeasurementReport
from mla_switchboard.core.specs import (
    SPECS,
    Backend,
    Capability,
    MLADims,
    SelectionContext,
    parse_backend,
)

__all__ = [
    "CHECK_CASES",
    "DEFAULT_CPU_SHAPES",
    "DEFAULT_GPU_SHAPES",
    "BenchInterrupted",
    "BenchOutcome",
    "BenchPlan",
    "BenchShape",
    "CheckCase",
    "Skip",
    "bench_args_from",
    "build_report",
    "format_table",
    "interruptible",
    "measure_in_child",
    "parse_shapes",
    "plan_bench",
    "run_bench",
    "to_document",
]

MAX_TOKENS_PER_SHAPE = 1 << 20
"""The schema's bound on one sequence; also a sane cap on one benchmark batch."""
TIME_PER_SHAPE_S = 3.0
"""Timed calls of one backend on one shape stop at about this (a slow fp32 reference
on a long shape would otherwise take most of a boot budget for a number nobody needs
to the third digit)."""
MIN_ITERS = 3
MAX_WARMUP = 5


@dataclass(frozen=True)
class BenchShape:
    """A dense prefill batch: ``batch`` sequences of ``seqlen`` tokens."""

    batch: int
    seqlen: int

    @property
    def seqlens(self) -> list[int]:
        return [self.seqlen] * self.batch

    @property
    def label(self) -> str:
        return f"{self.batch}x{self.seqlen}"


DEFAULT_GPU_SHAPES = (BenchShape(8, 512), BenchShape(1, 8192))
"""A short-prompt batch and one long prompt: the two regimes prefill kernels differ in."""
DEFAULT_CPU_SHAPES = (BenchShape(2, 64), BenchShape(1, 256))
"""The GPU shapes scaled down: on a CPU only the fp32 reference runs, slowly."""


@dataclass(frozen=True)
class CheckCase:
    """One reference comparison: kv lengths, causal, and whether queries are the last
    quarter of each sequence (a context chunk)."""

    seqlens: tuple[int, ...]
    causal: bool = True
    context_chunk: bool = False

    @property
    def label(self) -> str:
        kind = "context chunk" if self.context_chunk else "causal" if self.causal else "non-causal"
        return f"{kind} {list(self.seqlens)}"


CHECK_CASES = (
    CheckCase((1, 37, 200)),
    CheckCase((64, 300), context_chunk=True),
    CheckCase((5, 130), causal=False),
)
"""Ragged and odd lengths (a single token, a non-multiple of any tile) where masking
and LSE mistakes show, small enough to cost milliseconds even on a CPU."""


class BenchInterrupted(BaseException):
    """Raised in the main thread when the boot's budget runs out (SIGTERM from
    ``select --measure``). A BaseException so that kernels' ``except Exception`` in
    sweeps cannot swallow it."""


@dataclass
class Skip:
    """A step that did not run, and why (not reported to the service)."""

    backend: str
    shape: str | None
    reason: str


@dataclass
class BenchPlan:
    """What one bench run will do, decided before any kernel runs."""

    pod: PodDescription
    device: str
    device_name: str | None
    capability: tuple[int, int] | None
    shapes: list[BenchShape]
    backends: list[Backend]
    unavailable: dict[str, list[str]]
    iters: int
    budget_s: float
    notes: Notes = field(default_factory=Notes)

    @property
    def model(self) -> ModelDims:
        return self.pod.model

    @property
    def num_heads(self) -> int:
        assert self.pod.model.num_heads is not None
        return self.pod.model.num_heads


@dataclass
class BenchOutcome:
    """What ran: results in the report's shape, reference checks, skipped steps."""

    results: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[Skip] = field(default_factory=list)
    elapsed_s: float = 0.0
    interrupted: bool = False


# -------------------------------------------------------------------- planning


def parse_shapes(text: str) -> list[BenchShape]:
    """``"4x4096,1x16384"`` (batch x tokens per sequence); BadInputError when malformed."""
    shapes: list[BenchShape] = []
    for item in filter(None, (p.strip().lower() for p in text.split(","))):
        batch_text, sep, len_text = item.partition("x")
        try:
            batch, seqlen = int(batch_text), int(len_text)
        except ValueError:
            batch, seqlen = 0, 0
        if not sep or batch <= 0 or seqlen <= 0:
            raise BadInputError(
                f"shape {item!r} is not BATCHxTOKENS with positive numbers (e.g. 8x512)"
            )
        if batch > 4096 or batch * seqlen > MAX_TOKENS_PER_SHAPE:
            raise BadInputError(
                f"shape {item!r} is too large (at most 4096 sequences and "
                f"{MAX_TOKENS_PER_SHAPE} tokens in all)"
            )
        if BenchShape(batch, seqlen) not in shapes:
            shapes.append(BenchShape(batch, seqlen))
    if not shapes:
        raise BadInputError(f"no shape in {text!r} (want e.g. 8x512,1x8192)")
    return shapes


def _cuda_info(device: str) -> tuple[str | None, tuple[int, int] | None]:
    """Name and capability of a ``cuda:N`` device, straight from torch."""
    import torch

    dev = torch.device(device)
    index = dev.index if dev.index is not None else 0
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise BadInputError(f"device {device} requested but there is no such CUDA device")
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), (int(major), int(minor))


def _resolve_device(
    requested: str | None, pod: PodDescription
) -> tuple[str, str | None, tuple[int, int] | None]:
    """The torch device to run on, with the name and capability to report for it.

    A CPU run reports no device (capability null): its numbers are not evidence for
    any GPU, and the service keys evidence by the exact device.
    """
    probed = pod.request.device
    if requested is None:
        if probed.capability is None:
            return "cpu", None, None
        return "cuda:0", probed.name, probed.capability
    text = requested.strip().lower()
    if text == "cpu":
        return "cpu", None, None
    if text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        device = "cuda:0" if text == "cuda" else text
        if probed.capability is None:
            raise BadInputError(f"device {requested} requested but this pod has no CUDA device")
        if device == "cuda:0" and pod.device.via == "torch":
            return device, probed.name, probed.capability
        name, capability = _cuda_info(device)
        return device, name, capability
    raise BadInputError(f"device {requested!r} is not cpu, cuda or cuda:N")


def plan_bench(
    model: str | os.PathLike[str] | Mapping[str, Any] | None,
    *,
    cluster: str | None,
    dtype: str | None = None,
    backends: Sequence[str] | None = None,
    shapes: str | Sequence[BenchShape] | None = None,
    device: str | None = None,
    budget_s: float = 300.0,
    iters: int = 20,
    qk_nope_head_dim: int | None = None,
    qk_rope_head_dim: int | None = None,
    v_head_dim: int | None = None,
    num_heads: int | None = None,
    model_name: str | None = None,
    node: str | None = None,
    pod: str | None = None,
) -> BenchPlan:
    """Describe the pod and decide which backends and shapes to run.

    Everything that can be wrong with the input raises BadInputError here, before
    any kernel runs: not an MLA model, no head count, an unknown backend name, a
    malformed shape, a CUDA device the pod does not have.
    """
    notes = Notes()
    if not budget_s > 0:
        raise BadInputError(f"budget must be positive, got {budget_s!r}")
    if iters < 1:
        raise BadInputError(f"iters must be at least 1, got {iters!r}")
    wanted: list[Backend] | None = None
    if backends is not None:
        try:
            wanted = [parse_backend(b) for b in backends if b.strip()]
        except ValueError as exc:
            raise BadInputError(str(exc)) from None
        if not wanted:
            raise BadInputError("--backends names no backend")
    description = describe_pod(
        model,
        cluster=cluster,
        dtype=dtype,
        qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=qk_rope_head_dim,
        v_head_dim=v_head_dim,
        num_heads=num_heads,
        model_name=model_name,
        packages="probe",
        node=node,
        pod=pod,
        notes=notes,
    )
    if description.model.num_heads is None:
        raise BadInputError(
            "the model config has no num_attention_heads; give the head count with --num-heads"
        )
    torch_device, name, capability = _resolve_device(device, description)

    if shapes is None:
        chosen = list(DEFAULT_CPU_SHAPES if torch_device == "cpu" else DEFAULT_GPU_SHAPES)
        if torch_device == "cpu":
            gpu = ", ".join(s.label for s in DEFAULT_GPU_SHAPES)
            notes.info(
                f"no GPU: only TORCH_SDPA can run, on shapes scaled down from the GPU "
                f"defaults ({gpu}) to {', '.join(s.label for s in chosen)}"
            )
    elif isinstance(shapes, str):
        chosen = parse_shapes(shapes)
    else:
        chosen = list(shapes)

    request = description.request
    ctx = SelectionContext(
        capability=None if capability is None else Capability(*capability),
        dims=MLADims(
            request.model.qk_nope_head_dim,
            request.model.qk_rope_head_dim,
            request.model.v_head_dim,
        ),
        dtype=request.dtype,
        packages=request.packages if request.packages is not None else {},
    )
    runnable: list[Backend] = []
    unavailable: dict[str, list[str]] = {}
    # Seed priority order, the fp32 reference last: it is the slowest to time.
    order = [b for b in Backend if b is not Backend.TORCH_SDPA] + [Backend.TORCH_SDPA]
    for backend in order:
        if wanted is not None and backend not in wanted:
            continue
        reasons = SPECS[backend].validate(ctx)
        if reasons:
            unavailable[backend.value] = reasons
        else:
            runnable.append(backend)
    return BenchPlan(
        pod=description,
        device=torch_device,
        device_name=name,
        capability=capability,
        shapes=chosen,
        backends=runnable,
        unavailable=unavailable,
        iters=iters,
        budget_s=budget_s,
        notes=notes,
    )


# --------------------------------------------------------------------- running


class _Interrupts:
    """SIGTERM raises BenchInterrupted while measuring, and is held back otherwise.

    Held back (remembered, not acted on) during the report's POST: that is bounded
    by its own deadline, and losing the measurements to a signal that arrives a
    second too late would waste the whole run.
    """

    def __init__(self) -> None:
        self.armed = False
        self.received = False

    def handler(self, signum: int, frame: object) -> None:
        self.received = True
        if self.armed:
            self.armed = False
            raise BenchInterrupted(f"signal {signum}")

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        if self.received:
            raise BenchInterrupted("signal received before measuring")
        self.armed = True
        try:
            yield
        finally:
            self.armed = False


@contextlib.contextmanager
def interruptible() -> Iterator[_Interrupts]:
    """Install the SIGTERM handler (main thread only) for the duration of a bench."""
    state = _Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = signal.signal(signal.SIGTERM, state.handler)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, previous)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or "(no message)"
    return f"{type(exc).__name__}: {text}"[:4000]


def _cuda_healthy(device: str) -> bool:
    """False once a kernel has broken the CUDA context (a sticky error such as an
    illegal memory access): every later backend would fail for a reason not its own."""
    import torch

    if not device.startswith("cuda"):
        return True
    try:
        torch.ones(1, device=device).add_(1)
        torch.cuda.synchronize(device)
    except Exception:
        return False
    return True


def _failure(backend: Backend, impl: str | None, shape: BenchShape, heads: int, error: str) -> dict:
    return {
        "backend": backend.value,
        "impl": impl,
        "shape": {"seqlens": shape.seqlens, "num_heads": heads},
        "median_ms": None,
        "tflops": None,
        "correct": False,
        "error": error[:8000],
    }


def _iterations(plan: BenchPlan, per_call_ms: float, remaining_s: float) -> tuple[int, int]:
    """(warmup, iters) that keep one shape near TIME_PER_SHAPE_S and inside the budget."""
    per_call_ms = max(per_call_ms, 1e-3)
    by_time = int(TIME_PER_SHAPE_S * 1e3 / per_call_ms)
    by_budget = int(max(0.0, remaining_s) * 1e3 / per_call_ms / 1.25)
    floor = min(MIN_ITERS, plan.iters)
    iters = max(floor, min(plan.iters, by_time, by_budget))
    warmup = min(MAX_WARMUP, max(1, iters // 4))
    return warmup, iters


def run_bench(
    plan: BenchPlan,
    *,
    kernel_classes: Mapping[Backend, type] | None = None,
    started: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    interrupts: _Interrupts | None = None,
) -> BenchOutcome:
    """Check, then time, every runnable backend of ``plan``, within its budget.

    ``kernel_classes`` replaces ``kernels.get(backend)`` for some backends: the hook
    the tests use to run a deliberately wrong kernel through the real checks.
    ``started`` is when the budget began (default: now).
    """
    import torch
    from mla_switchboard import kernels
    from mla_switchboard.kernels.measure import benchmark, reference_check, reference_outputs

    start = clock() if started is None else started
    deadline = start + plan.budget_s
    heads = plan.num_heads
    dtype = plan.pod.request.dtype
    model = plan.model
    outcome = BenchOutcome()
    instances: dict[Backend, Any] = {}
    references: dict[CheckCase, Any] = {}
    steps: list[tuple[Backend, BenchShape | None]] = [(b, None) for b in plan.backends]
    steps += [(b, s) for s in plan.shapes for b in plan.backends]
    failed: set[Backend] = set()
    guard = interrupts.measuring() if interrupts is not None else contextlib.nullcontext()

    def skip_rest(index: int, reason: str) -> None:
        """List every step from ``index`` on as skipped, except those of backends that
        already failed (their results are reported)."""
        for backend, shape in steps[index:]:
            if backend not in failed:
                label = None if shape is None else shape.label
                outcome.skipped.append(Skip(backend.value, label, reason))

    def fail_backend(backend: Backend, impl: str | None, error: str) -> None:
        failed.add(backend)
        for shape in plan.shapes:
            outcome.results.append(_failure(backend, impl, shape, heads, error))

    def check(backend: Backend) -> None:
        t0 = clock()
        cls = (kernel_classes or {}).get(backend) or kernels.get(backend)
        try:
            inst = cls.create(
                heads,
                model.qk_nope_head_dim,
                model.qk_rope_head_dim,
                model.v_head_dim,
                model.softmax_scale,
                dtype.value,
                plan.device,
            )
        except Exception as exc:  # import, CUDA and BackendUnavailable alike
            error = f"failed to build: {_describe(exc)}"
            outcome.checks[backend.value] = {"ok": False, "impl": None, "error": error}
            fail_backend(backend, None, error)
            log.warning("bench %s: %s", backend, error)
            return
        worst_out = worst_lse = 0.0
        for case in CHECK_CASES:
            if case not in references:
                references[case] = reference_outputs(
                    num_heads=heads,
                    dims=inst.dims,
                    softmax_scale=model.softmax_scale,
                    seqlens=case.seqlens,
                    causal=case.causal,
                    dtype=dtype.value,
                    device=plan.device,
                    q_shorter_than_kv=case.context_chunk,
                )
            result = reference_check(
                inst,
                seqlens=case.seqlens,
                causal=case.causal,
                dtype=dtype.value,
                device=plan.device,
                q_shorter_than_kv=case.context_chunk,
                reference=references[case],
            )
            worst_out = max(worst_out, result.max_abs_err_out)
            worst_lse = max(worst_lse, result.max_abs_err_lse)
            if not result.ok:
                error = (
                    f"reference check failed on {case.label}: {result.error} (max abs error "
                    f"out {result.max_abs_err_out:.3g}, lse {result.max_abs_err_lse:.3g})"
                )
                outcome.checks[backend.value] = {
                    "ok": False,
                    "impl": inst.impl,
                    "error": error,
                    "max_abs_err_out": result.max_abs_err_out,
                    "max_abs_err_lse": result.max_abs_err_lse,
                }
                fail_backend(backend, inst.impl, error)
                log.warning("bench %s (%s): %s", backend, inst.impl, error)
                return
        outcome.checks[backend.value] = {
            "ok": True,
            "impl": inst.impl,
            "error": None,
            "max_abs_err_out": worst_out,
            "max_abs_err_lse": worst_lse,
            "cases": [c.label for c in CHECK_CASES],
        }
        instances[backend] = inst
        log.info(
            "bench %s (%s): matches the fp32 reference on %d ragged batches (max abs error "
            "out %.3g, lse %.3g) [%.1f s]",
            backend,
            inst.impl,
            len(CHECK_CASES),
            worst_out,
            worst_lse,
            clock() - t0,
        )

    def time_shape(backend: Backend, shape: BenchShape) -> None:
        inst = instances[backend]
        try:
            probe = benchmark(
                inst, seqlens=shape.seqlens, num_heads=heads, dtype=dtype.value,
                device=plan.device, warmup=1, iters=1,
            )  # fmt: skip
            warmup, iters = _iterations(plan, probe.median_ms, deadline - clock())
            result = benchmark(
                inst, seqlens=shape.seqlens, num_heads=heads, dtype=dtype.value,
                device=plan.device, warmup=warmup, iters=iters,
            )  # fmt: skip
        except Exception as exc:  # OOM, CUDA error: this kernel cannot run this shape
            error = f"failed on {shape.label} H{heads}: {_describe(exc)}"
            outcome.results.append(_failure(backend, inst.impl, shape, heads, error))
            log.warning("bench %s (%s): %s", backend, inst.impl, error)
            return
        if not result.median_ms > 0:  # below the timer's resolution: no usable number
            reason = f"too fast to time ({result.median_ms} ms a call); use a larger shape"
            outcome.skipped.append(Skip(backend.value, shape.label, reason))
            log.warning("bench %s %s H%d: %s", backend, shape.label, heads, reason)
            return
        outcome.results.append(
            {
                "backend": backend.value,
                "impl": inst.impl,
                "shape": {"seqlens": shape.seqlens, "num_heads": heads},
                "median_ms": result.median_ms,
                "tflops": result.tflops,
                "correct": True,
                "error": None,
            }
        )
        log.info(
            "bench %s %s H%d: %.3f ms, %.4g TFLOP/s (%s, median of %d)",
            backend,
            shape.label,
            heads,
            result.median_ms,
            result.tflops,
            inst.impl,
            iters,
        )

    index = 0
    try:
        with guard:
            while index < len(steps):
                backend, shape = steps[index]
                if backend in failed:
                    index += 1
                    continue
                if clock() >= deadline:
                    skip_rest(index, f"the time budget of {plan.budget_s:g}s was spent")
                    index = len(steps)
                    break
                before = len(outcome.results)
                if shape is None:
                    check(backend)
                else:
                    time_shape(backend, shape)
                index += 1
                broke = any(not r["correct"] for r in outcome.results[before:])
                if broke and not _cuda_healthy(plan.device):
                    skip_rest(index, f"the CUDA context broke after {backend} failed")
                    index = len(steps)
    except BenchInterrupted:
        outcome.interrupted = True
        skip_rest(index, "stopped: the boot's time budget ran out")
    finally:
        instances.clear()
        references.clear()
        if plan.device.startswith("cuda"):
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()
    outcome.elapsed_s = clock() - start
    return outcome


# ------------------------------------------------------------------- reporting


def build_report(plan: BenchPlan, outcome: BenchOutcome) -> MeasurementReport | None:
    """The ``POST /v1/measurements`` body, or None when nothing was measured."""
    if not outcome.results:
        return None
    request = plan.pod.request
    return MeasurementReport.model_validate(
        {
            # one id per run, so that a retried POST (answer lost) is stored once
            "report_id": uuid.uuid4().hex[:26],
            "cluster": request.cluster,
            "pod": request.pod or "unknown",
            "node": request.node,
            "device": {"name": plan.device_name, "capability": plan.capability},
            "model": request.model.model_dump(mode="json"),
            "dtype": request.dtype.value,
            "packages": dict(request.packages or {}),
            "results": outcome.results,
        }
    )


def to_document(
    plan: BenchPlan,
    outcome: BenchOutcome,
    *,
    report: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``--format json`` document: the situation, every result, what was skipped,
    and what became of the report (``report``: posted, measurement_id, url, error)."""
    request = plan.pod.request
    return {
        "cluster": request.cluster,
        "pod": request.pod,
        "node": request.node,
        "device": {
            "name": plan.device_name,
            "capability": None if plan.capability is None else list(plan.capability),
            "torch_device": plan.device,
        },
        "model": request.model.model_dump(mode="json"),
        "dtype": request.dtype.value,
        "packages": dict(request.packages or {}),
        "shapes": [s.label for s in plan.shapes],
        "budget_s": plan.budget_s,
        "elapsed_s": round(outcome.elapsed_s, 3),
        "interrupted": outcome.interrupted,
        "results": outcome.results,
        "checks": outcome.checks,
        "skipped": [asdict(s) for s in outcome.skipped],
        "unavailable": plan.unavailable,
        "notes": list(plan.notes),
        "report": dict(report),
    }


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(plan: BenchPlan, outcome: BenchOutcome) -> str:
    """A fixed-width table for people: results, then skipped and unavailable backends."""
    heads = plan.num_heads
    rows: list[tuple[str, ...]] = [
        ("backend", "impl", "shape", "correct", "median ms", "TFLOP/s", "note")
    ]
    for r in outcome.results:
        shape = f"{len(r['shape']['seqlens'])}x{r['shape']['seqlens'][0]} H{heads}"
        rows.append(
            (
                r["backend"],
                r["impl"] or "-",
                shape,
                "yes" if r["correct"] else "NO",
                _cell(r["median_ms"], 3),
                _cell(r["tflops"], 1 if (r["tflops"] or 0) >= 1 else 4),
                (r["error"] or "")[:160],
            )
        )
    for s in outcome.skipped:
        rows.append((s.backend, "-", s.shape or "(check)", "skipped", "-", "-", s.reason))
    for backend, reasons in plan.unavailable.items():
        rows.append((backend, "-", "-", "invalid", "-", "-", "; ".join(reasons)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [
            c.rjust(w) if i in (4, 5) else c.ljust(w)
            for i, (c, w) in enumerate(zip(row[:-1], widths, strict=True))
        ]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------- at boot (select)


def _child_env() -> dict[str, str]:
    """The environment with this checkout importable, whatever the cwd."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill what the child left in its process group (e.g. a JIT compiler)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def measure_in_child(bench_argv: Sequence[str], budget_s: float, notes: Notes) -> dict | None:
    """Run ``switchboard bench`` in a child process that cannot outlast ``budget_s``.

    The child measures for the budget less the time kept for its report; at the soft
    limit it gets SIGTERM (it stops measuring and reports what it has), at the budget
    SIGKILL for its whole process group. Returns its JSON document, or None (and a
    warning in ``notes``) when there is none: a failed measurement never fails a boot.
    """
    started = time.monotonic()
    post_s = min(3.0, max(0.5, budget_s * 0.1))
    measure_s = max(0.05, budget_s - post_s - 1.0)
    argv = [
        sys.executable, "-m", "mla_switchboard.agent.cli", "bench", *bench_argv,
        "--budget", f"{measure_s:.3f}", "--deadline", f"{post_s:.3f}", "--format", "json",
    ]  # fmt: skip
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=_child_env(),
            start_new_session=True,  # its own group: a stray compiler dies with it
        )
    except OSError as exc:
        notes.warn(f"could not start the measurement: {exc}")
        return None
    soft = started + budget_s - post_s - 0.5
    out = b""
    stopped = ""
    try:
        out, _ = proc.communicate(timeout=max(0.0, soft - time.monotonic()))
    except subprocess.TimeoutExpired:
        stopped = "stopped at its budget"
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=max(0.0, started + budget_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            stopped = "killed at its budget"
            _stop_group(proc)
            out, _ = proc.communicate()
        _stop_group(proc)
    finally:
        if proc.poll() is None:  # KeyboardInterrupt and the like
            _stop_group(proc)
            proc.wait()
    elapsed = time.monotonic() - started
    try:
        doc = json.loads(out.decode() or "null")
    except (UnicodeDecodeError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        why = stopped or f"it exited with code {proc.returncode}"
        notes.warn(f"measuring gave no result in {elapsed:.1f}s of a {budget_s:g}s budget ({why})")
        return None
    results = doc.get("results") or []
    correct = sum(1 for r in results if r.get("correct"))
    report = doc.get("report") or {}
    summary = (
        f"measured {len(results)} results ({correct} correct, {len(doc.get('skipped') or [])} "
        f"skipped) in {elapsed:.1f}s"
    )
    if stopped:
        summary += f"; {stopped}"
    if report.get("posted"):
        notes.info(f"{summary}; reported as measurement {report.get('measurement_id')}")
    elif results:
        notes.warn(f"{summary}; not reported: {report.get('error') or 'unknown reason'}")
    else:
        notes.info(f"{summary}; nothing to report")
    return doc


def bench_args_from(values: Mapping[str, Any]) -> list[str]:
    """``switchboard bench`` flags for the pod description ``select`` was given."""
    argv: list[str] = []
    for flag, key in (
        ("--model", "model"),
        ("--cluster", "cluster"),
        ("--dtype", "dtype"),
        ("--qk-nope-head-dim", "qk_nope_head_dim"),
        ("--qk-rope-head-dim", "qk_rope_head_dim"),
        ("--v-head-dim", "v_head_dim"),
        ("--num-heads", "num_heads"),
        ("--model-name", "model_name"),
        ("--node", "node"),
        ("--pod", "pod"),
    ):
        value = values.get(key)
        if value is not None:
            argv += [flag, str(value)]
    for url in values.get("urls") or ():
        argv += ["--url", url]
    return argv
