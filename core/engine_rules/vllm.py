"""vLLM's MLA prefill rules, per release range.

Every range below was read off the tables in ``tools/engine_profiles/data/vllm/<release>.json``,
which ``python -m tools.engine_profiles.vllm`` produces by running each release's own
selection code (its ``AttentionConfig``, ``get_mla_prefill_backend`` and every backend's
``validate_configuration``) on a simulated CUDA platform. Releases whose tables agree
share a range; ``tests/core/test_engine_profiles_vllm.py`` checks every range against
every table, so a rule that drifts from the release it claims to describe fails CI.

Why per release: an explicit ``--attention-config.mla_prefill_backend=NAME`` that the
release finds invalid raises ``ValueError`` at model initialisation and the engine does
not start, so an answer must be valid in the very release the pod runs.

The source files each range's rules come from (in every release read):
  vllm/config/attention.py                        AttentionConfig.mla_prefill_backend
  vllm/v1/attention/backends/mla/prefill/registry.py   the names the flag accepts
  vllm/v1/attention/backends/mla/prefill/base.py       validate_configuration: dtype,
                                                       capability, availability, dims
  vllm/v1/attention/backends/mla/prefill/{flash_attn,flashinfer,trtllm_ragged,
                                          tokenspeed_mla}.py   each backend's checks
  vllm/v1/attention/backends/mla/prefill/selector.py   an invalid explicit choice raises
  selector.py (0.21-0.31) or vllm/platforms/interface.py (0.32 on): the automatic order
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mla_switchboard.core.engine_rules.base import (
    ChoiceFn,
    DeliberateRefusal,
    EngineChoice,
    EngineFlag,
    EngineProfile,
    OrderFn,
    RuleFn,
    Version,
)
from mla_switchboard.core.specs import (
    FLASHINFER_PACKAGE,
    KIMI_LINEAR_DIMS,
    R1_DIMS,
    TOKENSPEED_MLA_PACKAGE,
    Backend,
    Dtype,
    MLADims,
    SelectionContext,
)

__all__ = [
    "VLLM_EXCEPTIONS",
    "VLLM_LEGACY",
    "VLLM_PLAIN_ATTENTION",
    "VLLM_PREFILL_FLAG",
    "VLLM_PROFILES",
    "VLLM_RANGES",
    "VllmBackendRule",
    "VllmRange",
]

VLLM_PREFILL_FLAG = EngineFlag(option="--attention-config.mla_prefill_backend", joined=True)
"""What releases 0.21.0 to 0.34.0 parse into ``AttentionConfig.mla_prefill_backend``: each
table records its own release's ``EngineArgs`` parser taking it (and 0.20.2's refusing
it); no environment variable is read."""

_HALF = frozenset({Dtype.BFLOAT16, Dtype.FLOAT16})
MINICPM3_DIMS = MLADims(64, 32, 64)
VLLM_PLAIN_ATTENTION: dict[MLADims, str] = {MINICPM3_DIMS: "MiniCPM3"}
"""MLA-shaped models vLLM builds with plain ``Attention``: MiniCPM3 (0.34.0's
``model_executor/models/minicpm3.py``: ``MiniCPM3Attention`` wraps
``layers.attention.Attention``, and its model type is none of those ``is_deepseek_mla``
names), so ``--attention-config.mla_prefill_backend`` is never read for it. No MLA
model vLLM builds with MLA has these dims."""
SMALL_DIMS = MLADims(64, 64, 128)
GLM5_NOPE_DIMS = MLADims(256, 0, 256)


@dataclass(frozen=True)
class VllmBackendRule:
    """What one release range's ``validate_configuration`` checks for one backend.

    ``majors``: the compute capability majors it runs on (None: any CUDA device, the
    base class's default); ``dims``: the exact MLA dims it runs (None: any, the release
    does not check); ``packages``: the import names its ``is_available`` imports.
    """

    majors: frozenset[int] | None = None
    dims: frozenset[MLADims] | None = None
    dtypes: frozenset[Dtype] = _HALF
    packages: tuple[str, ...] = ()
    # (major, dims, why): on that capability major only these dims, for the reason given
    narrower: tuple[tuple[int, frozenset[MLADims], str], ...] = ()


@dataclass(frozen=True)
class VllmRange:
    """Releases ``[since, until)`` whose tables agree, and the rules they share.

    ``order`` is the release's own automatic priority list: the first entry whose
    capability major and dims match the pod (None matches anything) gives the list.
    ``changes`` says, for the docs and the reader, what differs from the range before.
    ``flag`` is how these releases are told a backend, as their tables record it.
    """

    since: Version
    until: Version | None
    releases: tuple[str, ...]
    backends: Mapping[Backend, VllmBackendRule]
    order: tuple[tuple[int | None, MLADims | None, tuple[Backend, ...]], ...]
    changes: str = ""
    flag: EngineFlag = VLLM_PREFILL_FLAG
    """How the range's releases are told the prefill backend (its parser's spelling)."""


_FLASHINFER = (FLASHINFER_PACKAGE.import_name,)
_BLACKWELL = frozenset({10})

# The release's automatic order (selector.py's _get_mla_prefill_backend_priorities in
# 0.21-0.31, platforms/interface.py's get_mla_prefill_backend_cls from 0.32): FLASH_ATTN
# first on every device; on 10.x the other backends follow it.
_ORDER_FA_FIRST: tuple[tuple[int | None, MLADims | None, tuple[Backend, ...]], ...] = (
    (
        10,
        None,
        (Backend.FLASH_ATTN, Backend.TRTLLM_RAGGED, Backend.FLASHINFER, Backend.TOKENSPEED_MLA),
    ),
    (None, None, (Backend.FLASH_ATTN,)),
)
# From 0.27.0: on 10.x, (192, 64, 256) puts TRTLLM_RAGGED first.
_ORDER_KIMI_TRTLLM_FIRST: tuple[tuple[int | None, MLADims | None, tuple[Backend, ...]], ...] = (
    (
        10,
        KIMI_LINEAR_DIMS,
        (Backend.TRTLLM_RAGGED, Backend.FLASH_ATTN, Backend.FLASHINFER, Backend.TOKENSPEED_MLA),
    ),
    *_ORDER_FA_FIRST,
)


def _r1_only_blackwell(packages: tuple[str, ...]) -> VllmBackendRule:
    return VllmBackendRule(majors=_BLACKWELL, dims=frozenset({R1_DIMS}), packages=packages)


_FA_DIMS_0_26 = frozenset({R1_DIMS, KIMI_LINEAR_DIMS, SMALL_DIMS})
_FA4_DIMS_0_26 = frozenset({R1_DIMS, SMALL_DIMS})
_FA_DIMS_0_30 = _FA_DIMS_0_26 | {GLM5_NOPE_DIMS}

_R1_ONLY_BACKENDS: dict[Backend, VllmBackendRule] = {
    Backend.FLASHINFER: _r1_only_blackwell(_FLASHINFER),
    Backend.TRTLLM_RAGGED: _r1_only_blackwell(_FLASHINFER),
    Backend.TOKENSPEED_MLA: _r1_only_blackwell((TOKENSPEED_MLA_PACKAGE.import_name,)),
}
_TRTLLM_KIMI = VllmBackendRule(
    majors=_BLACKWELL, dims=frozenset({R1_DIMS, KIMI_LINEAR_DIMS}), packages=_FLASHINFER
)

VLLM_RANGES: tuple[VllmRange, ...] = (
    VllmRange(
        since=(0, 30, 0),
        until=None,
        releases=("0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"),
        backends={
            Backend.FLASH_ATTN: VllmBackendRule(dims=_FA_DIMS_0_30),
            **_R1_ONLY_BACKENDS,
            Backend.TRTLLM_RAGGED: _TRTLLM_KIMI,
        },
        order=_ORDER_KIMI_TRTLLM_FIRST,
        changes="FLASH_ATTN adds GLM-5's NoPE layout (256, 0, 256).",
    ),
    VllmRange(
        since=(0, 27, 0),
        until=(0, 30, 0),
        releases=("0.27.0", "0.27.1", "0.28.0", "0.29.0"),
        backends={
            Backend.FLASH_ATTN: VllmBackendRule(dims=_FA_DIMS_0_26),
            **_R1_ONLY_BACKENDS,
            Backend.TRTLLM_RAGGED: _TRTLLM_KIMI,
        },
        order=_ORDER_KIMI_TRTLLM_FIRST,
        changes="FLASH_ATTN's dims check no longer depends on the FlashAttention version, so "
        "it runs (192, 64, 256) on 10.x too; on 10.x the automatic order puts TRTLLM_RAGGED "
        "first for (192, 64, 256).",
    ),
    VllmRange(
        since=(0, 26, 0),
        until=(0, 27, 0),
        releases=("0.26.0",),
        backends={
            Backend.FLASH_ATTN: VllmBackendRule(
                dims=_FA_DIMS_0_26,
                narrower=((10, _FA4_DIMS_0_26, "FlashAttention 4, its version there"),),
            ),
            **_R1_ONLY_BACKENDS,
            Backend.TRTLLM_RAGGED: _TRTLLM_KIMI,
        },
        order=_ORDER_FA_FIRST,
        changes="FLASH_ATTN checks MLA dims for the first time: (128, 64, 128), "
        "(192, 64, 256) or (64, 64, 128), and on 10.x, where it runs FlashAttention 4, "
        "not (192, 64, 256).",
    ),
    VllmRange(
        since=(0, 24, 0),
        until=(0, 26, 0),
        releases=("0.24.0", "0.25.0", "0.25.1"),
        backends={
            Backend.FLASH_ATTN: VllmBackendRule(),
            **_R1_ONLY_BACKENDS,
            Backend.TRTLLM_RAGGED: _TRTLLM_KIMI,
        },
        order=_ORDER_FA_FIRST,
        changes="TRTLLM_RAGGED runs (192, 64, 256) as well as (128, 64, 128).",
    ),
    VllmRange(
        since=(0, 21, 0),
        until=(0, 24, 0),
        releases=("0.21.0", "0.22.0", "0.22.1", "0.23.0"),
        backends={Backend.FLASH_ATTN: VllmBackendRule(), **_R1_ONLY_BACKENDS},
        order=_ORDER_FA_FIRST,
        changes="The flag appears. FLASH_ATTN checks no MLA dims and no capability; the "
        "FlashInfer-based backends and TOKENSPEED_MLA run DeepSeek-R1 dims on 10.x only.",
    ),
)
"""Newest first; each range's rules as read off its releases' tables."""


def _dims_text(allowed: frozenset[MLADims]) -> str:
    return " or ".join(sorted(str(d) for d in allowed))


def _majors_text(majors: frozenset[int]) -> str:
    return " or ".join(f"{m}.x" for m in sorted(majors))


def _rule_for(vrange: VllmRange) -> RuleFn:
    def rule(backend: Backend, ctx: SelectionContext, label: str) -> list[str]:
        spec = vrange.backends[backend]
        reasons: list[str] = []
        if ctx.capability is None:
            reasons.append(f"{label} runs MLA prefill only on a CUDA device")
        elif spec.majors is not None and ctx.capability.major not in spec.majors:
            reasons.append(
                f"{label} runs {backend} prefill only on compute capability "
                f"{_majors_text(spec.majors)} (this pod: {ctx.capability})"
            )
        if ctx.dtype not in spec.dtypes:
            reasons.append(
                f"{label} runs {backend} prefill only in float16 or bfloat16, not {ctx.dtype}"
            )
        if spec.dims is not None and ctx.dims not in spec.dims:
            reasons.append(
                f"{label} runs {backend} prefill only for MLA dims {_dims_text(spec.dims)}, "
                f"not {ctx.dims}"
            )
        elif ctx.capability is not None:
            for major, dims, why in spec.narrower:
                if ctx.capability.major == major and ctx.dims not in dims:
                    reasons.append(
                        f"{label} runs {backend} prefill on compute capability {major}.x "
                        f"only for MLA dims {_dims_text(dims)} ({why}), not {ctx.dims}"
                    )
        if ctx.packages is not None:
            reasons.extend(
                f"{label} runs {backend} prefill only with the {name} package installed "
                "(its availability check imports it)"
                for name in spec.packages
                if name not in ctx.packages
            )
        return reasons

    return rule


def _order_for(vrange: VllmRange) -> OrderFn:
    def order(ctx: SelectionContext) -> list[Backend]:
        major = None if ctx.capability is None else ctx.capability.major
        for want_major, want_dims, listed in vrange.order:
            if want_major is not None and want_major != major:
                continue
            if want_dims is not None and want_dims != ctx.dims:
                continue
            return list(listed)
        return []

    return order


def _choice_for(vrange: VllmRange) -> ChoiceFn:
    def choice(backend: Backend, ctx: SelectionContext, label: str) -> EngineChoice:
        flag = vrange.flag
        return EngineChoice(args=flag.args(backend.value), env=flag.environ(backend.value))

    return choice


def _legacy_choice_for(oldest: VllmRange) -> ChoiceFn:
    flag = oldest.flag.option or oldest.flag.env
    first = oldest.releases[0]

    def choice(backend: Backend, ctx: SelectionContext, label: str) -> EngineChoice:
        untold = f"{label} has no {flag} (added in vLLM {first})"
        return EngineChoice(
            note=f"{untold}: no engine flags are given, so vLLM keeps its own choice. "
            "Upgrade vLLM to direct its MLA prefill backend.",
            untold=untold,
        )

    return choice


def _profile(vrange: VllmRange) -> EngineProfile:
    return EngineProfile(
        name="vllm",
        display="vLLM",
        since=vrange.since,
        until=vrange.until,
        verified=vrange.releases[-1],
        sources=tuple(f"tools/engine_profiles/data/vllm/{r}.json" for r in vrange.releases),
        accepts=frozenset(vrange.backends),
        rule=_rule_for(vrange),
        default_order=_order_for(vrange),
        choice=_choice_for(vrange),
        plain_attention=VLLM_PLAIN_ATTENTION,
        releases=vrange.releases,
    )


VLLM_EXCEPTIONS: tuple[DeliberateRefusal, ...] = (
    DeliberateRefusal(
        Backend.FLASH_ATTN,
        since=(0, 21, 0),
        until=None,
        majors=frozenset({7}),
        reason="vLLM checks no compute capability for FLASH_ATTN prefill, so it takes the "
        "flag on 7.5, but the FlashAttention it bundles needs 8.0: get_flash_attn_version "
        "finds no FA version supported there (vllm_flash_attn's _is_fa2_supported: "
        "'FA2 is only supported on devices with compute capability >= 8'), and the FA2 "
        "kernel it calls anyway is built for 8.0 and newer. Our spec's 8.0 stands.",
    ),
    DeliberateRefusal(
        Backend.FLASH_ATTN,
        since=(0, 21, 0),
        until=(0, 26, 0),
        qk_head_dim_over=256,
        reason="vLLM 0.21 to 0.25 check no MLA dims for FLASH_ATTN, so they take it for a "
        "qk head dim over 256, which FlashAttention 2 and 3 are not built for (head dims "
        "at most 256): FA2, what vLLM runs off 9.x (and on 10.x for heads over 128), fails "
        "at the first prefill. On 9.x vLLM moves such heads to FlashAttention 4, whose "
        "SM90 path for them nothing here has run; vLLM itself refuses these dims from "
        "0.26.0 on. Our spec's limit of 256 stands.",
    ),
)
"""Where the core refuses, end to end (our spec with the release's rules), a backend
the release would take: the release accepts the flag but the kernel then fails. The
engine profiles themselves agree with every table exactly; these are the spec's
refusals, checked against every table by ``tests/core/test_engine_profiles_vllm.py``."""


def _legacy(oldest: VllmRange) -> EngineProfile:
    """Releases before 0.21.0 have no flag to direct the prefill backend: the answer
    gives no flags and says why. Their validity rules are the oldest range's (what
    vLLM's own choice will most nearly follow)."""
    return EngineProfile(
        name="vllm",
        display="vLLM",
        since=None,
        until=oldest.since,
        verified="0.20.2",
        sources=(
            "vllm/config/attention.py (use_cudnn_prefill, use_trtllm_ragged_deepseek_prefill)",
        ),
        accepts=frozenset(oldest.backends),
        rule=_rule_for(oldest),
        default_order=_order_for(oldest),
        choice=_legacy_choice_for(oldest),
        plain_attention=VLLM_PLAIN_ATTENTION,
    )


VLLM_LEGACY = _legacy(VLLM_RANGES[-1])
VLLM_PROFILES: tuple[EngineProfile, ...] = (*(_profile(r) for r in VLLM_RANGES), VLLM_LEGACY)
"""Newest first, as ``core/engines.py`` expects."""
