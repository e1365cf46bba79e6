"""SGLang's MLA prefill rules, as data per release range.

Each range is a run of releases whose tables agree: ``tools/engine_profiles/data/sglang/<v>.json``,
written by ``tools/engine_profiles/sglang.py`` from each release's own code (its argument
parser and the DeepSeek model's attention dispatch run under stubs; the rest read with
file:line). ``tests/core/test_engine_profiles_sglang.py`` checks every range against
every table: no answer a release rejects, no refusal where it runs the backend, except
the deliberate ``SGLANG_EXCEPTIONS`` below.

What holds in every range (python/sglang/srt/ in each release):
- the prefill backend is ``--prefill-attention-backend``, else ``--attention-backend``;
  decode likewise with ``--decode-attention-backend`` (each range's ``prefill_flag`` and
  ``decode_flag``, as its releases' parsers have them), so our flags pin the decode
  backend to SGLang's own automatic choice and setting prefill alone moves nothing;
- SGLang's automatic MLA backend: fa3 on 9.x, flashinfer on 10.x, otherwise triton
  (which Switchboard does not offer);
- fa3 asserts compute capability 9.x for MLA models (its own assert, evaluated);
- FlashInfer's ragged prefill runs CUTLASS on 10.x (``fmha_backend = "cutlass"``),
  which takes head dims (qk, v) = (192, 128), (128, 128), (64, 64) only, and
  ``auto`` (FA3 on 9.x, FA2 elsewhere from 8.0) on other devices, 12.x included;
- trtllm_mla prefill runs FlashInfer's trtllm-gen ragged DeepSeek kernel (10.x only),
  ``trtllm_ragged_attention_deepseek`` in ``flashinfer/prefill.py`` of the FlashInfer
  release SGLang pins, for the (qk, v) head dims that release's check takes (each
  range's ``trtllm_head_dims``, the tables' ``trtllm_ragged_head_dims``); 0.5.1 to
  0.5.1.post3 have no trtllm_mla prefill of their own and run their parent's,
  FlashInfer's MLA backend (CUTLASS on 10.x);
- flashinfer is an SGLang dependency (from 0.5.3 a plain one, before in the ``srt``
  extra the server needs), so a pod running SGLang has it.
Standard library only.
"""

from __future__ import annotations

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
    version_text,
)
from mla_switchboard.core.specs import (
    FLASHINFER_CUTLASS_HEAD_DIMS,
    FLASHINFER_PACKAGE,
    FLASHINFER_TRTLLM_RAGGED_HEAD_DIMS,
    R1_DIMS,
    Backend,
    Dtype,
    HeadDims,
    SelectionContext,
)

__all__ = [
    "FA4_SM100",
    "SGLANG_DECODE_FLAG",
    "SGLANG_EXCEPTIONS",
    "SGLANG_FIRST",
    "SGLANG_NAMES",
    "SGLANG_PREFILL_FLAG",
    "SGLANG_PROFILES",
    "SGLANG_RANGES",
    "SGLANG_UNVERIFIED",
    "Fa4HeadDims",
    "SglangRange",
]

SGLANG_NAMES: dict[str, Backend] = {
    "fa3": Backend.FLASH_ATTN,
    "fa4": Backend.FLASH_ATTN,
    "flashinfer": Backend.FLASHINFER,
    "trtllm_mla": Backend.TRTLLM_RAGGED,
    "tokenspeed_mla": Backend.TOKENSPEED_MLA,
}
"""SGLang's attention backend names that run one of ours, the one map between them: the
profile passes these names, and ``tools/engine_profiles/sglang.py`` asks each release
about exactly these. FLASH_ATTN is fa3 on 9.x and fa4 (FlashAttention 4) on 10.x."""

_HALF = (Dtype.BFLOAT16, Dtype.FLOAT16)

# What trtllm_mla prefill takes, as (qk head dim, v head dim): the check at the top of
# FlashInfer's trtllm_ragged_attention_deepseek (flashinfer/prefill.py), in the
# flashinfer-python release each SGLang release pins (its METADATA), run by
# tools/engine_profiles/sglang.py over every pair and recorded per release table as
# ``trtllm_ragged_head_dims``; tests/core/test_engine_profiles_sglang.py holds each
# range to its tables.
_RAGGED_DSR1: frozenset[HeadDims] = frozenset({(192, 128)})
"""flashinfer-python 0.3.1 to 0.6.3 (SGLang 0.5.2 to 0.5.9): one assert, DeepSeek-R1's
(192, 192, 128) only."""
_RAGGED_SMALL: frozenset[HeadDims] = _RAGGED_DSR1 | {(128, 128)}
"""flashinfer-python 0.6.7.post2 to 0.6.11.post1 (SGLang 0.5.10 to 0.5.12.post1):
``is_dsr1 or is_smaller_dimensions``."""
_RAGGED_GLM5: frozenset[HeadDims] = FLASHINFER_TRTLLM_RAGGED_HEAD_DIMS
"""flashinfer-python 0.6.12 to 0.7.2 (SGLang 0.5.13 on): ``is_dsr1 or
is_smaller_dimensions or is_glm5``, what core/specs.py's TRTLLM_RAGGED spec holds."""


@dataclass(frozen=True)
class Fa4HeadDims:
    """The (qk, v) head dims FlashAttention 4's own check (``_validate_head_dims`` in
    ``flash_attn/cute/interface.py``) takes on SM100/SM110: both at most ``up_to``, or
    one of ``also``, each a multiple of 8 (16 bytes of a 16-bit dtype)."""

    up_to: int
    also: frozenset[HeadDims]

    def takes(self, qk_v: HeadDims) -> bool:
        qk, v = qk_v
        if qk % 8 or v % 8:
            return False
        return max(qk, v) <= self.up_to or qk_v in self.also

    @property
    def text(self) -> str:
        also = ", ".join(str(p) for p in sorted(self.also))
        return f"both at most {self.up_to}, or {also}"


FA4_SM100 = Fa4HeadDims(128, frozenset({(64, 512), (192, 128), (256, 256), (512, 512)}))
"""What every vendored FlashAttention 4 read takes on 10.x (SGLang 0.5.16 to 0.5.23,
run by ``tools/engine_profiles/sglang_fa4.py``, the tables' ``fa4_head_dims``)."""
FA4_READ = "0.5.16 to 0.5.23"
_RAGGED_KERNEL = "FlashInfer's trtllm-gen ragged DeepSeek kernel"
_PARENT_KERNEL = (
    "its parent FlashInfer MLA backend's ragged prefill (trtllm_mla has none of its own), "
    "FlashInfer's CUTLASS kernel on 10.x"
)
SGLANG_FIRST = (0, 4, 9, 5)  # the first release with --prefill-attention-backend
SGLANG_PREFILL_FLAG = EngineFlag(option="--prefill-attention-backend")
SGLANG_DECODE_FLAG = EngineFlag(option="--decode-attention-backend")
_SOURCES = (
    "python/sglang/srt/server_args.py (and arg_groups/ from 0.5.19)",
    "python/sglang/srt/models/deepseek_v2.py (models/deepseek_common/ from 0.5.8)",
    "python/sglang/srt/layers/attention/attention_registry.py",
    "python/sglang/srt/layers/attention/flashinfer_mla_backend.py",
)


@dataclass(frozen=True)
class SglangRange:
    """What one run of SGLang releases does, as the release tables show it."""

    since: Version
    until: Version | None
    releases: tuple[str, ...]  # the releases whose tables agree (and were checked)
    accepts: frozenset[Backend]  # our backends with a --prefill-attention-backend name
    fa4: bool  # fa4 is a prefill choice: FLASH_ATTN on 10.x
    ragged_needs_rope: bool  # FlashInfer's ragged prefill is off when qk_rope_head_dim is 0
    deepseek_trtllm_default: bool  # DeepSeek-V3 family on 10.x defaults to trtllm_mla
    tokenspeed_refusal: str | None  # why its tokenspeed_mla name cannot be a prefill choice
    prefill_flag: EngineFlag = SGLANG_PREFILL_FLAG  # how these releases are told the prefill
    decode_flag: EngineFlag = SGLANG_DECODE_FLAG  # ... and the decode backend (pinned)
    trtllm_head_dims: frozenset[HeadDims] = frozenset()
    """The (qk, v) head dims trtllm_mla prefill takes on 10.x: those of the kernel it
    runs, as its releases' tables read them (empty: trtllm_mla is no prefill choice)."""
    trtllm_kernel: str = _RAGGED_KERNEL  # the kernel trtllm_mla prefill runs, for reasons
    fa4_head_dims: Fa4HeadDims | None = None
    """What fa4 prefill takes on 10.x, read from these releases' vendored FlashAttention 4
    (None: they vendor none, fa4 comes from sgl_kernel, unread: the rule then holds them
    to what every FA4 read takes, ``FA4_SM100``, a deliberate refusal)."""

    @property
    def verified(self) -> str:
        return self.releases[-1]


_BASE = frozenset({Backend.FLASH_ATTN, Backend.FLASHINFER})
_TRT = _BASE | {Backend.TRTLLM_RAGGED}
_TS = _TRT | {Backend.TOKENSPEED_MLA}
_NEEDS_FP8 = (
    "tokenspeed_mla backend requires --kv-cache-dtype fp8_e4m3, which a prefill choice "
    "must not impose"
)

SGLANG_RANGES: tuple[SglangRange, ...] = (
    SglangRange(
        (0, 5, 23),
        None,
        ("0.5.23",),
        _TS,
        True,
        True,
        True,
        "tokenspeed_mla is a deprecated alias of cutedsl_mla, which only decodes",
        trtllm_head_dims=_RAGGED_GLM5,
        fa4_head_dims=FA4_SM100,
    ),
    SglangRange(
        (0, 5, 20),
        (0, 5, 23),
        ("0.5.20", "0.5.21", "0.5.22"),
        _TS,
        True,
        True,
        True,
        _NEEDS_FP8,
        trtllm_head_dims=_RAGGED_GLM5,
        fa4_head_dims=FA4_SM100,
    ),
    SglangRange(
        (0, 5, 16),
        (0, 5, 20),
        ("0.5.16", "0.5.17", "0.5.18", "0.5.19"),
        _TS,
        True,
        False,
        True,
        _NEEDS_FP8,
        trtllm_head_dims=_RAGGED_GLM5,
        fa4_head_dims=FA4_SM100,
    ),
    SglangRange(
        (0, 5, 13),
        (0, 5, 16),
        ("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1"),
        _TS,
        True,
        False,
        True,
        _NEEDS_FP8,
        trtllm_head_dims=_RAGGED_GLM5,
    ),
    SglangRange(
        (0, 5, 12),
        (0, 5, 13),
        ("0.5.12", "0.5.12.post1"),
        _TS,
        True,
        False,
        True,
        _NEEDS_FP8,
        trtllm_head_dims=_RAGGED_SMALL,
    ),
    SglangRange(
        (0, 5, 10),
        (0, 5, 12),
        ("0.5.10", "0.5.10.post1", "0.5.11"),
        _TRT,
        True,
        False,
        True,
        None,
        trtllm_head_dims=_RAGGED_SMALL,
    ),
    SglangRange(
        (0, 5, 3, 2),
        (0, 5, 10),
        (
            "0.5.3.post2",
            "0.5.3.post3",
            "0.5.4",
            "0.5.4.post1",
            "0.5.4.post2",
            "0.5.4.post3",
            "0.5.5",
            "0.5.5.post1",
            "0.5.5.post2",
            "0.5.5.post3",
            "0.5.6",
            "0.5.6.post1",
            "0.5.6.post2",
            "0.5.7",
            "0.5.8",
            "0.5.8.post1",
            "0.5.9",
        ),
        _TRT,
        True,
        False,
        True,
        None,
        trtllm_head_dims=_RAGGED_DSR1,
    ),
    SglangRange(
        (0, 5, 3),
        (0, 5, 3, 2),
        ("0.5.3", "0.5.3.post1"),
        _TRT,
        True,
        False,
        False,
        None,
        trtllm_head_dims=_RAGGED_DSR1,
    ),
    SglangRange(
        (0, 5, 2),
        (0, 5, 3),
        ("0.5.2",),
        _TRT,
        False,
        False,
        False,
        None,
        trtllm_head_dims=_RAGGED_DSR1,
    ),
    SglangRange(
        (0, 5, 1),
        (0, 5, 2),
        ("0.5.1", "0.5.1.post1", "0.5.1.post2", "0.5.1.post3"),
        _TRT,
        False,
        False,
        False,
        None,
        trtllm_head_dims=FLASHINFER_CUTLASS_HEAD_DIMS,
        trtllm_kernel=_PARENT_KERNEL,
    ),
    SglangRange(
        SGLANG_FIRST,
        (0, 5, 1),
        ("0.4.9.post5", "0.4.9.post6", "0.4.10", "0.4.10.post1", "0.4.10.post2"),
        _BASE,
        False,
        False,
        False,
        None,
    ),
)
"""Newest first; together they cover every release from 0.4.9.post5 on."""


def _rule(r: SglangRange) -> RuleFn:
    def rule(backend: Backend, ctx: SelectionContext, label: str) -> list[str]:
        cap = ctx.capability
        if cap is None:
            return [f"{label} runs MLA prefill only on a CUDA device"]
        reasons: list[str] = []
        if ctx.dtype not in _HALF:
            reasons.append(f"{label} runs MLA prefill only in float16 or bfloat16, not {ctx.dtype}")
        dims = ctx.dims
        if backend is Backend.FLASH_ATTN and not (cap.major == 9 or (r.fa4 and cap.major == 10)):
            reasons.append(
                f"{label} runs FLASH_ATTN MLA prefill as fa3 on 9.x"
                + (" or fa4 on 10.x" if r.fa4 else "")
                + f" only: fa3 asserts 9.x for MLA models (this pod: {cap})"
            )
        if backend is Backend.FLASH_ATTN and r.fa4 and cap.major == 10:
            reasons.extend(_fa4_reasons(r, ctx, label))
        if backend is Backend.FLASHINFER:
            qk_v = (dims.qk_head_dim, dims.v_head_dim)
            if cap.major < 8:
                reasons.append(
                    f"{label} runs FlashInfer's MLA prefill only from compute capability 8.0 "
                    f"(this pod: {cap})"
                )
            elif cap.major == 10 and qk_v not in FLASHINFER_CUTLASS_HEAD_DIMS:
                pairs = ", ".join(str(p) for p in sorted(FLASHINFER_CUTLASS_HEAD_DIMS))
                reasons.append(
                    f"{label} runs FLASHINFER prefill on 10.x as FlashInfer's CUTLASS kernel, "
                    f"which takes head dims (qk, v) = {pairs} only (model: {qk_v})"
                )
            if r.ragged_needs_rope and dims.qk_rope_head_dim == 0:
                reasons.append(
                    f"{label} turns FlashInfer's ragged MLA prefill off when qk_rope_head_dim is 0"
                )
        if backend is Backend.TRTLLM_RAGGED:
            reasons.extend(_trtllm_reasons(r, ctx, label))
        if backend is Backend.TOKENSPEED_MLA and r.tokenspeed_refusal:
            reasons.append(f"{label}: {r.tokenspeed_refusal}")
        return reasons

    return rule


def _fa4_reasons(r: SglangRange, ctx: SelectionContext, label: str) -> list[str]:
    """Why fa4 prefill fails on 10.x for these head dims: its FlashAttention 4 asserts on
    them at the first prefill (SGLang's own dispatch does not look)."""
    qk_v = (ctx.dims.qk_head_dim, ctx.dims.v_head_dim)
    dims = r.fa4_head_dims or FA4_SM100
    if dims.takes(qk_v):
        return []
    model = f"(model: {qk_v}, MLA dims {ctx.dims})"
    if r.fa4_head_dims is not None:
        return [
            f"{label} runs FLASH_ATTN prefill on 10.x as fa4, whose vendored FlashAttention 4 "
            f"takes head dims (qk, v) {dims.text} only {model}"
        ]
    return [
        f"{label} runs FLASH_ATTN prefill on 10.x as fa4, sgl_kernel's FlashAttention 4, "
        f"whose head-dim check was not read; every FlashAttention 4 read (SGLang {FA4_READ}) "
        f"takes head dims (qk, v) {dims.text} only {model}"
    ]


def _trtllm_reasons(r: SglangRange, ctx: SelectionContext, label: str) -> list[str]:
    """Why trtllm_mla prefill does not run here: off 10.x, or head dims its kernel does
    not take (the reason names the ones it does, so a model's author sees what fits)."""
    reasons = []
    cap = ctx.capability
    if cap is not None and cap.major != 10:
        reasons.append(
            f"{label} runs trtllm_mla prefill ({r.trtllm_kernel}) only on compute "
            f"capability 10.x (this pod: {cap})"
        )
    qk_v = (ctx.dims.qk_head_dim, ctx.dims.v_head_dim)
    if qk_v not in r.trtllm_head_dims:
        pairs = ", ".join(str(p) for p in sorted(r.trtllm_head_dims))
        reasons.append(
            f"{label} runs trtllm_mla prefill as {r.trtllm_kernel}, which takes head dims "
            f"(qk, v) = {pairs} only (model: {qk_v}, MLA dims {ctx.dims})"
        )
    return reasons


def _decode(r: SglangRange, ctx: SelectionContext) -> str:
    """SGLang's own decode backend for the pod, pinned so that our prefill flag does not
    move it. The request does not carry the model's architecture, so MLA dims
    (128, 64, 128) on 10.x stand for the DeepSeek-V3 family."""
    cap = ctx.capability
    if cap is not None and cap.major == 9:
        return "fa3"
    if cap is not None and cap.major == 10:
        return "trtllm_mla" if r.deepseek_trtllm_default and ctx.dims == R1_DIMS else "flashinfer"
    return "triton"


def _prefill_name(backend: Backend, ctx: SelectionContext) -> str:
    """SGLang's name for ``backend`` on this pod (FLASH_ATTN: fa4 on 10.x, else fa3)."""
    if backend is Backend.FLASH_ATTN:  # two names for one backend: by generation
        return "fa4" if ctx.capability is not None and ctx.capability.major == 10 else "fa3"
    (name,) = [name for name, ours in SGLANG_NAMES.items() if ours is backend]
    return name


def _order(r: SglangRange) -> OrderFn:
    def order(ctx: SelectionContext) -> list[Backend]:
        cap = ctx.capability
        if cap is not None and cap.major == 9:
            return [Backend.FLASH_ATTN]
        if cap is not None and cap.major == 10:
            listed = [Backend.FLASHINFER, Backend.TRTLLM_RAGGED, Backend.FLASH_ATTN]
            if r.deepseek_trtllm_default and ctx.dims == R1_DIMS:
                listed = [Backend.TRTLLM_RAGGED, Backend.FLASHINFER, Backend.FLASH_ATTN]
            return [b for b in listed if b in r.accepts and (b is not Backend.FLASH_ATTN or r.fa4)]
        return []  # SGLang's default there is triton, which Switchboard does not offer

    return order


def _choice(r: SglangRange) -> ChoiceFn:
    def choice(backend: Backend, ctx: SelectionContext, label: str) -> EngineChoice:
        prefill, decode = _prefill_name(backend, ctx), _decode(r, ctx)
        return EngineChoice(
            args=(*r.prefill_flag.args(prefill), *r.decode_flag.args(decode)),
            env={**r.prefill_flag.environ(prefill), **r.decode_flag.environ(decode)},
        )

    return choice


def _unverified_choice(backend: Backend, ctx: SelectionContext, label: str) -> EngineChoice:
    flag = SGLANG_RANGES[-1].prefill_flag.option
    untold = (
        f"{label} has no {flag} (SGLang's first release with it is {version_text(SGLANG_FIRST)})"
    )
    return EngineChoice(
        note=f"{untold}: no engine flags are given, so SGLang keeps its own choice.",
        untold=untold,
    )


_BUNDLED = frozenset({FLASHINFER_PACKAGE.import_name})


def _profile(r: SglangRange) -> EngineProfile:
    return EngineProfile(
        name="sglang",
        display="SGLang",
        since=r.since,
        until=r.until,
        verified=r.verified,
        sources=_SOURCES,
        accepts=r.accepts,
        rule=_rule(r),
        default_order=_order(r),
        choice=_choice(r),
        bundled_packages=_BUNDLED,
        releases=r.releases,
    )


SGLANG_UNVERIFIED = EngineProfile(
    name="sglang",
    display="SGLang",
    since=None,
    until=SGLANG_FIRST,
    verified="0.4.9.post4",
    sources=(),
    accepts=SGLANG_RANGES[-1].accepts,
    rule=_rule(SGLANG_RANGES[-1]),
    default_order=_order(SGLANG_RANGES[-1]),
    choice=_unverified_choice,
    bundled_packages=_BUNDLED,
)
"""Releases before 0.4.9.post5: no prefill flag, so no flags; the first range's rules
stand for what they run."""

SGLANG_PROFILES: tuple[EngineProfile, ...] = (
    *(_profile(r) for r in SGLANG_RANGES),
    SGLANG_UNVERIFIED,
)
"""Newest first."""

SGLANG_EXCEPTIONS: tuple[DeliberateRefusal, ...] = (
    DeliberateRefusal(
        Backend.FLASH_ATTN,
        since=(0, 5, 3),
        until=None,
        majors=frozenset({7, 8, 11, 12}),
        reason="fa4 off 9.x and 10.x: SGLang's code refuses nothing when fa4 is the "
        "prefill backend on 7.5, 8.x, 11.x or 12.x (its dispatch sends prefill to "
        "FlashAttention 4's MHA path), but FlashAttention 4 (flash_attn.cute) is built for "
        "Hopper and datacenter Blackwell and nothing here verifies it on those devices, so "
        "the profile passes fa3 on 9.x and fa4 on 10.x only.",
    ),
    DeliberateRefusal(
        Backend.FLASH_ATTN,
        since=SGLANG_FIRST,
        until=None,
        qk_head_dim_over=256,
        reason="SGLang checks no head dims for fa3 or fa4 prefill, so it takes them for a qk "
        "head dim over 256, which FlashAttention 3 is not built for (at most 256) nor "
        "FlashAttention 4 on 10.x (at most 128, or (192, 128), or (256, 256) in newer "
        "builds): the kernel fails at the first prefill. Our spec's limit of 256 stands.",
    ),
    DeliberateRefusal(
        Backend.FLASH_ATTN,
        since=(0, 5, 3),
        until=(0, 5, 16),
        majors=frozenset({10}),
        head_dims_taken=FA4_SM100.takes,
        reason="fa4 on 10.x for head dims no FlashAttention 4 read takes (0.5.3 to "
        "0.5.15.post1): these releases run sgl_kernel's FlashAttention 4, outside the wheel, "
        "whose head-dim check was not read; every one read (the vendored ones of SGLang "
        f"{FA4_READ}, and vLLM 0.33.0's) asserts on them at the first prefill, so they are "
        "refused here too although SGLang's own dispatch sends them to fa4.",
    ),
    DeliberateRefusal(
        Backend.TRTLLM_RAGGED,
        since=(0, 5, 1),
        until=(0, 5, 2),
        majors=frozenset({10}),
        reason="SGLang 0.5.1 to 0.5.1.post3 give trtllm_mla no prefill of its own: it runs "
        "its parent FlashInfer MLA backend's, FlashInfer's CUTLASS kernel on 10.x, which "
        "takes head dims (qk, v) = (64, 64) as well. TRTLLM_RAGGED is FlashInfer's "
        "trtllm-gen ragged DeepSeek kernel, which does not take them, and that same CUTLASS "
        "kernel is what FLASHINFER answers there: so such dims are refused TRTLLM_RAGGED "
        "rather than answered with a name for a kernel that is not the one that runs.",
    ),
)
"""Where the core refuses, end to end (our spec with the release's rules), a backend
the release's own code would run, on purpose; checked against every table by
``tests/core/test_engine_profiles_sglang.py``, where each must excuse a refusal."""
