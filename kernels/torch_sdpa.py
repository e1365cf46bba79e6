"""TORCH_SDPA: plain PyTorch, fp32 math, one sequence at a time.

Why it exists: it runs on any machine (CPU included) with any MLA dims, so it is
the fallback the service hands out when nothing else is valid, and it is the
numerical reference every other backend is checked against. Readability and
exactness matter more than speed here: scores, softmax and the LSE are computed in
float32 with TF32 disabled, and long sequences are processed in blocks of heads and
query rows so that memory stays bounded (a 16k-token sequence at 128 heads would
need 137 GB of scores at once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from mla_switchboard.core.specs import Backend
from mla_switchboard.kernels.base import MLAPrefillKernel, RaggedBatch
from torch import Tensor

__all__ = ["TorchSdpaPrefill"]

# Bytes of fp32 scores materialised at once (per block of heads x query rows).
_SCORE_BUDGET_BYTES = {"cuda": 512 << 20, "cpu": 64 << 20}


@contextlib.contextmanager
def _highest_fp32_precision() -> Iterator[None]:
    """Force true fp32 matmuls (no TF32/bf16 shortcuts) while the reference runs."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


class TorchSdpaPrefill(MLAPrefillKernel):
    """Reference MLA prefill: fp32 masked softmax per sequence, natural-log LSE.

    Output is cast to the instance dtype; create it with ``dtype="float32"`` and
    float32 inputs to get an unrounded reference.
    """

    backend = Backend.TORCH_SDPA

    def _build(self, **options: Any) -> None:
        super()._build(**options)
        self.impl = "torch-fp32-reference"

    def _forward(
        self, q: Tensor, k: Tensor, v: Tensor, batch: RaggedBatch, *, causal: bool, return_lse: bool
    ) -> tuple[Tensor, Tensor | None]:
        h, dv = self.num_heads, self.dims.v_head_dim
        t_q = q.shape[0]
        out = torch.zeros((t_q, h, dv), dtype=self.dtype, device=q.device)
        lse = torch.empty((h, t_q), dtype=torch.float32, device=q.device) if return_lse else None
        budget = _SCORE_BUDGET_BYTES["cuda" if q.device.type == "cuda" else "cpu"]
        with torch.no_grad(), _highest_fp32_precision():
            for b in range(batch.batch_size):
                qs, qe = batch.host_cu_q[b], batch.host_cu_q[b + 1]
                ks, ke = batch.host_cu_k[b], batch.host_cu_k[b + 1]
                lq, lk = qe - qs, ke - ks
                if lq == 0:
                    continue
                qf = q[qs:qe].float().transpose(0, 1)  # [H, Lq, D]
                kf = k[ks:ke].float().transpose(0, 1)  # [H, Lk, D]
                vf = v[ks:ke].float().transpose(0, 1)  # [H, Lk, Dv]
                # Block over heads, then query rows, so one block of scores fits the budget.
                row_bytes = lk * 4
                heads_per_block = max(1, min(h, budget // max(1, row_bytes * lq)))
                rows_per_block = lq if heads_per_block > 1 else max(1, budget // row_bytes)
                offset = lk - lq  # bottom-right alignment
                for h0 in range(0, h, heads_per_block):
                    h1 = min(h, h0 + heads_per_block)
                    for r0 in range(0, lq, rows_per_block):
                        r1 = min(lq, r0 + rows_per_block)
                        s = torch.matmul(qf[h0:h1, r0:r1], kf[h0:h1].transpose(-1, -2))
                        s.mul_(self.softmax_scale)
                        if causal:
                            rows = torch.arange(r0, r1, device=q.device).unsqueeze(1)
                            cols = torch.arange(lk, device=q.device).unsqueeze(0)
                            s.masked_fill_(cols > rows + offset, float("-inf"))
                        m = torch.logsumexp(s, dim=-1)  # [h, rows]; -inf where fully masked
                        safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
                        p = torch.exp(s - safe.unsqueeze(-1))
                        o = torch.matmul(p, vf[h0:h1])  # [h, rows, Dv]
                        out[qs + r0 : qs + r1, h0:h1] = o.transpose(0, 1).to(self.dtype)
                        if lse is not None:
                            lse[h0:h1, qs + r0 : qs + r1] = m
        return out, lse
