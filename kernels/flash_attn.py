"""FLASH_ATTN: FlashAttention varlen, through the first of four code paths that works.

Why four paths, in this order:

1. **vLLM's bundled FlashAttention** (``vllm.vllm_flash_attn.flash_attn_varlen_func``)
   when vLLM is installed: it is what vLLM's own FLASH_ATTN MLA prefill backend runs
   (vLLM 0.33.0, ``vllm/v1/attention/backends/mla/prefill/flash_attn.py``), with the
   version vLLM picks (``fa_utils.get_flash_attn_version``): FA3 on 9.x, FA4 on 10.x,
   FA2 otherwise. FA3 on 9.x and FA4 take MLA's 192/128 head dims natively; vLLM
   pads ``v`` for its FA2, and so do we. ``impl`` reads ``vllm-fa3`` / ``vllm-fa4``
   / ``vllm-fa2``. Measuring this path is measuring what a vLLM pod runs.
2. ``flash_attn_interface.flash_attn_varlen_func`` (FA3, 9.x only), the dims FA3 takes.
3. ``flash_attn.flash_attn_varlen_func`` (FA2), one head dim for q, k and v.
4. ``torch.ops.aten._flash_attention_forward``: PyTorch's bundled FA2 varlen kernel,
   so a pod with nothing but torch still gets a FlashAttention kernel.

FA2 paths pad the head dims that are not already the common multiple of 8 (for
R1 dims only ``v``, 128 -> 192: zeros added to v only add output columns, which are
sliced off); FA3 paths pad only what FA3's pairs of head dims need
(:func:`fa3_head_dims`: (192, 64) runs as (192, 128)). All paths return the varlen
LSE as ``[H, T_q]`` natural log, FlashAttention's native layout; a padded
``[B, H, max_q]`` layout from an older build is unpacked. Proven on the H200:
``vllm-fa3`` (vLLM 0.25.0's ``vllm_flash_attn``) and ``torch-bundled-fa2``; the
``flash_attn`` and ``flash_attn_interface`` package paths follow their documented
APIs (see README).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from mla_switchboard.core.specs import Backend
from mla_switchboard.kernels.base import BackendUnavailable, MLAPrefillKernel, RaggedBatch
from torch import Tensor

__all__ = ["FlashAttnPrefill", "fa3_head_dims", "vllm_fa_version"]

#: Options accepted by ``impl=``; ``vllm`` lets vLLM's rule pick the FA version.
IMPLS = (
    "vllm",
    "vllm-fa4",
    "vllm-fa3",
    "vllm-fa2",
    "flash-attn3",
    "flash-attn2",
    "torch-bundled-fa2",
)
DEFAULT_ORDER = ("vllm", "flash-attn3", "flash-attn2", "torch-bundled-fa2")


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


FA3_MAX_HEAD_DIM = 256


def fa3_head_dims(qk: int, v: int) -> tuple[int, int]:
    """The (qk, v) head dims to call FlashAttention 3 (Hopper) with for a model's
    ``qk`` and ``v``: each a multiple of 8, and, where they differ, a pair FA3 takes.

    FA3's own check (``hopper/flash_api.cpp``, the build vLLM bundles as well): "If V
    headdim is different from Q/K dim, we only support Q/K headdim in (128, 192] and V
    headdim in (96, 128], or (Q/K <= 64 and V <= 512)". DeepSeek-R1's (192, 128) is such
    a pair; (192, 64) is not and raised at the first prefill. Zeros added to q and k
    leave every score as it was (the scale is passed explicitly), and zeros added to v
    only add output columns, which are sliced off: so ``v`` is padded to 128 where that
    makes a pair FA3 takes, and otherwise both to the larger one (equal dims, up to
    256, are always taken). Raises ValueError past 256, which the spec refuses
    first (``max_qk_head_dim``, ``max_v_head_dim``)."""
    qk8, v8 = _round_up(qk, 8), _round_up(v, 8)
    if qk8 == v8 or (128 < qk8 <= 192 and 96 < v8 <= 128) or (qk8 <= 64 and v8 <= 512):
        pair = (qk8, v8)
    elif 128 < qk8 <= 192 and v8 <= 96:
        pair = (qk8, 128)
    else:
        pair = (max(qk8, v8), max(qk8, v8))
    small_qk = pair[0] <= 64  # then v may go up to 512
    if pair[0] > FA3_MAX_HEAD_DIM or (pair[1] > FA3_MAX_HEAD_DIM and not small_qk):
        raise ValueError(f"FlashAttention 3 takes head dims up to 256, not (qk={qk}, v={v})")
    return pair


def vllm_fa_version(major: int, supported: Any) -> int:
    """The FA version vLLM's ``get_flash_attn_version`` picks for this GPU.

    vLLM 0.33.0, ``vllm/v1/attention/backends/fa_utils.py``: FA3 on major 9 when
    supported, FA4 on major 10 when supported, FA2 otherwise (also on 10.x and
    newer when FA4 is missing). ``supported(version) -> bool`` is vLLM's own
    ``is_fa_version_supported``.
    """
    if major == 9 and supported(3):
        return 3
    if major == 10 and supported(4):
        return 4
    return 2


def unpad_lse(lse: torch.Tensor, batch: RaggedBatch, num_heads: int) -> torch.Tensor:
    """Bring a FlashAttention LSE to ``[H, T_q]`` float32, whatever layout it came in.

    FlashAttention >= 2.4 (and FA3) return varlen LSE as ``[H, T_q]``; older FA2
    builds returned ``[B, H, max_seqlen_q]`` padded per sequence.
    """
    t_q = batch.host_cu_q[-1]
    if lse.dim() == 2 and lse.shape[0] == num_heads and lse.shape[1] == t_q:
        if lse.dtype is torch.float32 and lse.is_contiguous():
            return lse
        return lse.float().contiguous()
    if lse.dim() == 3 and lse.shape[0] == batch.batch_size and lse.shape[1] == num_heads:
        parts = [lse[b, :, : batch.lens_q[b]] for b in range(batch.batch_size)]
        return torch.cat(parts, dim=1).float().contiguous()
    raise RuntimeError(
        f"unexpected FlashAttention LSE shape {tuple(lse.shape)} "
        f"(expected [{num_heads}, {t_q}] or [B, {num_heads}, max_seqlen_q])"
    )


class FlashAttnPrefill(MLAPrefillKernel):
    """FlashAttention varlen prefill.

    Option ``impl``: force one of :data:`IMPLS` (``vllm`` = vLLM's bundled
    FlashAttention at the version vLLM would pick; ``vllm-fa3`` etc. force one).
    Default: the first of ``vllm``, ``flash-attn3``, ``flash-attn2``,
    ``torch-bundled-fa2`` that imports and suits the GPU. ``inst.tried`` lists why the
    paths before the chosen one were skipped.
    """

    backend = Backend.FLASH_ATTN

    def _build(self, *, impl: str | None = None, **options: Any) -> None:
        super()._build(**options)
        if impl is not None and impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
        self.tried: list[str] = []
        order = [impl] if impl is not None else list(DEFAULT_ORDER)
        for candidate in order:
            reason = self._try_path(candidate)
            if reason is None:
                return
            self.tried.append(f"{candidate}: {reason}")
        raise BackendUnavailable(self.backend, self.tried)

    def _pad_plan(self, kernel: str) -> None:
        """The head dims the kernel is called with: FA2 wants one (a multiple of 8) for
        q, k and v; FA3 takes two within its limits (:func:`fa3_head_dims`); FA4 takes
        MLA's natively."""
        qk, v = self.dims.qk_head_dim, self.dims.v_head_dim
        if kernel == "fa4":
            padded_qk, padded_v = qk, v
        elif kernel == "fa3":
            padded_qk, padded_v = fa3_head_dims(qk, v)
        else:
            padded_qk = padded_v = _round_up(max(qk, v), 8)
        self._pad_qk, self._pad_v = padded_qk - qk, padded_v - v

    def _try_path(self, path: str) -> str | None:
        """Set up ``path``; return None on success (``self.impl`` set) or why not."""
        cap = self.capability
        if path.startswith("vllm"):
            if importlib.util.find_spec("vllm") is None:
                return "vLLM not installed"
            try:
                mod = importlib.import_module("vllm.vllm_flash_attn")
            except Exception as exc:  # ImportError, or a broken build failing at import
                return f"vllm.vllm_flash_attn not importable ({type(exc).__name__}: {exc})"
            supported = getattr(mod, "is_fa_version_supported", None)
            if supported is None:
                return "vllm.vllm_flash_attn has no is_fa_version_supported"
            major = cap.major if cap is not None else 0
            try:
                version = int(path[-1]) if path != "vllm" else vllm_fa_version(major, supported)
                if not supported(version):
                    why = getattr(mod, "fa_version_unsupported_reason", lambda v: None)(version)
                    return f"vLLM FA{version} unsupported here ({why})"
            except Exception as exc:
                return f"vLLM FA version probe failed ({type(exc).__name__}: {exc})"
            self._fn = mod.flash_attn_varlen_func
            self._fa_version = version
            # vLLM runs 192/128 natively with FA3 on 9.x and with FA4; it pads v for FA2.
            fa3 = version == 3 and major == 9
            self._pad_plan("fa4" if version == 4 else "fa3" if fa3 else "fa2")
            self._kind = "vllm"
            self.impl = f"vllm-fa{version}"
            return None
        if path == "flash-attn3":
            if cap is None or cap.major != 9:
                return f"FA3 needs compute capability 9.x, got {cap}"
            problem = self._use_package("flash_attn_interface", kernel="fa3")
            if problem is not None:
                return problem
        elif path == "flash-attn2":
            problem = self._use_package("flash_attn", kernel="fa2")
            if problem is not None:
                return problem
        else:
            op = getattr(torch.ops.aten, "_flash_attention_forward", None)
            if op is None:
                return "torch.ops.aten._flash_attention_forward missing from this torch"
            self._fn = op
            self._pad_plan("fa2")
        try:
            params = inspect.signature(self._fn).parameters
        except (TypeError, ValueError):
            params = {}
        self._has_return_attn_probs = "return_attn_probs" in params
        self._kind = path
        self.impl = path
        return None

    def _use_package(self, module: str, *, kernel: str) -> str | None:
        """Call ``module``'s ``flash_attn_varlen_func``; None, or why it cannot be used."""
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            return f"{module} not importable ({exc})"
        self._fn = mod.flash_attn_varlen_func
        self._pad_plan(kernel)
        return None

    def _forward(
        self, q: Tensor, k: Tensor, v: Tensor, batch: RaggedBatch, *, causal: bool, return_lse: bool
    ) -> tuple[Tensor, Tensor | None]:
        if self._pad_qk:
            q = F.pad(q, (0, self._pad_qk))
            k = F.pad(k, (0, self._pad_qk))
        if self._pad_v:
            v = F.pad(v, (0, self._pad_v))
        call = _CALLS.get(self._kind, FlashAttnPrefill._call_fa2)
        out, lse = call(self, (q, k, v, *_offsets(batch)), batch, causal, return_lse)
        if self._pad_v:
            out = out[..., : self.dims.v_head_dim]
        if return_lse:
            if lse is None:
                raise RuntimeError(f"{self.impl} returned no LSE")
            return out, unpad_lse(lse, batch, self.num_heads)
        return out, None

    # One method per code path: each library orders and names the same arguments
    # differently; ``args`` is the positional ``(q, k, v, cu_q, cu_k, max_q, max_k)``.
    def _call_vllm(
        self, args: tuple[Any, ...], batch: RaggedBatch, causal: bool, return_lse: bool
    ) -> tuple[Tensor, Tensor | None]:
        # vLLM's signature orders max_seqlen_q before cu_seqlens_q: keywords only.
        q, k, v = args[:3]
        res = self._fn(
            q=q, k=k, v=v,
            max_seqlen_q=batch.max_seqlen_q, cu_seqlens_q=batch.cu_seqlens_q,
            max_seqlen_k=batch.max_seqlen_k, cu_seqlens_k=batch.cu_seqlens_k,
            softmax_scale=self.softmax_scale, causal=causal,
            return_softmax_lse=return_lse, fa_version=self._fa_version,
        )  # fmt: skip
        return res if return_lse else (res, None)

    def _call_torch_fa2(
        self, args: tuple[Any, ...], batch: RaggedBatch, causal: bool, return_lse: bool
    ) -> tuple[Tensor, Tensor | None]:
        # aten::_flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q,
        #   max_k, dropout_p, is_causal, return_debug_mask, *, scale=None, ...)
        # -> (output, softmax_logsumexp, rng_state, unused, debug_attn_mask)
        res = self._fn(*args, 0.0, causal, False, scale=self.softmax_scale)
        return res[0], res[1]

    def _call_fa3(
        self, args: tuple[Any, ...], batch: RaggedBatch, causal: bool, return_lse: bool
    ) -> tuple[Tensor, Tensor | None]:
        kwargs: dict[str, Any] = {"softmax_scale": self.softmax_scale, "causal": causal}
        if self._has_return_attn_probs:
            kwargs["return_attn_probs"] = True
        return _out_and_lse(self._fn(*args, **kwargs))

    def _call_fa2(
        self, args: tuple[Any, ...], batch: RaggedBatch, causal: bool, return_lse: bool
    ) -> tuple[Tensor, Tensor | None]:
        res = self._fn(
            *args,
            dropout_p=0.0,
            softmax_scale=self.softmax_scale,
            causal=causal,
            return_attn_probs=return_lse,
        )
        return _out_and_lse(res)

    def direct_calls(
        self, inputs: dict[str, Any], *, causal: bool, return_lse: bool
    ) -> dict[str, Any]:
        """The same library function called by hand (v padded where FA2 needs it)."""
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        cu_q, cu_k = inputs["cu_seqlens_q"], inputs["cu_seqlens_k"]
        max_q, max_k = inputs["max_seqlen_q"], inputs["max_seqlen_k"]
        fn, scale, pad_v = self._fn, self.softmax_scale, self._pad_v
        if self._pad_qk:
            return {}  # not needed for any dims we run; keep the direct call honest
        if self._kind == "vllm":
            kw = {
                "max_seqlen_q": max_q,
                "cu_seqlens_q": cu_q,
                "max_seqlen_k": max_k,
                "cu_seqlens_k": cu_k,
                "softmax_scale": scale,
                "causal": causal,
                "return_softmax_lse": return_lse,
                "fa_version": self._fa_version,
            }
            if pad_v:
                return {self.impl: lambda: fn(q=q, k=k, v=F.pad(v, (0, pad_v)), **kw)}
            return {self.impl: lambda: fn(q=q, k=k, v=v, **kw)}
        if self._kind == "torch-bundled-fa2":
            return {
                "aten._flash_attention_forward": lambda: fn(
                    q,
                    k,
                    F.pad(v, (0, pad_v)) if pad_v else v,
                    cu_q,
                    cu_k,
                    max_q,
                    max_k,
                    0.0,
                    causal,
                    False,
                    scale=scale,
                )
            }
        if self._kind == "flash-attn3":
            return {
                self.impl: lambda: fn(
                    q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=causal
                )
            }
        return {
            self.impl: lambda: fn(
                q,
                k,
                F.pad(v, (0, pad_v)) if pad_v else v,
                cu_q,
                cu_k,
                max_q,
                max_k,
                softmax_scale=scale,
                causal=causal,
                return_attn_probs=return_lse,
            )
        }


_CALLS = {
    "vllm": FlashAttnPrefill._call_vllm,
    "torch-bundled-fa2": FlashAttnPrefill._call_torch_fa2,
    "flash-attn3": FlashAttnPrefill._call_fa3,
}


def _offsets(batch: RaggedBatch) -> tuple[Any, ...]:
    """``(cu_q, cu_k, max_q, max_k)`` in the order flash-attn's varlen functions take them."""
    return (batch.cu_seqlens_q, batch.cu_seqlens_k, batch.max_seqlen_q, batch.max_seqlen_k)


def _out_and_lse(res: Any) -> tuple[Tensor, Tensor | None]:
    """flash-attn returns ``out`` alone or a tuple led by ``(out, lse)``."""
    return (res[0], res[1]) if isinstance(res, tuple) else (res, None)
