"""FLASH_ATTN: FlashAttention varlen, through the best of three code paths.

Why three paths: FA3 (``flash_attn_interface``) is the fast Hopper kernel and takes
MLA's 192/128 head dims natively; FA2 (``flash_attn``) runs on Ampere and newer but
wants one head dim for q, k and v; and PyTorch ships FA2's varlen kernel itself
(``torch.ops.aten._flash_attention_forward``), so a pod with nothing but torch still
gets a FlashAttention kernel. PyPI ships ``flash_attn`` only as source that takes far
too long to build on our GPU machine, so the torch-bundled path is the one proven on
the H200 here; the package paths follow their documented APIs (see README).

FA2 paths pad every head dim to one common multiple of 8 (zeros added to q and k do
not change q.k; zeros added to v only add output columns, which are sliced off).
All paths return the varlen LSE as ``[H, T_q]`` natural log, FlashAttention's
native layout; a padded ``[B, H, max_q]`` layout from an older build is unpacked.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from mla_switchboard.core.specs import Backend
from mla_switchboard.kernels.base import BackendUnavailable, MLAPrefillKernel, RaggedBatch

__all__ = ["FlashAttnPrefill"]

IMPLS = ("flash-attn3", "flash-attn2", "torch-bundled-fa2")


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def unpad_lse(lse: torch.Tensor, batch: RaggedBatch, num_heads: int) -> torch.Tensor:
    """Bring a FlashAttention LSE to ``[H, T_q]`` float32, whatever layout it came in.

    FlashAttention >= 2.4 (and FA3) return varlen LSE as ``[H, T_q]``; older FA2
    builds returned ``[B, H, max_seqlen_q]`` padded per sequence.
    """
    t_q = batch.host_cu_q[-1]
    if lse.dim() == 2 and tuple(lse.shape) == (num_heads, t_q):
        return lse.float().contiguous()
    if lse.dim() == 3 and lse.shape[0] == batch.batch_size and lse.shape[1] == num_heads:
        parts = [
            lse[b, :, : batch.host_cu_q[b + 1] - batch.host_cu_q[b]]
            for b in range(batch.batch_size)
        ]
        return torch.cat(parts, dim=1).float().contiguous()
    raise RuntimeError(
        f"unexpected FlashAttention LSE shape {tuple(lse.shape)} "
        f"(expected [{num_heads}, {t_q}] or [B, {num_heads}, max_seqlen_q])"
    )


class FlashAttnPrefill(MLAPrefillKernel):
    """FlashAttention varlen prefill.

    Option ``impl``: force one of ``flash-attn3``, ``flash-attn2`` or
    ``torch-bundled-fa2`` (default: the first that imports and suits the GPU; FA3
    only on compute capability 9.x).
    """

    backend = Backend.FLASH_ATTN

    def _build(self, *, impl: str | None = None, **options: Any) -> None:
        super()._build(**options)
        if impl is not None and impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
        tried: list[str] = []
        order = [impl] if impl is not None else list(IMPLS)
        for candidate in order:
            reason = self._try_path(candidate)
            if reason is None:
                self.impl = candidate
                return
            tried.append(f"{candidate}: {reason}")
        raise BackendUnavailable(self.backend, tried)

    def _try_path(self, path: str) -> str | None:
        """Set up ``path``; return None on success or why it cannot be used."""
        if path == "flash-attn3":
            if self.capability is None or self.capability.major != 9:
                return f"FA3 needs compute capability 9.x, got {self.capability}"
            try:
                mod = importlib.import_module("flash_attn_interface")
            except ImportError as exc:
                return f"flash_attn_interface not importable ({exc})"
            self._fn = mod.flash_attn_varlen_func
        elif path == "flash-attn2":
            try:
                mod = importlib.import_module("flash_attn")
            except ImportError as exc:
                return f"flash_attn not importable ({exc})"
            self._fn = mod.flash_attn_varlen_func
        else:
            op = getattr(torch.ops.aten, "_flash_attention_forward", None)
            if op is None:
                return "torch.ops.aten._flash_attention_forward missing from this torch"
            self._fn = op
        try:
            params = inspect.signature(self._fn).parameters
        except (TypeError, ValueError):
            params = {}
        self._has_return_attn_probs = "return_attn_probs" in params
        # FA2 wants one head dim for q, k and v, a multiple of 8.
        self._padded_dim = _round_up(max(self.dims.qk_head_dim, self.dims.v_head_dim), 8)
        return None

    def _pad(self, t: torch.Tensor) -> torch.Tensor:
        extra = self._padded_dim - t.shape[-1]
        return F.pad(t, (0, extra)) if extra else t

    def _forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: RaggedBatch,
        *,
        causal: bool,
        return_lse: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        dv = self.dims.v_head_dim
        cu_q, cu_k = batch.cu_seqlens_q, batch.cu_seqlens_k
        max_q, max_k = batch.max_seqlen_q, batch.max_seqlen_k
        if self.impl == "flash-attn3":
            kwargs: dict[str, Any] = {"softmax_scale": self.softmax_scale, "causal": causal}
            if self._has_return_attn_probs:
                kwargs["return_attn_probs"] = True
            res = self._fn(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)
            out, lse = (res[0], res[1]) if isinstance(res, tuple) else (res, None)
        elif self.impl == "flash-attn2":
            res = self._fn(
                self._pad(q),
                self._pad(k),
                self._pad(v),
                cu_q,
                cu_k,
                max_q,
                max_k,
                dropout_p=0.0,
                softmax_scale=self.softmax_scale,
                causal=causal,
                return_attn_probs=return_lse,
            )
            out, lse = (res[0], res[1]) if isinstance(res, tuple) else (res, None)
            out = out[..., :dv]
        else:
            # aten::_flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q,
            #   max_k, dropout_p, is_causal, return_debug_mask, *, scale=None, ...)
            # -> (output, softmax_logsumexp, rng_state, unused, debug_attn_mask)
            res = self._fn(
                self._pad(q),
                self._pad(k),
                self._pad(v),
                cu_q,
                cu_k,
                max_q,
                max_k,
                0.0,
                causal,
                False,
                scale=self.softmax_scale,
            )
            out, lse = res[0][..., :dv], res[1]
        if return_lse:
            if lse is None:
                raise RuntimeError(f"{self.impl} returned no LSE")
            return out, unpad_lse(lse, batch, self.num_heads)
        return out, None
