"""FLASHINFER: ``flashinfer.BatchPrefillWithRaggedKVCacheWrapper`` with MLA head dims.

Why this path: FlashInfer's ragged prefill takes ``head_dim_qk=192`` and
``head_dim_vo=128`` directly (no padding) and, on Hopper, has an FA3-style kernel that
we measured at 600-700 TFLOP/s on an H200 for DeepSeek-R1 shapes, the fastest
prefill available there. We pick ``fa3`` on SM90 and ``fa2`` on SM80, and leave
``auto`` to FlashInfer on SM100. The wrapper's own ``cudnn`` path is not used: with
``return_lse`` it looked broken by reading, and cuDNN is reachable through our CUDNN
backend instead.

Planning (``plan()``) builds the work partition on the host and copies it to the
GPU; it is kept and reused as long as the batch's offsets and the causal flag are
the same (every layer of one forward pass), with one workspace for the instance.

LSE: FlashInfer's kernels produce base-2 ``[T, H]``; versions whose ``run`` takes
``lse_base``/``lse_layout`` convert in one fused kernel, older ones are converted
here (multiply by ln 2, transpose).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from mla_switchboard.core.specs import Backend
from mla_switchboard.kernels.base import BackendUnavailable, MLAPrefillKernel, RaggedBatch

__all__ = ["FlashInferPrefill"]

_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace
_PATHS = ("fa3", "fa2", "auto")


class FlashInferPrefill(MLAPrefillKernel):
    """FlashInfer ragged prefill.

    Option ``impl``: FlashInfer backend name to force (``fa3``, ``fa2`` or ``auto``);
    default ``fa3`` on compute capability 9.x, ``fa2`` on 8.x, ``auto`` otherwise.
    ``inst.impl`` reads ``flashinfer-<backend>``; ``inst.plans`` counts plan() calls.
    """

    backend = Backend.FLASHINFER

    def _build(self, *, impl: str | None = None, **options: Any) -> None:
        super()._build(**options)
        try:
            import flashinfer
        except Exception as exc:  # ImportError, or a broken install failing at import
            raise BackendUnavailable(
                self.backend, [f"flashinfer failed to import: {type(exc).__name__}: {exc}"]
            ) from exc
        cap = self.capability
        assert cap is not None  # the spec refused CPU already
        if impl is None:
            impl = "fa3" if cap.major == 9 else "fa2" if cap.major == 8 else "auto"
        if impl not in _PATHS:
            raise ValueError(f"impl must be one of {', '.join(_PATHS)}, got {impl!r}")
        if impl == "fa3" and cap.major != 9:
            raise BackendUnavailable(
                self.backend, [f"FlashInfer fa3 needs compute capability 9.x, got {cap}"]
            )
        self._fi_backend = impl
        self.impl = f"flashinfer-{impl}"
        self.version = str(getattr(flashinfer, "__version__", "unknown"))
        self._workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self._workspace, "NHD", backend=impl
        )
        try:
            params = inspect.signature(self._wrapper.run).parameters
        except (TypeError, ValueError):
            params = {}
        self._native_ln_hn = "lse_base" in params and "lse_layout" in params
        self._planned: tuple[tuple[int, ...], tuple[int, ...], bool] | None = None
        self.plans = 0

    def _plan(self, batch: RaggedBatch, causal: bool) -> None:
        key = (batch.host_cu_q, batch.host_cu_k, causal)
        if key == self._planned:
            return
        # Host indptrs: plan() needs them on the CPU anyway; passing them avoids a sync.
        qo_indptr = torch.tensor(batch.host_cu_q, dtype=torch.int32)
        kv_indptr = torch.tensor(batch.host_cu_k, dtype=torch.int32)
        self._wrapper.plan(
            qo_indptr,
            kv_indptr,
            self.num_heads,
            self.num_heads,
            self.dims.qk_head_dim,
            head_dim_vo=self.dims.v_head_dim,
            causal=causal,
            sm_scale=self.softmax_scale,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self._planned = key
        self.plans += 1

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
        self._plan(batch, causal)
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        if not return_lse:
            return self._wrapper.run(q, k, v), None
        if self._native_ln_hn:
            out, lse = self._wrapper.run(q, k, v, return_lse=True, lse_base="ln", lse_layout="HN")
            return out, lse
        out, lse = self._wrapper.run(q, k, v, return_lse=True)
        # [T, H] base 2 -> [H, T] natural log
        return out, (lse.float() * math.log(2.0)).t().contiguous()
