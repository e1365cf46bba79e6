"""Correctness checks and timings for MLA prefill kernels (torch-using).

Why a module and not test code: the GPU test-suite, ``bench/kernel_speed.py`` and the
agent's measured selection all ask the same two questions of a kernel
instance — "does it agree with the fp32 reference on this batch?" and "how fast is
it on this shape?" — and must answer them the same way.

* :func:`reference_check` builds a random ragged batch, runs the instance and the
  fp32 TORCH_SDPA reference on the same (upcast) inputs, and compares ``out`` and
  ``lse`` under per-dtype tolerances (:func:`default_tolerances` says why those).
* :func:`benchmark` times ``prefill`` with CUDA events (wall clock on CPU) and
  converts the median to TFLOP/s with :func:`causal_flops`.
* :func:`matmul_tflops` measures a bf16 GEMM in the same process: the ceiling that
  makes attention TFLOP/s comparable across machines and runs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from mla_switchboard.core.specs import MLADims
from mla_switchboard.kernels.base import MLAPrefillKernel, canonical_device, resolve_dtype

__all__ = [
    "BenchResult",
    "CheckResult",
    "Comparison",
    "Tolerances",
    "benchmark",
    "causal_flops",
    "compare_direct",
    "default_tolerances",
    "host_us_interleaved",
    "host_us_per_call",
    "make_inputs",
    "matmul_tflops",
    "reference_check",
    "reference_outputs",
]


@dataclass(frozen=True)
class Tolerances:
    """``|x - ref| <= atol + rtol * |ref|`` elementwise, for out and for lse."""

    atol_out: float
    rtol_out: float
    atol_lse: float
    rtol_lse: float


def default_tolerances(dtype: torch.dtype | str) -> Tolerances:
    """Tolerances against the fp32 reference computed from the same half inputs.

    Why these numbers: both sides see bit-identical inputs, so the differences come
    from the kernel's own roundings. Scores (q.k) are accumulated in fp32 by every
    kernel, so the LSE differs from the reference only by fp32 summation order and
    exp2 approximations; 1e-3 absolute is ~300x what the H200 showed (2.9e-6) and
    still catches a base-2 LSE (off by 44 %) or a causal diagonal shifted on a
    short row. The output is where half precision enters: kernels round the
    probabilities to the input dtype before the P.V product and round the result
    at the end, each a relative error of up to 2^-9 in bf16 (8-bit significand) and
    2^-12 in fp16. Outputs reach |x| ~ 3-4 on rows with few keys, so bf16 can be off
    by ~1e-2 (the H200 showed 1.01e-2 worst case; the TORCH_SDPA path, which only
    rounds its fp32 result, 0.93e-2): 2e-2 leaves a 2x margin; fp16 is 8x tighter
    (1.24e-3 seen, 4e-3 allowed). fp32 (the reference against itself) is tight.
    """
    torch_dtype, _ = resolve_dtype(dtype)
    if torch_dtype == torch.bfloat16:
        return Tolerances(atol_out=2e-2, rtol_out=2e-2, atol_lse=1e-3, rtol_lse=1e-4)
    if torch_dtype == torch.float16:
        return Tolerances(atol_out=4e-3, rtol_out=4e-3, atol_lse=1e-3, rtol_lse=1e-4)
    return Tolerances(atol_out=1e-4, rtol_out=1e-4, atol_lse=1e-4, rtol_lse=1e-5)


@dataclass(frozen=True)
class CheckResult:
    """Outcome of :func:`reference_check`; ``error`` is set when the kernel raised."""

    ok: bool
    max_abs_err_out: float
    max_abs_err_lse: float
    error: str | None
    backend: str = ""
    impl: str = ""
    seqlens_q: tuple[int, ...] = ()
    seqlens_k: tuple[int, ...] = ()
    causal: bool = True
    dtype: str = ""
    tolerances: Tolerances | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Timing:
    """What every timing row starts with: which code ran, on what, and its median."""

    backend: str
    impl: str
    shape: dict[str, Any]
    median_ms: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BenchResult(_Timing):
    """Timing of one (instance, shape): median and min over ``iters`` calls."""

    min_ms: float
    tflops: float
    iters: int
    times_ms: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("times_ms")
        return d


def causal_flops(
    seqlens_q: Sequence[int],
    seqlens_k: Sequence[int] | None = None,
    *,
    num_heads: int,
    qk_head_dim: int,
    v_head_dim: int,
    causal: bool = True,
) -> float:
    """Useful FLOPs of one prefill: the convention attention benchmarks use.

    Non-causal: ``2 * Lq * Lk * H * (d_qk + d_v)`` per sequence (QK^T and PV, 2 FLOPs
    per multiply-add). Causal with bottom-right alignment keeps
    ``Lq * Lk - Lq^2 / 2`` of the pairs, i.e. ``S^2 * H * (d_qk + d_v)`` when
    ``Lq = Lk = S`` (half the square, as FlashAttention's benchmarks count it).
    """
    ks = list(seqlens_q) if seqlens_k is None else list(seqlens_k)
    if len(ks) != len(seqlens_q):
        raise ValueError("seqlens_q and seqlens_k must have the same length")
    d = qk_head_dim + v_head_dim
    total = 0.0
    for lq, lk in zip(seqlens_q, ks, strict=True):
        pairs = lq * lk - lq * lq / 2.0 if causal else lq * lk
        total += 2.0 * pairs * num_heads * d
    return total


def _cu(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + int(n))
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def make_inputs(
    *,
    num_heads: int,
    qk_head_dim: int,
    v_head_dim: int,
    seqlens_q: Sequence[int],
    seqlens_k: Sequence[int] | None = None,
    dtype: torch.dtype | str,
    device: torch.device | str,
    seed: int = 0,
) -> dict[str, Any]:
    """A random ragged batch as the contract's keyword arguments (q, k, v, cu_*, max_*).

    Entries are N(0, 1), which with the 1/sqrt(d) scale keeps softmax neither
    uniform nor one-hot, the regime where masking and LSE errors show.
    """
    torch_dtype, _ = resolve_dtype(dtype)
    dev = canonical_device(device)
    lens_k = list(seqlens_q) if seqlens_k is None else list(seqlens_k)
    gen = torch.Generator(device=dev).manual_seed(seed)
    t_q, t_k = sum(seqlens_q), sum(lens_k)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(torch_dtype)

    return {
        "q": rand(t_q, num_heads, qk_head_dim),
        "k": rand(t_k, num_heads, qk_head_dim),
        "v": rand(t_k, num_heads, v_head_dim),
        "cu_seqlens_q": _cu(seqlens_q, dev),
        "cu_seqlens_k": _cu(lens_k, dev),
        "max_seqlen_q": max(seqlens_q, default=0),
        "max_seqlen_k": max(lens_k, default=0),
    }


def _query_lengths(seqlens: Sequence[int], q_shorter_than_kv: bool) -> list[int]:
    """Context-chunk shape: the last quarter of each sequence is new tokens."""
    if not q_shorter_than_kv:
        return list(seqlens)
    return [max(1, s // 4) if s > 0 else 0 for s in seqlens]


def _check_batch(
    num_heads: int,
    dims: MLADims,
    seqlens: Sequence[int],
    q_shorter_than_kv: bool,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int,
) -> dict[str, Any]:
    """The batch a reference check runs: kernel and reference must see the same one."""
    return make_inputs(
        num_heads=num_heads,
        qk_head_dim=dims.qk_head_dim,
        v_head_dim=dims.v_head_dim,
        seqlens_q=_query_lengths(seqlens, q_shorter_than_kv),
        seqlens_k=list(seqlens),
        dtype=dtype,
        device=device,
        seed=seed,
    )


def reference_outputs(
    *,
    num_heads: int,
    dims: MLADims,
    softmax_scale: float,
    seqlens: Sequence[int],
    causal: bool = True,
    dtype: torch.dtype | str,
    device: torch.device | str,
    q_shorter_than_kv: bool = False,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 TORCH_SDPA ``(out, lse)`` for the batch :func:`reference_check` builds.

    Same arguments, same seed, same inputs: computing this once and passing it as
    ``reference=`` lets a sweep check many backends against one reference.
    """
    torch_dtype, _ = resolve_dtype(dtype)
    inputs = _check_batch(num_heads, dims, seqlens, q_shorter_than_kv, torch_dtype, device, seed)
    return _reference(inputs, num_heads, dims, softmax_scale, causal, device)


def _reference(
    inputs: dict[str, Any],
    num_heads: int,
    dims: MLADims,
    softmax_scale: float,
    causal: bool,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 TORCH_SDPA ``(out, lse)`` for a batch (``inputs`` are left as they are)."""
    from mla_switchboard.kernels.torch_sdpa import TorchSdpaPrefill

    ref_kernel = TorchSdpaPrefill.create(
        num_heads,
        dims.qk_nope_head_dim,
        dims.qk_rope_head_dim,
        dims.v_head_dim,
        softmax_scale,
        torch.float32,
        device,
    )
    fp32 = {**inputs, **{name: inputs[name].float() for name in ("q", "k", "v")}}
    out, lse = ref_kernel.prefill(**fp32, causal=causal, return_lse=True)
    return out, lse


def reference_check(
    inst: MLAPrefillKernel,
    *,
    seqlens: Sequence[int],
    causal: bool = True,
    dtype: torch.dtype | str,
    device: torch.device | str,
    q_shorter_than_kv: bool = False,
    seed: int = 0,
    tolerances: Tolerances | None = None,
    reference: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> CheckResult:
    """Compare ``inst`` with the fp32 TORCH_SDPA reference on a random ragged batch.

    ``seqlens`` are the kv lengths; with ``q_shorter_than_kv`` each sequence's
    queries are its last quarter (a context chunk, bottom-right causal). Kernel
    exceptions are caught and reported in ``error`` (``ok=False``), so a sweep over
    backends never dies on the first failure. ``reference`` lets a caller that checks
    many backends on the same batch pass the (out, lse) computed once by
    :func:`reference_outputs`.
    """
    torch_dtype, spec_dtype = resolve_dtype(dtype)
    tol = tolerances or default_tolerances(torch_dtype)
    lens_q = _query_lengths(seqlens, q_shorter_than_kv)
    meta = {
        "backend": str(inst.backend),
        "impl": inst.impl,
        "seqlens_q": tuple(lens_q),
        "seqlens_k": tuple(seqlens),
        "causal": causal,
        "dtype": spec_dtype.value,
        "tolerances": tol,
    }
    inputs = _check_batch(
        inst.num_heads, inst.dims, seqlens, q_shorter_than_kv, torch_dtype, device, seed
    )
    if reference is None:  # from the batch the kernel runs: the same inputs, built once
        reference = _reference(
            inputs, inst.num_heads, inst.dims, inst.softmax_scale, causal, device
        )
    try:
        out, lse = _run_checked(inst, inputs, causal)
    except Exception as exc:  # a sweep reports, it does not stop
        return _failed(f"{type(exc).__name__}: {exc}", meta)
    ref_out, ref_lse = reference
    problems = _layout_problems(out, lse, ref_out, ref_lse, torch_dtype)
    if problems:
        return _failed("; ".join(problems), meta)
    return _compare(out, lse, ref_out, ref_lse, tol, meta)


def _run_checked(
    inst: MLAPrefillKernel, inputs: dict[str, Any], causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``inst.prefill`` with the LSE, finished on the device so a late failure shows here."""
    out, lse = inst.prefill(**inputs, causal=causal, return_lse=True)
    if inst.device.type == "cuda":
        torch.cuda.synchronize(inst.device)
    return out, lse


def _failed(error: str, meta: dict[str, Any]) -> CheckResult:
    """A check that produced no comparable numbers: infinite errors, the reason said."""
    return CheckResult(
        ok=False, max_abs_err_out=math.inf, max_abs_err_lse=math.inf, error=error, **meta
    )


def _layout_problems(
    out: torch.Tensor,
    lse: torch.Tensor,
    ref_out: torch.Tensor,
    ref_lse: torch.Tensor,
    torch_dtype: torch.dtype,
) -> list[str]:
    """Shape or dtype mismatches, which make an elementwise comparison meaningless."""
    problems: list[str] = []
    if tuple(out.shape) != tuple(ref_out.shape) or out.dtype != torch_dtype:
        problems.append(
            f"out has shape {tuple(out.shape)} dtype {out.dtype}, expected "
            f"{tuple(ref_out.shape)} {torch_dtype}"
        )
    if tuple(lse.shape) != tuple(ref_lse.shape) or lse.dtype != torch.float32:
        problems.append(
            f"lse has shape {tuple(lse.shape)} dtype {lse.dtype}, expected "
            f"{tuple(ref_lse.shape)} torch.float32"
        )
    return problems


def _compare(
    out: torch.Tensor,
    lse: torch.Tensor,
    ref_out: torch.Tensor,
    ref_lse: torch.Tensor,
    tol: Tolerances,
    meta: dict[str, Any],
) -> CheckResult:
    """Elementwise comparison under ``tol``, plus a check that nothing is non-finite."""
    diff_out = (out.float() - ref_out).abs()
    diff_lse = (lse - ref_lse).abs()
    err_out = float(diff_out.max()) if diff_out.numel() else 0.0
    err_lse = float(diff_lse.max()) if diff_lse.numel() else 0.0
    ok_out = bool((diff_out <= tol.atol_out + tol.rtol_out * ref_out.abs()).all())
    ok_lse = bool((diff_lse <= tol.atol_lse + tol.rtol_lse * ref_lse.abs()).all())
    finite = bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())
    error = None
    if not finite:
        error = "non-finite values in out or lse"
    elif not ok_out or not ok_lse:
        error = "out of tolerance: " + ", ".join(
            name for name, ok in (("out", ok_out), ("lse", ok_lse)) if not ok
        )
    return CheckResult(
        ok=ok_out and ok_lse and finite,
        max_abs_err_out=err_out,
        max_abs_err_lse=err_lse,
        error=error,
        **meta,
    )


_SLEEP_CYCLES = 50_000_000  # ~25 ms at the H200's 1.98 GHz: longer than enqueueing a block


def _time_ms(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> list[float]:
    """Per-call device times: CUDA events around each call on GPU, perf_counter on CPU.

    GPU time is measured apart from host time. The stream is first held by a
    ``torch.cuda._sleep`` of ~25 ms, during which the host enqueues all ``iters``
    calls with an event pair around each; the GPU then runs them back to back, so
    each pair measures the device work of one call (all its kernels), and no host
    work, of the wrapper or of the library, can hide in it. Host time per call is
    measured separately (:func:`host_us_per_call`, :func:`host_us_interleaved`). This
    is the serving pattern: several calls with unchanged offsets, as the layers of
    one forward pass make them, with one-time planning done in the warm-up.
    """
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            sleep(_SLEEP_CYCLES)
        for s, e in zip(starts, ends, strict=True):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def _bench_inputs(
    inst: MLAPrefillKernel,
    seqlens: Sequence[int],
    num_heads: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
) -> dict[str, Any]:
    """The self-attention batch over ``seqlens`` that timings run on."""
    return make_inputs(
        num_heads=num_heads,
        qk_head_dim=inst.dims.qk_head_dim,
        v_head_dim=inst.dims.v_head_dim,
        seqlens_q=seqlens,
        dtype=dtype,
        device=device,
        seed=seed,
    )


def _flops(inst: MLAPrefillKernel, seqlens: Sequence[int], num_heads: int, causal: bool) -> float:
    """:func:`causal_flops` of self-attention over ``seqlens`` with ``inst``'s dims."""
    return causal_flops(
        seqlens,
        num_heads=num_heads,
        qk_head_dim=inst.dims.qk_head_dim,
        v_head_dim=inst.dims.v_head_dim,
        causal=causal,
    )


def _shape(
    inst: MLAPrefillKernel,
    seqlens: Sequence[int],
    num_heads: int,
    dtype: str,
    causal: bool,
    return_lse: bool,
) -> dict[str, Any]:
    """The shape a timing row reports, the same keys for benchmarks and comparisons."""
    return {
        "seqlens": list(seqlens),
        "num_heads": num_heads,
        "qk_head_dim": inst.dims.qk_head_dim,
        "v_head_dim": inst.dims.v_head_dim,
        "dtype": dtype,
        "causal": causal,
        "return_lse": return_lse,
    }


def benchmark(
    inst: MLAPrefillKernel,
    *,
    seqlens: Sequence[int],
    num_heads: int,
    dtype: torch.dtype | str,
    device: torch.device | str,
    warmup: int = 5,
    iters: int = 20,
    causal: bool = True,
    return_lse: bool = False,
    seed: int = 0,
) -> BenchResult:
    """Median time and TFLOP/s of ``inst.prefill`` on self-attention over ``seqlens``.

    ``num_heads`` and ``dtype`` must match the instance (they are part of the shape
    being reported, so a mismatch is an error rather than silently re-labelled).
    """
    torch_dtype, spec_dtype = resolve_dtype(dtype)
    if num_heads != inst.num_heads:
        raise ValueError(f"num_heads {num_heads} does not match the instance's {inst.num_heads}")
    if torch_dtype != inst.dtype:
        raise ValueError(f"dtype {torch_dtype} does not match the instance's {inst.dtype}")
    if iters < 1 or warmup < 0:
        raise ValueError("iters must be >= 1 and warmup >= 0")
    dev = canonical_device(device)
    inputs = _bench_inputs(inst, seqlens, num_heads, torch_dtype, dev, seed)
    times = _time_ms(
        lambda: inst.prefill(**inputs, causal=causal, return_lse=return_lse), dev, warmup, iters
    )
    median = statistics.median(times)
    flops = _flops(inst, seqlens, num_heads, causal)
    return BenchResult(
        backend=str(inst.backend),
        impl=inst.impl,
        shape=_shape(inst, seqlens, num_heads, spec_dtype.value, causal, return_lse),
        median_ms=median,
        min_ms=min(times),
        tflops=flops / (median * 1e-3) / 1e12,
        iters=iters,
        times_ms=times,
    )


def host_us_per_call(fn: Callable[[], Any], device: torch.device | str, iters: int = 30) -> float:
    """Median host (CPU) time of one call in microseconds, GPU time excluded.

    Kernels launch asynchronously, so the wall time of a call on the host is its
    Python and launch cost as long as the launch queue does not fill (a few dozen
    calls are far from that). The GPU is synchronised before and after only.
    """
    dev = canonical_device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return statistics.median(times) / 1e3


def host_us_interleaved(
    fns: dict[str, Callable[[], Any]], device: torch.device | str, iters: int = 40
) -> dict[str, float]:
    """Median host time per call of each function, calls interleaved so drift hits all.

    The order rotates every iteration, so no function always goes first (a launch
    onto an idle GPU can cost more host time than one behind queued work), and the
    GPU is synchronised only before and after.
    """
    dev = canonical_device(device)
    names = list(fns)
    for fn in fns.values():  # one untimed call each, after the caller's warm-up
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    times: dict[str, list[int]] = {name: [] for name in names}
    for i in range(iters):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            fn = fns[name]
            t0 = time.perf_counter_ns()
            fn()
            times[name].append(time.perf_counter_ns() - t0)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return {name: statistics.median(t) / 1e3 for name, t in times.items()}


@dataclass(frozen=True)
class Comparison(_Timing):
    """One shape: the wrapper against its library's own direct call(s), same run."""

    tflops: float
    host_us: float
    direct: dict[str, dict[str, float]]  # name -> {median_ms, tflops, host_us}
    direct_best: str | None
    direct_ms: float | None
    direct_tflops: float | None
    direct_host_us: float | None
    ratio: float | None  # median_ms / direct_ms
    host_overhead_us: float | None  # host_us - direct_host_us
    iters: int


def compare_direct(
    inst: MLAPrefillKernel,
    *,
    seqlens: Sequence[int],
    num_heads: int,
    dtype: torch.dtype | str,
    device: torch.device | str,
    return_lse: bool = False,
    causal: bool = True,
    warmup: int = 5,
    iters: int = 10,
    rounds: int = 3,
    seed: int = 0,
) -> Comparison:
    """Time ``inst.prefill`` and its library's direct call(s) on the same inputs.

    Wrapper and direct calls are timed in alternating rounds (``rounds`` x ``iters``
    calls each, device time only, see :func:`_time_ms`) so clock drift hits both
    alike; the medians over all rounds are compared. ``inst.direct_calls`` supplies
    the library calls, set up once (planned, graphs built) outside the timed region,
    which is the best a hand-written caller can do. Host time per call is measured
    for each as well (:func:`host_us_per_call`).
    """
    torch_dtype, spec_dtype = resolve_dtype(dtype)
    dev = canonical_device(device)
    inputs = _bench_inputs(inst, seqlens, num_heads, torch_dtype, dev, seed)
    flops = _flops(inst, seqlens, num_heads, causal)

    def wrapper() -> Any:
        return inst.prefill(**inputs, causal=causal, return_lse=return_lse)

    direct = inst.direct_calls(inputs, causal=causal, return_lse=return_lse)
    fns: dict[str, Callable[[], Any]] = {"wrapper": wrapper, **direct}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up: JIT, plans, graphs, allocator
        for _ in range(warmup):
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name] += _time_ms(fn, dev, 0, iters)
    host = host_us_interleaved(fns, dev)
    med = {name: statistics.median(t) for name, t in times.items()}
    tf = {name: flops / (m * 1e-3) / 1e12 for name, m in med.items()}
    best = min(direct, key=lambda n: med[n]) if direct else None
    return Comparison(
        backend=str(inst.backend),
        impl=inst.impl,
        shape=_shape(inst, seqlens, num_heads, spec_dtype.value, causal, return_lse),
        median_ms=med["wrapper"],
        tflops=tf["wrapper"],
        host_us=host["wrapper"],
        direct={n: {"median_ms": med[n], "tflops": tf[n], "host_us": host[n]} for n in direct},
        direct_best=best,
        direct_ms=med[best] if best else None,
        direct_tflops=tf[best] if best else None,
        direct_host_us=host[best] if best else None,
        ratio=med["wrapper"] / med[best] if best else None,
        host_overhead_us=host["wrapper"] - host[best] if best else None,
        iters=rounds * iters,
    )


def matmul_tflops(
    n: int = 8192,
    *,
    dtype: torch.dtype | str = torch.bfloat16,
    device: torch.device | str = "cuda",
    warmup: int = 3,
    iters: int = 10,
) -> dict[str, Any]:
    """Median TFLOP/s of an ``n x n x n`` GEMM on random data: the machine's ceiling."""
    torch_dtype, spec_dtype = resolve_dtype(dtype)
    dev = canonical_device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn((n, n), generator=gen, device=dev).to(torch_dtype)
    b = torch.randn((n, n), generator=gen, device=dev).to(torch_dtype)
    times = _time_ms(lambda: torch.matmul(a, b), dev, warmup, iters)
    median = statistics.median(times)
    return {
        "backend": "MATMUL",
        "impl": f"torch.matmul {spec_dtype.value}",
        "shape": {"m": n, "n": n, "k": n, "dtype": spec_dtype.value},
        "median_ms": median,
        "tflops": 2.0 * n**3 / (median * 1e-3) / 1e12,
    }
