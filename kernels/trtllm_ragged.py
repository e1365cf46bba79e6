"""TRTLLM_RAGGED: FlashInfer's TensorRT-LLM ragged DeepSeek prefill kernel (Blackwell).

Why: on SM100 this is the kernel vLLM picks first for MLA prefill. It exists only
as cubins for Blackwell, so the spec refuses every other compute capability with
the spec's reason, and ``create`` raises :class:`~kernels.base.BackendUnavailable`
with that text.

NOT RUN ON HARDWARE HERE: no Blackwell GPU is available to this project. The call
below follows ``flashinfer.prefill.trtllm_ragged_attention_deepseek`` as documented
in flashinfer-python 0.7.2.post1 (and as vLLM calls it): ``seq_lens`` are the kv
lengths, ``bmm1_scale`` is the softmax scale, ``bmm2_scale`` and ``o_sf_scale`` 1.0,
the LSE comes back ``[T, H]``. We treat that LSE as base 2 (the trtllm-gen kernels
run their softmax in exp2 and FlashInfer documents base-2 LSE for its attention
kernels) and convert it to natural log ``[H, T]``; confirm both on the first
Blackwell run with ``kernels.measure.reference_check``.
"""

from __future__ import annotations

from typing import Any

import torch
from mla_switchboard.core.specs import Backend
from mla_switchboard.kernels.base import (
    BackendUnavailable,
    MLAPrefillKernel,
    RaggedBatch,
    lse_base2_to_contract,
)
from torch import Tensor

__all__ = ["TrtllmRaggedPrefill"]

_WORKSPACE_BYTES = 128 << 20


class TrtllmRaggedPrefill(MLAPrefillKernel):
    """``trtllm_ragged_attention_deepseek`` behind the common contract (SM100 only)."""

    backend = Backend.TRTLLM_RAGGED

    def _build(self, **options: Any) -> None:
        super()._build(**options)
        try:
            from flashinfer.prefill import trtllm_ragged_attention_deepseek
        except Exception as exc:
            raise BackendUnavailable(
                self.backend,
                [f"flashinfer.prefill.trtllm_ragged_attention_deepseek unavailable: {exc}"],
            ) from exc
        self._fn = trtllm_ragged_attention_deepseek
        # trtllm-gen kernels keep counters in the workspace and expect it zeroed.
        self._workspace = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.impl = "flashinfer-trtllm-ragged-deepseek"

    def _forward(
        self, q: Tensor, k: Tensor, v: Tensor, batch: RaggedBatch, *, causal: bool, return_lse: bool
    ) -> tuple[Tensor, Tensor | None]:
        out = torch.empty(
            (q.shape[0], self.num_heads, self.dims.v_head_dim), dtype=self.dtype, device=q.device
        )
        res = self._fn(
            query=q if q.is_contiguous() else q.contiguous(),
            key=k if k.is_contiguous() else k.contiguous(),
            value=v if v.is_contiguous() else v.contiguous(),
            workspace_buffer=self._workspace,
            seq_lens=batch.kv_lengths(),
            max_q_len=batch.max_seqlen_q,
            max_kv_len=batch.max_seqlen_k,
            bmm1_scale=self.softmax_scale,
            bmm2_scale=1.0,
            o_sf_scale=1.0,
            batch_size=batch.batch_size,
            window_left=-1,
            cum_seq_lens_q=batch.cu_seqlens_q,
            cum_seq_lens_kv=batch.cu_seqlens_k,
            enable_pdl=False,
            is_causal=causal,
            return_lse=return_lse,
            out=out,
        )
        if not return_lse:
            return (res[0] if isinstance(res, tuple) else res), None
        out, lse = res
        return out, lse_base2_to_contract(lse)
