"""Planning a bench: which backends, on which shapes, how long; decided before any
kernel runs, so every bad input (not an MLA model, a malformed shape, an unknown
backend, a CUDA device the pod lacks) fails at once and nothing is measured or sent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mla_switchboard.agent.errors import BadInputError, MissingPackageError
from mla_switchboard.agent.model_config import ModelDims
from mla_switchboard.agent.notes import Notes, log
from mla_switchboard.agent.pod import PodDescription, PodSpec, describe_pod
from mla_switchboard.agent.settings import AgentSettings
from mla_switchboard.core.engines import resolve as resolve_engine_profile
from mla_switchboard.core.evaluator import context_of
from mla_switchboard.core.schemas import EngineInfo, SelectRequest
from mla_switchboard.core.specs import (
    SPECS,
    Backend,
    Capability,
    format_capability,
    parse_backend,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "CHECK_CASES",
    "DEFAULT_CPU_SHAPES",
    "DEFAULT_GPU_SHAPES",
    "DEFAULT_LAYERS",
    "GPU_EXTRA_HINT",
    "BenchPlan",
    "BenchShape",
    "CheckCase",
    "log_plan",
    "parse_shapes",
    "plan_bench",
    "require_torch",
    "runnable_backends",
]

MAX_TOKENS_PER_SHAPE = 1 << 20
"""The schema's bound on one sequence; also a sane cap on one benchmark batch."""
DEFAULT_LAYERS = 8
"""Calls per forward pass when the config does not say how many layers the model has."""
CPU_LAYERS = 2
"""Calls per forward pass on a CPU (unless ``--layers`` says otherwise): only the fp32
reference runs there and its numbers are evidence for no GPU, so a CPU run checks the
path without paying 61 slow reference calls per pass."""


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


@dataclass(frozen=True)
class BenchPlan:
    """What one bench run will do, decided before any kernel runs.

    ``layers``: calls per timed forward pass, all with the same offsets tensors, as
    the attention layers of one forward pass make them (so a kernel's per-batch
    planning is charged once per pass, as in serving, not once per call).
    """

    pod: PodDescription
    device: str
    device_name: str | None
    capability: tuple[int, int] | None
    shapes: tuple[BenchShape, ...]
    backends: tuple[Backend, ...]
    unavailable: dict[str, list[str]]
    iters: int
    budget_s: float
    layers: int = DEFAULT_LAYERS
    notes: Notes = field(default_factory=Notes)

    @property
    def model(self) -> ModelDims:
        return self.pod.model

    @property
    def num_heads(self) -> int:
        assert self.pod.model.num_heads is not None  # plan_bench refuses a model without
        return self.pod.model.num_heads


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
                f"--shapes: {item!r} is not BATCHxTOKENS with positive numbers (e.g. 8x512)"
            )
        if batch > 4096 or batch * seqlen > MAX_TOKENS_PER_SHAPE:
            raise BadInputError(
                f"--shapes: {item!r} is too large (at most 4096 sequences and "
                f"{MAX_TOKENS_PER_SHAPE} tokens in all)"
            )
        if BenchShape(batch, seqlen) not in shapes:
            shapes.append(BenchShape(batch, seqlen))
    if not shapes:
        raise BadInputError(f"--shapes: no shape in {text!r} (want e.g. 8x512,1x8192)")
    return shapes


GPU_EXTRA_HINT = (
    "install the GPU extra: pip install 'mla-switchboard[gpu]' "
    "(on a machine without a GPU, pip install torch is enough to run the CPU reference)"
)


def require_torch() -> None:
    """Raise MissingPackageError, saying how to install it, when torch cannot be imported.

    The plain install leaves torch out (a GPU pod's image brings its own). Without this
    check a bench would list every backend as skipped for want of torch, then fail with
    an import traceback when it starts timing: the one thing the operator must do,
    install torch, would be the last line of a stack trace.
    """
    from mla_switchboard.agent.probe import import_quietly

    try:
        import_quietly("torch")
    except ImportError as exc:
        raise MissingPackageError(
            f"PyTorch is not installed here ({exc}), and the bench measures kernels "
            f"with it; {GPU_EXTRA_HINT}"
        ) from None


def _cuda_info(device: str) -> tuple[str | None, tuple[int, int] | None]:
    """Name and capability of a ``cuda:N`` device, straight from torch."""
    from mla_switchboard.agent.probe import import_quietly

    torch = import_quietly("torch")
    dev = torch.device(device)
    index = dev.index if dev.index is not None else 0
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise BadInputError(f"--device {device}: there is no such CUDA device")
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
            raise BadInputError(f"--device {requested}: this pod has no CUDA device")
        if device == "cuda:0" and pod.device.via == "torch":
            return device, probed.name, probed.capability
        name, capability = _cuda_info(device)
        return device, name, capability
    raise BadInputError(f"--device {requested!r} is not cpu, cuda or cuda:N")


def runnable_backends(
    request: SelectRequest,
    capability: tuple[int, int] | None,
    wanted: Sequence[Backend] | None = None,
) -> tuple[list[Backend], dict[str, list[str]]]:
    """The backends to measure on the device that will run (seed order, the fp32
    reference last: it is the slowest to time), and why each other one is left out.

    A backend must pass our spec *and* the pod's serving engine (``core.engines``):
    in a vLLM pod, CUDNN or a FLASHINFER vLLM runs only on Blackwell would be evidence
    for a choice the service can never make, measured out of a boot's budget.
    """
    ctx = dataclasses.replace(
        context_of(request),
        capability=None if capability is None else Capability(*capability),
        packages=request.packages if request.packages is not None else {},
    )
    engine = request.engine or EngineInfo()
    profile = resolve_engine_profile(engine.name, engine.version)
    runnable: list[Backend] = []
    unavailable: dict[str, list[str]] = {}
    order = [b for b in Backend if b is not Backend.TORCH_SDPA] + [Backend.TORCH_SDPA]
    for backend in order:
        if wanted is not None and backend not in wanted:
            continue
        reasons = SPECS[backend].validate(ctx) + profile.reasons(backend, ctx, engine.version)
        if reasons:
            unavailable[backend.value] = reasons
        else:
            runnable.append(backend)
    return runnable, unavailable


def plan_bench(
    pod: PodSpec,
    *,
    backends: Sequence[str] | None = None,
    shapes: str | Sequence[BenchShape] | None = None,
    device: str | None = None,
    budget_s: float = 300.0,
    iters: int = 20,
    layers: int | None = None,
    settings: AgentSettings | None = None,
) -> BenchPlan:
    """Describe the pod (its packages probed: a bench never pretends) and decide which
    backends and shapes to run. Raises BadInputError for anything wrong with the input.
    ``settings``: the environment's (read now when not given).
    """
    notes = Notes()
    if pod.pretend:
        raise BadInputError("a bench runs on this pod's own GPU; it cannot pretend another")
    if not budget_s > 0:
        raise BadInputError(f"--budget must be positive, got {budget_s!r}")
    if iters < 1:
        raise BadInputError(f"--iters must be at least 1, got {iters!r}")
    if layers is not None and layers < 1:
        raise BadInputError(f"--layers must be at least 1, got {layers!r}")
    wanted: list[Backend] | None = None
    if backends is not None:
        try:
            wanted = [parse_backend(b) for b in backends if b.strip()]
        except ValueError as exc:
            raise BadInputError(f"--backends: {exc}") from None
        if not wanted:
            raise BadInputError("--backends names no backend")
    settings = settings if settings is not None else AgentSettings.from_environ()
    if shapes is not None and isinstance(shapes, str):
        parse_shapes(shapes)  # a bad --shapes is bad input (exit 2) with or without torch
    description = describe_pod(dataclasses.replace(pod, packages="probe"), settings, notes)
    if description.model.num_heads is None:
        raise BadInputError(
            "the model config has no num_attention_heads; give the head count with --num-heads"
        )
    require_torch()
    torch_device, name, capability = _resolve_device(device, description)

    if shapes is None:
        chosen = list(DEFAULT_CPU_SHAPES if torch_device == "cpu" else DEFAULT_GPU_SHAPES)
        if torch_device == "cpu":
            gpu = ", ".join(s.label for s in DEFAULT_GPU_SHAPES)
            notes.info(
                f"no GPU: only {Backend.TORCH_SDPA} can run, on shapes scaled down from the GPU "
                f"defaults ({gpu}) to {', '.join(s.label for s in chosen)}"
            )
    elif isinstance(shapes, str):
        chosen = parse_shapes(shapes)
    else:
        chosen = list(shapes)

    if layers is None:
        layers = description.model.num_layers or DEFAULT_LAYERS
        if torch_device == "cpu":
            layers = min(layers, CPU_LAYERS)
    runnable, unavailable = runnable_backends(description.request, capability, wanted)
    return BenchPlan(
        pod=description,
        device=torch_device,
        device_name=name,
        capability=capability,
        shapes=tuple(chosen),
        backends=tuple(runnable),
        unavailable=unavailable,
        iters=iters,
        budget_s=budget_s,
        layers=layers,
        notes=notes,
    )


def log_plan(plan: BenchPlan) -> None:
    """One line saying what will run where, and one per backend left out and why."""
    where = plan.device_name or "no GPU"
    if plan.capability is not None:
        where += f" ({format_capability(plan.capability)})"
    engine = plan.pod.request.engine
    log.info(
        "bench on %s, %s: %s at H%d %s; shapes %s, %d calls a forward pass; budget %gs%s",
        where,
        plan.device,
        ", ".join(b.value for b in plan.backends) or "no backend",
        plan.num_heads,
        plan.pod.request.dtype,
        ", ".join(s.label for s in plan.shapes),
        plan.layers,
        plan.budget_s,
        "" if engine is None else f"; engine {engine.name} {engine.version or ''}".rstrip(),
    )
    for backend, reasons in plan.unavailable.items():
        log.info("bench %s: not valid here, skipped: %s", backend, "; ".join(reasons))
