"""Build the chosen kernel on this pod, falling back when it will not build.

The decision is made from a description of the pod; building the kernel is where
the description meets the real machine (an import that fails, a CUDA error, a
kernel that builds but computes wrong numbers under ``--check``). When that happens
the agent tells the service (``POST /v1/selections/{id}/failure``, best effort, so
that the fleet view shows the bad pod) and tries the next valid candidate in the
order the decision listed them, ending with TORCH_SDPA, which runs anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mla_switchboard.agent.errors import KernelBuildError
from mla_switchboard.agent.notes import Notes
from mla_switchboard.agent.probe import import_quietly
from mla_switchboard.core.schemas import Candidate
from mla_switchboard.core.specs import Dtype
from mla_switchboard.kernels import Backend
from mla_switchboard.kernels import get as get_kernel_class

__all__ = ["BuildOutcome", "KernelShape", "build_kernel", "build_order", "reference_check"]

CHECK_SEQLENS = (17, 5)
"""Lengths of the tiny ragged batch ``--check`` runs: two sequences, unequal, odd."""


@dataclass(frozen=True)
class KernelShape:
    """The arguments of ``MLAPrefillKernel.create``."""

    num_heads: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    softmax_scale: float
    dtype: Dtype
    device: str


@dataclass
class BuildOutcome:
    backend: Backend
    kernel: Any
    failures: list[tuple[Backend, str]] = field(default_factory=list)


def build_order(chosen: Backend, candidates: Sequence[Candidate]) -> list[Backend]:
    """The chosen backend, then the other valid candidates in the decision's order,
    then TORCH_SDPA (the decision lists it, but a hand-made answer might not)."""
    order = [chosen]
    for candidate in candidates:
        if candidate.valid and candidate.backend not in order:
            order.append(candidate.backend)
    if Backend.TORCH_SDPA not in order:
        order.append(Backend.TORCH_SDPA)
    return order


def reference_check(kernel: Any, shape: KernelShape, notes: Notes) -> str | None:
    """Run one tiny prefill against the reference; None when it agrees, else why not.

    Without ``kernels.measure`` (an older install) the check is skipped with a
    warning rather than failed: the kernel did build, which is most of the evidence.
    """
    try:
        from mla_switchboard.kernels.measure import reference_check as check
    except ImportError as exc:
        notes.warn(f"reference check skipped (kernels.measure unavailable: {exc})")
        return None
    result = check(
        kernel,
        seqlens=list(CHECK_SEQLENS),
        causal=True,
        dtype=shape.dtype,
        device=getattr(kernel, "device", shape.device),
    )
    if result.ok:
        return None
    detail = result.error or (
        f"max abs error {result.max_abs_err_out:.3g} in out, {result.max_abs_err_lse:.3g} in lse"
    )
    return f"reference check failed: {detail}"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or "(no message)"
    return f"{type(exc).__name__}: {text}"


def build_kernel(
    order: Sequence[Backend],
    shape: KernelShape,
    *,
    notes: Notes,
    check: bool = False,
    on_failure: Callable[[Backend, str], None] | None = None,
) -> BuildOutcome:
    """Create the first backend of ``order`` that builds (and, with ``check``, passes
    the reference check). ``on_failure`` hears about each one that does not.

    Raises KernelBuildError when none does.
    """
    failures: list[tuple[Backend, str]] = []
    for backend in order:
        try:
            import_quietly("torch")  # the kernels import it; first here, without the NumPy warning
            cls = get_kernel_class(backend)
            kernel = cls.create(
                shape.num_heads,
                shape.qk_nope_head_dim,
                shape.qk_rope_head_dim,
                shape.v_head_dim,
                shape.softmax_scale,
                shape.dtype,
                shape.device,
            )
            problem = reference_check(kernel, shape, notes) if check else None
        except Exception as exc:  # import, CUDA and backend errors alike
            problem = _describe(exc)
            kernel = None
        if problem is None:
            return BuildOutcome(backend, kernel, failures)
        failures.append((backend, problem))
        notes.warn(f"{backend} did not build on this pod: {problem}")
        if on_failure is not None:
            on_failure(backend, problem)
    summary = "; ".join(f"{b}: {why}" for b, why in failures)
    raise KernelBuildError(
        f"no MLA prefill kernel builds on this pod ({summary})",
        [(b.value, why) for b, why in failures],
    )
