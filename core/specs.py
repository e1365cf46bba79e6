"""What each MLA prefill backend *is*: the one table of what it supports.

This is the backend registry: the only place a backend's name, the packages it needs
(import and distribution names), its capability, dims and dtypes are written. The
agent's package probe, the evidence situation key (``core/evidence/``), the
dashboard's backend list (``GET /v1/backends``) and the README's backend table
(``scripts/gen_docs_tables.py``) are all derived from it, and a test fails when a
backend's name is spelt anywhere else; adding a backend touches this table and its
wrapper in ``kernels/``.

This module is deliberately torch-free (standard library only). The service, the
agent's local fallback and the kernel wrappers all import it, so importing it must
never pull in torch or a kernel package. Each spec answers "can this backend run
here?" with a list of human-readable reasons, modelled on vLLM's
``validate_configuration`` and PyTorch's SDPA dispatcher: an empty list means valid,
and every non-empty list names the fact that rules the backend out.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "CUDNN_PACKAGE",
    "FLASHINFER_CUTLASS_HEAD_DIMS",
    "FLASHINFER_FA3_HEAD_DIMS",
    "FLASHINFER_PACKAGE",
    "FLASHINFER_TRTLLM_RAGGED_HEAD_DIMS",
    "FLASH_ATTN_PACKAGE",
    "KERNEL_PACKAGES",
    "KIMI_LINEAR_DIMS",
    "R1_DIMS",
    "SPECS",
    "TOKENSPEED_MLA_PACKAGE",
    "TORCH",
    "Backend",
    "BackendSpec",
    "Capability",
    "Dtype",
    "HeadDims",
    "KernelPackage",
    "MLADims",
    "SelectionContext",
    "format_capability",
    "parse_backend",
    "parse_dtype",
]


class Backend(enum.StrEnum):
    """The MLA prefill backends Switchboard knows, by their vLLM names."""

    TRTLLM_RAGGED = "TRTLLM_RAGGED"
    FLASHINFER = "FLASHINFER"
    CUDNN = "CUDNN"
    FLASH_ATTN = "FLASH_ATTN"
    TOKENSPEED_MLA = "TOKENSPEED_MLA"
    TORCH_SDPA = "TORCH_SDPA"


class Dtype(enum.StrEnum):
    """Activation dtypes, by their canonical torch names."""

    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


_DTYPE_ALIASES: dict[str, Dtype] = {
    "bfloat16": Dtype.BFLOAT16,
    "bf16": Dtype.BFLOAT16,
    "float16": Dtype.FLOAT16,
    "fp16": Dtype.FLOAT16,
    "half": Dtype.FLOAT16,
    "float32": Dtype.FLOAT32,
    "fp32": Dtype.FLOAT32,
    "float": Dtype.FLOAT32,
}


def parse_dtype(value: str) -> Dtype:
    """Accept the spellings people and configs use (``bf16``, ``torch.bfloat16``, ...).

    Raises ValueError naming every accepted spelling, because a typo in a dtype is
    the most common way a pod description goes wrong.
    """
    key = value.strip().lower()
    key = key.removeprefix("torch.")
    try:
        return _DTYPE_ALIASES[key]
    except KeyError:
        accepted = ", ".join(sorted(_DTYPE_ALIASES))
        raise ValueError(
            f"unknown dtype {value!r}; accepted: {accepted} (optionally prefixed 'torch.')"
        ) from None


def parse_backend(value: str) -> Backend:
    """Case-insensitive backend lookup whose error lists the valid names."""
    try:
        return Backend(value.strip().upper())
    except ValueError:
        names = ", ".join(b.value for b in Backend)
        raise ValueError(f"unknown backend {value!r}; valid backends: {names}") from None


def format_capability(capability: Sequence[int]) -> str:
    """``(9, 0)`` -> ``"9.0"``: how a compute capability is written wherever it is a key
    or a word (situations, stored measurements, rule keys, reasons), so that a
    situation read back from the store, a rule's key and a reason agree."""
    major, minor = capability
    return f"{major}.{minor}"


@dataclass(frozen=True, order=True)
class Capability:
    """A CUDA compute capability, e.g. ``Capability(9, 0)`` for Hopper."""

    major: int
    minor: int

    def __str__(self) -> str:
        return format_capability((self.major, self.minor))


@dataclass(frozen=True)
class MLADims:
    """The three head dims that decide which MLA prefill kernels apply."""

    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def __str__(self) -> str:
        return f"({self.qk_nope_head_dim}, {self.qk_rope_head_dim}, {self.v_head_dim})"


R1_DIMS = MLADims(128, 64, 128)
"""DeepSeek-R1/V3 MLA dims, the only ones the specialised kernels are built for."""

KIMI_LINEAR_DIMS = MLADims(192, 64, 256)
"""The (192, 64, 256) MLA dims TensorRT-LLM's ragged kernel also serves."""

HeadDims = tuple[int, int]
"""(qk head dim, v head dim): what an attention kernel is instantiated for, where MLA
dims (qk_nope, qk_rope, v) give qk = qk_nope + qk_rope."""

FLASHINFER_CUTLASS_HEAD_DIMS: frozenset[HeadDims] = frozenset({(192, 128), (128, 128), (64, 64)})
"""The head dims FlashInfer's CUTLASS ragged prefill (SM100) is built for: the dispatch
in ``csrc/fmha_cutlass_sm100.cu`` (``DISPATCH_head_dim``) takes exactly these
(flashinfer-python 0.7.2, ``flashinfer/prefill.py`` beside
``_CUTLASS_RAGGED_AUTO_HEAD_DIMS``). It is the kernel vLLM's and SGLang's FlashInfer
MLA prefill, and our wrapper, run on 10.x."""

FLASHINFER_TRTLLM_RAGGED_HEAD_DIMS: frozenset[HeadDims] = frozenset(
    {(192, 128), (128, 128), (256, 256)}
)
"""The head dims FlashInfer's trtllm-gen ragged DeepSeek prefill
(``trtllm_ragged_attention_deepseek``, SM100/SM103) takes: its own check in
``flashinfer/prefill.py`` (flashinfer-python 0.7.2, lines 6233-6241: ``is_dsr1``,
``is_smaller_dimensions``, ``is_glm5``), query and key of the qk head dim. MLA dims
(128, 64, 128), (64, 64, 128), (192, 64, 256) and (256, 0, 256) are such pairs. Older
FlashInfer releases take fewer (0.6.7 added (128, 128), 0.6.12 (256, 256)): what each
SGLang release's pinned FlashInfer takes is in its table
(``tools/engine_profiles/data/sglang/<v>.json``, ``trtllm_ragged_head_dims``)."""

FLASHINFER_FA3_HEAD_DIMS: frozenset[HeadDims] = frozenset(
    {(64, 64), (128, 128), (256, 256), (192, 128)}
)
"""The head dims FlashInfer's FA3 (SM90) prefill is instantiated for
(``flashinfer/utils.py`` ``is_fa3_prefill_head_dim_supported``, 0.7.2); its ``auto``
backend runs FA2 on 9.x for any others, and so does our wrapper."""


@dataclass(frozen=True)
class SelectionContext:
    """Everything about a pod that decides which backends can run on it.

    ``capability`` is None when the pod has no CUDA device. ``packages`` maps import
    names to versions; None means "unknown, assume every package is present" (what
    a caller that did not probe its environment gets).
    """

    capability: Capability | None
    dims: MLADims
    dtype: Dtype
    packages: Mapping[str, str] | None = None


@dataclass(frozen=True)
class KernelPackage:
    """A Python package a kernel imports, under both of its names.

    ``import_name`` is what the kernel imports, what the agent's probe imports and what
    a request's ``packages`` map is keyed by. ``distributions`` are the installed
    distributions whose metadata gives its version, tried in order: a wheel is often
    named differently from what it installs (``flashinfer`` comes from
    ``flashinfer-python``, ``cudnn`` from ``nvidia-cudnn-frontend``), and a probe that
    asked for the wrong one reported the package as missing.
    """

    import_name: str
    distributions: tuple[str, ...]


TORCH = KernelPackage("torch", ("torch",))
FLASHINFER_PACKAGE = KernelPackage("flashinfer", ("flashinfer-python", "flashinfer"))
CUDNN_PACKAGE = KernelPackage("cudnn", ("nvidia-cudnn-frontend",))
FLASH_ATTN_PACKAGE = KernelPackage("flash_attn", ("flash-attn", "flash_attn"))
TOKENSPEED_MLA_PACKAGE = KernelPackage("tokenspeed_mla", ("tokenspeed-mla", "tokenspeed_mla"))


@dataclass(frozen=True)
class BackendSpec:
    """The static facts about one backend and the check that applies them.

    ``capability_rule`` is a predicate on the major version with ``capability_text``
    spelling it for humans; ``needs_gpu`` says whether a pod without CUDA can run it.
    ``allowed_dims`` is None (any dims) or the exact dims the kernel is built for;
    ``max_qk``/``max_v`` bound kernels limited only by head size.
    ``head_dims_by_major`` narrows the dims on one capability major, where another kernel
    runs (FlashInfer runs its CUTLASS kernel on 10.x): the (qk, v) head dims it takes
    there, with ``kernel_by_major`` naming that kernel for the reasons.
    ``class_path`` is the lazy ``module:Class`` of the wrapper in ``kernels``.
    ``packages`` must import for the kernel to build; ``optional_packages`` are used
    when present (FLASH_ATTN runs the flash_attn package's kernel, else PyTorch's
    bundled one), so their versions, like the required ones', split the evidence.
    ``colour`` is the backend's slot in the dashboard's palette: fixed per backend and
    never reused, so adding a backend recolours none of the others.
    """

    backend: Backend
    needs_gpu: bool
    capability_text: str
    dtypes: frozenset[Dtype]
    packages: tuple[KernelPackage, ...]
    class_path: str
    summary: str
    colour: int
    capability_majors: frozenset[int] | None = None  # None: any major >= min_major
    min_major: int = 0
    allowed_dims: frozenset[MLADims] | None = None
    max_qk_head_dim: int | None = None
    max_v_head_dim: int | None = None
    optional_packages: tuple[KernelPackage, ...] = ()
    head_dims_by_major: Mapping[int, frozenset[HeadDims]] = field(default_factory=dict)
    kernel_by_major: Mapping[int, str] = field(default_factory=dict)

    @property
    def package_names(self) -> tuple[str, ...]:
        """The import names of the packages the kernel cannot build without."""
        return tuple(p.import_name for p in self.packages)

    @property
    def dims_text(self) -> str:
        """The MLA dims the kernel runs, as the docs and the dashboard spell them."""
        limits = []
        if self.max_qk_head_dim is not None:
            limits.append(f"qk_nope+qk_rope <= {self.max_qk_head_dim}")
        if self.max_v_head_dim is not None:
            limits.append(f"v <= {self.max_v_head_dim}")
        if self.allowed_dims is not None:
            limits.append(" or ".join(sorted(str(d) for d in self.allowed_dims)))
        only = self.capability_majors
        if (
            not limits
            and only is not None
            and len(only) == 1
            and set(self.head_dims_by_major) == only
        ):
            (pairs,) = self.head_dims_by_major.values()
            return f"(qk, v) {_pairs_text(pairs)}"  # its one major narrows: no "any" to narrow
        text = ", ".join(limits) or "any"
        for major, pairs in sorted(self.head_dims_by_major.items()):
            text += f"; on {major}.x (qk, v) {_pairs_text(pairs)} only"
        return text

    def capability_ok(self, cap: Capability) -> bool:
        if self.capability_majors is not None:
            return cap.major in self.capability_majors
        return cap.major >= self.min_major

    def validate(self, ctx: SelectionContext) -> list[str]:
        """Why this backend cannot run for ``ctx``; an empty list means it can."""
        reasons: list[str] = []
        if ctx.capability is None:
            if self.needs_gpu:
                reasons.append(f"no CUDA device (needs compute capability {self.capability_text})")
        elif self.needs_gpu and not self.capability_ok(ctx.capability):
            reasons.append(
                f"compute capability {ctx.capability} not supported (needs {self.capability_text})"
            )
        if ctx.dtype not in self.dtypes:
            allowed = " or ".join(d.value for d in Dtype if d in self.dtypes)
            reasons.append(f"dtype {ctx.dtype} not supported (needs {allowed})")
        if self.allowed_dims is not None and ctx.dims not in self.allowed_dims:
            allowed = " or ".join(
                f"DeepSeek-R1 dims {d}" if d == R1_DIMS else str(d)
                for d in sorted(self.allowed_dims, key=str)
            )
            reasons.append(f"model MLA dims {ctx.dims} not supported (needs {allowed})")
        if self.max_qk_head_dim is not None and ctx.dims.qk_head_dim > self.max_qk_head_dim:
            reasons.append(
                f"model MLA dims {ctx.dims} not supported (needs qk_nope_head_dim + "
                f"qk_rope_head_dim <= {self.max_qk_head_dim}, got {ctx.dims.qk_head_dim})"
            )
        if self.max_v_head_dim is not None and ctx.dims.v_head_dim > self.max_v_head_dim:
            reasons.append(
                f"model MLA dims {ctx.dims} not supported "
                f"(needs v_head_dim <= {self.max_v_head_dim}, got {ctx.dims.v_head_dim})"
            )
        if ctx.capability is not None and ctx.capability.major in self.head_dims_by_major:
            major = ctx.capability.major
            pairs = self.head_dims_by_major[major]
            head_dims = (ctx.dims.qk_head_dim, ctx.dims.v_head_dim)
            if head_dims not in pairs:
                kernel = self.kernel_by_major.get(major, "the kernel it runs there")
                reasons.append(
                    f"model MLA dims {ctx.dims} not supported on {major}.x: {kernel} takes "
                    f"head dims (qk, v) {_pairs_text(pairs)} only, not {head_dims}"
                )
        if ctx.packages is not None:
            reasons.extend(
                f"required package {name} not installed"
                for name in self.package_names
                if name not in ctx.packages
            )
        return reasons


def _pairs_text(pairs: frozenset[HeadDims]) -> str:
    return " or ".join(str(p) for p in sorted(pairs))


_HALF = frozenset({Dtype.BFLOAT16, Dtype.FLOAT16})

SPECS: dict[Backend, BackendSpec] = {
    spec.backend: spec
    for spec in (
        BackendSpec(
            backend=Backend.TRTLLM_RAGGED,
            needs_gpu=True,
            capability_majors=frozenset({10}),
            min_major=10,
            capability_text="10.x",
            dtypes=_HALF,
            head_dims_by_major={10: FLASHINFER_TRTLLM_RAGGED_HEAD_DIMS},
            kernel_by_major={10: "FlashInfer's trtllm-gen ragged DeepSeek kernel"},
            packages=(TORCH, FLASHINFER_PACKAGE),
            class_path="mla_switchboard.kernels.trtllm_ragged:TrtllmRaggedPrefill",
            summary="FlashInfer's TensorRT-LLM ragged DeepSeek kernel (Blackwell only)",
            colour=0,
        ),
        BackendSpec(
            backend=Backend.FLASHINFER,
            needs_gpu=True,
            capability_majors=frozenset({8, 9, 10, 11, 12}),
            min_major=8,
            capability_text="8.x to 12.x",
            dtypes=_HALF,
            head_dims_by_major={10: FLASHINFER_CUTLASS_HEAD_DIMS},
            kernel_by_major={10: "FlashInfer's CUTLASS ragged kernel"},
            packages=(TORCH, FLASHINFER_PACKAGE),
            class_path="mla_switchboard.kernels.flashinfer:FlashInferPrefill",
            summary="FlashInfer ragged prefill (FA3 on SM90 where built for the head dims, "
            "CUTLASS on SM100, FA2 JIT-built elsewhere)",
            colour=1,
        ),
        BackendSpec(
            backend=Backend.CUDNN,
            needs_gpu=True,
            min_major=8,
            capability_text="8.0 or newer",
            dtypes=_HALF,
            allowed_dims=frozenset({R1_DIMS}),
            packages=(TORCH, CUDNN_PACKAGE),
            class_path="mla_switchboard.kernels.cudnn:CudnnPrefill",
            summary="cuDNN frontend SDPA graph with ragged offsets",
            colour=2,
        ),
        BackendSpec(
            backend=Backend.FLASH_ATTN,
            needs_gpu=True,
            min_major=8,
            capability_text="8.0 or newer",
            dtypes=_HALF,
            max_qk_head_dim=256,
            max_v_head_dim=256,
            packages=(TORCH,),
            optional_packages=(FLASH_ATTN_PACKAGE,),
            class_path="mla_switchboard.kernels.flash_attn:FlashAttnPrefill",
            summary="FlashAttention varlen (FA3, FA2, or PyTorch's bundled FA2)",
            colour=3,
        ),
        BackendSpec(
            backend=Backend.TOKENSPEED_MLA,
            needs_gpu=True,
            capability_majors=frozenset({10}),
            min_major=10,
            capability_text="10.x",
            dtypes=_HALF,
            allowed_dims=frozenset({R1_DIMS}),
            packages=(TORCH, TOKENSPEED_MLA_PACKAGE),
            class_path="mla_switchboard.kernels.tokenspeed_mla:TokenspeedMlaPrefill",
            summary="TokenSpeed's MLA prefill kernel (Blackwell only; package tokenspeed_mla)",
            colour=4,
        ),
        BackendSpec(
            backend=Backend.TORCH_SDPA,
            needs_gpu=False,
            capability_text="any",
            dtypes=frozenset(Dtype),
            packages=(TORCH,),
            class_path="mla_switchboard.kernels.torch_sdpa:TorchSdpaPrefill",
            summary="PyTorch reference path (fp32 math); runs anywhere",
            colour=5,
        ),
    )
}


def _kernel_packages(specs: Mapping[Backend, BackendSpec]) -> dict[str, KernelPackage]:
    """Every package a backend needs or uses, by import name, in the table's order.

    One name must mean one package: two specs naming the same import with different
    distributions would make the probe's answer depend on which was read first.
    """
    found: dict[str, KernelPackage] = {}
    for spec in specs.values():
        for package in (*spec.packages, *spec.optional_packages):
            known = found.setdefault(package.import_name, package)
            if known != package:
                raise ValueError(f"package {package.import_name} is declared twice, differently")
    return found


KERNEL_PACKAGES: dict[str, KernelPackage] = _kernel_packages(SPECS)
"""The packages whose presence and version decide what a pod can run and how fast:
what the agent probes and what splits the fleet's evidence into situations."""
