"""Running a bench plan: correctness first, then speed, within the budget.

* **Correct before fast.** Each backend is first compared with the fp32 reference
  (``kernels.measure.reference_check``) on small ragged batches; one that fails, or
  does not build, is reported ``correct: false`` with the error and never a speed.
* **Timed as serving calls it.** A forward pass calls the prefill kernel once per
  attention layer, every call with the same offsets tensors (new ones each pass, as
  each step brings a new batch). The bench does the same: per timed pass, fresh
  offsets and ``plan.layers`` calls; the figure is the pass's time over its calls.
  A kernel that plans per batch pays the planning once per pass, as in serving, not
  on every call (too harsh) and not never (too kind).
* **The budget is a promise.** No new step (a backend's check, or one backend on one
  shape) starts once it is spent; steps run breadth-first so that a tight budget
  still gives comparable numbers for every backend on the first shape.

Importing this module does not import torch; :func:`run_bench` does.
"""

from __future__ import annotations

import contextlib
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mla_switchboard.agent.bench.plan import CHECK_CASES, BenchPlan, BenchShape, CheckCase
from mla_switchboard.agent.notes import log
from mla_switchboard.agent.probe import import_quietly
from mla_switchboard.core.specs import Backend

if TYPE_CHECKING:  # torch-importing: only for the annotations
    from mla_switchboard.kernels.base import MLAPrefillKernel

__all__ = [
    "BenchInterrupted",
    "BenchOutcome",
    "CheckOutcome",
    "Interrupts",
    "PassTiming",
    "ShapeResult",
    "Skip",
    "interruptible",
    "iterations",
    "run_bench",
    "time_forward_passes",
]

TIME_PER_SHAPE_S = 3.0
"""Timed passes of one backend on one shape stop at about this (a slow fp32 reference
on a long shape would otherwise take most of a boot budget for a number nobody needs
to the third digit)."""
MIN_PASSES = 3
MAX_WARMUP = 5


class BenchInterrupted(BaseException):
    """Raised in the main thread when the boot's budget runs out (SIGTERM from
    ``select --measure``). A BaseException so that kernels' ``except Exception`` in
    sweeps cannot swallow it."""


@dataclass(frozen=True)
class Skip:
    """A step that did not run, and why (not reported to the service)."""

    backend: str
    shape: str | None
    reason: str


@dataclass(frozen=True)
class CheckOutcome:
    """A backend's reference check: ``ok``, the code path, the worst errors seen."""

    ok: bool
    impl: str | None
    error: str | None = None
    max_abs_err_out: float | None = None
    max_abs_err_lse: float | None = None
    cases: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShapeResult:
    """One backend on one shape: a speed when correct, else the error and no speed.

    ``host_us`` is the host time one call took (launch and wrapper work, not the
    GPU's): shown to people, not part of the service's evidence.
    """

    backend: Backend
    impl: str | None
    shape: BenchShape
    num_heads: int
    correct: bool
    median_ms: float | None = None
    tflops: float | None = None
    error: str | None = None
    host_us: float | None = None

    def to_wire(self) -> dict[str, Any]:
        """The ``MeasurementResult`` of the report."""
        return {
            "backend": self.backend.value,
            "impl": self.impl,
            "shape": {"seqlens": self.shape.seqlens, "num_heads": self.num_heads},
            "median_ms": self.median_ms,
            "tflops": self.tflops,
            "correct": self.correct,
            "error": None if self.error is None else self.error[:8000],
        }


@dataclass
class BenchOutcome:
    """What ran: results per backend and shape, reference checks, skipped steps."""

    results: list[ShapeResult] = field(default_factory=list)
    checks: dict[str, CheckOutcome] = field(default_factory=dict)
    skipped: list[Skip] = field(default_factory=list)
    elapsed_s: float = 0.0
    interrupted: bool = False


@dataclass(frozen=True)
class PassTiming:
    """Per-call figures from timed forward passes (median over passes)."""

    median_ms: float
    tflops: float
    host_us: float
    passes: int
    layers: int


# -------------------------------------------------------------- interruption


class Interrupts:
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
def interruptible() -> Iterator[Interrupts]:
    """Install the SIGTERM handler (main thread only) for the duration of a bench."""
    state = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = signal.signal(signal.SIGTERM, state.handler)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------- timing


def iterations(max_passes: int, per_pass_ms: float, remaining_s: float) -> tuple[int, int]:
    """(warmup, timed) passes that keep one shape near TIME_PER_SHAPE_S and inside the
    budget, with at least MIN_PASSES (or ``max_passes`` when that is fewer)."""
    per_pass_ms = max(per_pass_ms, 1e-3)
    by_time = int(TIME_PER_SHAPE_S * 1e3 / per_pass_ms)
    by_budget = int(max(0.0, remaining_s) * 1e3 / per_pass_ms / 1.25)
    floor = min(MIN_PASSES, max_passes)
    passes = max(floor, min(max_passes, by_time, by_budget))
    warmup = min(MAX_WARMUP, max(1, passes // 4))
    return warmup, passes


def forward_inputs(kernel: Any, seqlens: list[int], dtype: str, device: str) -> dict[str, Any]:
    """Random q, k, v for self-attention over ``seqlens`` at the kernel's shape, with the
    offsets under ``cu_seqlens`` (each pass copies them: a new batch)."""
    from mla_switchboard.kernels.measure import make_inputs

    inputs = make_inputs(
        num_heads=kernel.num_heads,
        qk_head_dim=kernel.dims.qk_head_dim,
        v_head_dim=kernel.dims.v_head_dim,
        seqlens_q=seqlens,
        dtype=dtype,
        device=device,
    )
    inputs["cu_seqlens"] = inputs.pop("cu_seqlens_q")
    inputs.pop("cu_seqlens_k")
    return inputs


def time_forward_passes(
    kernel: Any, inputs: Mapping[str, Any], *, layers: int, warmup: int, passes: int
) -> PassTiming:
    """Time ``passes`` forward passes of ``layers`` prefill calls each (after
    ``warmup`` untimed ones); every pass gets new offsets tensors, shared by its calls.

    On CUDA a pass is timed with events around its calls (GPU time, idle gaps the
    host causes included: serving sees them too); on a CPU with the wall clock. The
    host time of the calls' launches is measured separately.
    """
    from mla_switchboard.kernels.measure import causal_flops

    torch = import_quietly("torch")
    base = inputs["cu_seqlens"]
    args = {k: v for k, v in inputs.items() if k != "cu_seqlens"}
    cuda = base.device.type == "cuda"

    def one_pass() -> tuple[float, float]:
        offsets = base.clone()  # this step's batch: a tensor the kernel has not seen
        start_event = end_event = None
        if cuda:
            start_event = torch.cuda.Event(enable_timing=True)
            end_event = torch.cuda.Event(enable_timing=True)
            start_event.record()
        t0 = time.perf_counter()
        for _ in range(layers):
            kernel.prefill(cu_seqlens_q=offsets, cu_seqlens_k=offsets, causal=True, **args)
        host_s = time.perf_counter() - t0
        if cuda:
            assert start_event is not None and end_event is not None
            end_event.record()
            end_event.synchronize()
            return start_event.elapsed_time(end_event), host_s
        return host_s * 1e3, host_s

    for _ in range(warmup):
        one_pass()
    if cuda:
        torch.cuda.synchronize(base.device)
    timed = [one_pass() for _ in range(passes)]
    per_call_ms = statistics.median(ms for ms, _ in timed) / layers
    host_us = statistics.median(h for _, h in timed) / layers * 1e6
    seqlens = [int(b) - int(a) for a, b in zip(base.tolist()[:-1], base.tolist()[1:], strict=True)]
    flops = causal_flops(
        seqlens,
        num_heads=kernel.num_heads,
        qk_head_dim=kernel.dims.qk_head_dim,
        v_head_dim=kernel.dims.v_head_dim,
        causal=True,
    )
    tflops = flops / (per_call_ms * 1e-3) / 1e12 if per_call_ms > 0 else 0.0
    return PassTiming(per_call_ms, tflops, host_us, passes, layers)


# -------------------------------------------------------------------- running


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or "(no message)"
    return f"{type(exc).__name__}: {text}"[:4000]


def _cuda_healthy(device: str) -> bool:
    """False once a kernel has broken the CUDA context (a sticky error such as an
    illegal memory access): every later backend would fail for a reason not its own."""
    if not device.startswith("cuda"):
        return True
    torch = import_quietly("torch")
    try:
        torch.ones(1, device=device).add_(1)
        torch.cuda.synchronize(device)
    except Exception:
        return False
    return True


class _Runner:
    """One run of a plan: the steps in order, the kernels built so far, the outcome."""

    def __init__(
        self,
        plan: BenchPlan,
        kernel_classes: Mapping[Backend, type[MLAPrefillKernel]] | None,
        clock: Callable[[], float],
        start: float,
    ) -> None:
        self.plan = plan
        self.kernel_classes = dict(kernel_classes or {})
        self.clock = clock
        self.start = start
        self.deadline = start + plan.budget_s
        self.outcome = BenchOutcome()
        self.kernels: dict[Backend, Any] = {}
        self.references: dict[CheckCase, Any] = {}
        self.failed: set[Backend] = set()
        self.steps: list[tuple[Backend, BenchShape | None]] = [(b, None) for b in plan.backends]
        self.steps += [(b, s) for s in plan.shapes for b in plan.backends]

    # --- bookkeeping
    def skip_rest(self, index: int, reason: str) -> None:
        """List every step from ``index`` on as skipped, except those of backends that
        already failed (their results are reported)."""
        for backend, shape in self.steps[index:]:
            if backend not in self.failed:
                label = None if shape is None else shape.label
                self.outcome.skipped.append(Skip(backend.value, label, reason))

    def fail_backend(self, backend: Backend, impl: str | None, error: str) -> None:
        """A backend that did not build or check: failed on every shape, no speed."""
        self.failed.add(backend)
        for shape in self.plan.shapes:
            self.outcome.results.append(
                ShapeResult(backend, impl, shape, self.plan.num_heads, False, error=error)
            )

    # --- steps
    def check(self, backend: Backend) -> None:
        """Build the kernel and compare it with the fp32 reference on CHECK_CASES."""
        from mla_switchboard import kernels
        from mla_switchboard.kernels.measure import reference_check, reference_outputs

        plan, t0 = self.plan, self.clock()
        model, dtype = plan.model, plan.pod.request.dtype.value
        cls = self.kernel_classes.get(backend) or kernels.get(backend)
        try:
            kernel = cls.create(
                plan.num_heads,
                model.qk_nope_head_dim,
                model.qk_rope_head_dim,
                model.v_head_dim,
                model.softmax_scale,
                dtype,
                plan.device,
            )
        except Exception as exc:  # import, CUDA and BackendUnavailable alike
            error = f"failed to build: {_describe(exc)}"
            self.outcome.checks[backend.value] = CheckOutcome(False, None, error)
            self.fail_backend(backend, None, error)
            log.warning("bench %s: %s", backend, error)
            return
        worst_out = worst_lse = 0.0
        for case in CHECK_CASES:
            if case not in self.references:
                self.references[case] = reference_outputs(
                    num_heads=plan.num_heads,
                    dims=kernel.dims,
                    softmax_scale=model.softmax_scale,
                    seqlens=case.seqlens,
                    causal=case.causal,
                    dtype=dtype,
                    device=plan.device,
                    q_shorter_than_kv=case.context_chunk,
                )
            result = reference_check(
                kernel,
                seqlens=case.seqlens,
                causal=case.causal,
                dtype=dtype,
                device=plan.device,
                q_shorter_than_kv=case.context_chunk,
                reference=self.references[case],
            )
            worst_out = max(worst_out, result.max_abs_err_out)
            worst_lse = max(worst_lse, result.max_abs_err_lse)
            if not result.ok:
                error = (
                    f"reference check failed on {case.label}: {result.error} (max abs error "
                    f"out {result.max_abs_err_out:.3g}, lse {result.max_abs_err_lse:.3g})"
                )
                self.outcome.checks[backend.value] = CheckOutcome(
                    False, kernel.impl, error, result.max_abs_err_out, result.max_abs_err_lse
                )
                self.fail_backend(backend, kernel.impl, error)
                log.warning("bench %s (%s): %s", backend, kernel.impl, error)
                return
        self.outcome.checks[backend.value] = CheckOutcome(
            True, kernel.impl, None, worst_out, worst_lse, tuple(c.label for c in CHECK_CASES)
        )
        self.kernels[backend] = kernel
        log.info(
            "bench %s (%s): matches the fp32 reference on %d ragged batches (max abs error "
            "out %.3g, lse %.3g) [%.1f s]",
            backend, kernel.impl, len(CHECK_CASES), worst_out, worst_lse, self.clock() - t0,
        )  # fmt: skip

    def time_shape(self, backend: Backend, shape: BenchShape) -> None:
        """Time ``backend`` on ``shape`` in forward passes; a crash fails this shape only."""
        plan, kernel = self.plan, self.kernels[backend]
        heads = plan.num_heads
        try:
            inputs = forward_inputs(kernel, shape.seqlens, plan.pod.request.dtype.value,
                                    plan.device)  # fmt: skip
            probe = time_forward_passes(kernel, inputs, layers=plan.layers, warmup=1, passes=1)
            warmup, passes = iterations(
                plan.iters, probe.median_ms * plan.layers, self.deadline - self.clock()
            )
            timing = time_forward_passes(
                kernel, inputs, layers=plan.layers, warmup=warmup, passes=passes
            )
        except Exception as exc:  # OOM, CUDA error: this kernel cannot run this shape
            error = f"failed on {shape.label} H{heads}: {_describe(exc)}"
            self.outcome.results.append(
                ShapeResult(backend, kernel.impl, shape, heads, False, error=error)
            )
            log.warning("bench %s (%s): %s", backend, kernel.impl, error)
            return
        if not timing.median_ms > 0:  # below the timer's resolution: no usable number
            reason = f"too fast to time ({timing.median_ms} ms a call); use a larger shape"
            self.outcome.skipped.append(Skip(backend.value, shape.label, reason))
            log.warning("bench %s %s H%d: %s", backend, shape.label, heads, reason)
            return
        self.outcome.results.append(
            ShapeResult(backend, kernel.impl, shape, heads, True, timing.median_ms,
                        timing.tflops, host_us=timing.host_us)
        )  # fmt: skip
        log.info(
            "bench %s %s H%d: %.3f ms, %.4g TFLOP/s (%s, median of %d passes of %d calls; "
            "host %.0f us a call)",
            backend, shape.label, heads, timing.median_ms, timing.tflops, kernel.impl,
            timing.passes, timing.layers, timing.host_us,
        )  # fmt: skip

    def run(self, interrupts: Interrupts | None) -> BenchOutcome:
        guard = interrupts.measuring() if interrupts is not None else contextlib.nullcontext()
        index = 0
        try:
            with guard:
                while index < len(self.steps):
                    backend, shape = self.steps[index]
                    if backend in self.failed:
                        index += 1
                        continue
                    if self.clock() >= self.deadline:
                        spent = f"the time budget of {self.plan.budget_s:g}s was spent"
                        self.skip_rest(index, spent)
                        index = len(self.steps)
                        break
                    before = len(self.outcome.results)
                    if shape is None:
                        self.check(backend)
                    else:
                        self.time_shape(backend, shape)
                    index += 1
                    broke = any(not r.correct for r in self.outcome.results[before:])
                    if broke and not _cuda_healthy(self.plan.device):
                        self.skip_rest(index, f"the CUDA context broke after {backend} failed")
                        index = len(self.steps)
        except BenchInterrupted:
            self.outcome.interrupted = True
            self.skip_rest(index, "stopped: the boot's time budget ran out")
        finally:
            self.kernels.clear()
            self.references.clear()
            if self.plan.device.startswith("cuda"):
                with contextlib.suppress(Exception):
                    import_quietly("torch").cuda.empty_cache()
        self.outcome.elapsed_s = self.clock() - self.start
        return self.outcome


def run_bench(
    plan: BenchPlan,
    *,
    kernel_classes: Mapping[Backend, type[MLAPrefillKernel]] | None = None,
    started: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    interrupts: Interrupts | None = None,
) -> BenchOutcome:
    """Check, then time, every runnable backend of ``plan``, within its budget.

    ``kernel_classes`` replaces ``kernels.get(backend)`` for some backends: the hook
    the tests use to run a deliberately wrong kernel through the real checks.
    ``started`` is when the budget began (default: now).
    """
    import_quietly("torch")  # first here, without the missing-NumPy warning
    start = clock() if started is None else started
    return _Runner(plan, kernel_classes, clock, start).run(interrupts)
