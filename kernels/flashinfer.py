"""FLASHINFER: ``flashinfer.BatchPrefillWithRaggedKVCacheWrapper`` with MLA head dims.

Why this path: FlashInfer's ragged prefill takes ``head_dim_qk=192`` and
``head_dim_vo=128`` directly (no padding) and, on Hopper, has an FA3-style kernel that
we measured at 600-770 TFLOP/s on an H200 for DeepSeek-R1 shapes. We pick ``fa3`` on
SM90 for the head dims FlashInfer instantiates FA3 for (``FLASHINFER_FA3_HEAD_DIMS``
in ``core/specs.py``) and ``fa2`` for the others, as FlashInfer's own ``auto`` does;
``fa2`` (JIT-built for the device) on 8.x, 11.x and 12.x. On SM100 (10.x) we use
``cutlass``, FlashInfer's CUTLASS ragged path, because that is what vLLM's and
SGLang's FlashInfer MLA prefill run there (vLLM 0.33.0,
``vllm/v1/attention/backends/mla/prefill/flashinfer.py``:
``BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="cutlass")``); it
takes only ``FLASHINFER_CUTLASS_HEAD_DIMS``, which the spec enforces. The cutlass, 11.x
and 12.x paths and FA2 for non-R1 dims on 9.x have NOT run on hardware here. The wrapper's own
``cudnn`` path is not used: cuDNN is reachable through our CUDNN backend instead.

Planning (``plan()``) builds the work partition on the host and copies it to the
GPU; it is kept and reused as long as the batch's offsets and the causal flag are
the same (every layer of one forward pass), with one workspace for the instance.
The per-call check is an identity test on the base class's cached batch object, so
a repeated call costs FlashInfer's own ``run()`` plus a few attribute reads.

LSE: FlashInfer's kernels produce base-2 ``[T, H]``; versions whose ``run`` takes
``lse_base``/``lse_layout`` convert in one fused kernel, older ones are converted
here (multiply by ln 2, transpose).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from mla_switchboard.core.specs import FLASHINFER_FA3_HEAD_DIMS, Backend, Capability, MLADims
from mla_switchboard.kernels.base import (
    BackendUnavailable,
    MLAPrefillKernel,
    RaggedBatch,
    lse_base2_to_contract,
)
from torch import Tensor

__all__ = ["FlashInferPrefill", "default_path"]

_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace
_PATHS = ("fa3", "fa2", "cutlass", "auto")


def default_path(cap: Capability, dims: MLADims) -> str:
    """The FlashInfer backend the engines run for this device and dims: CUTLASS on
    10.x; FA3 on 9.x where it is built for the head dims; FA2 everywhere else (what
    FlashInfer's ``auto`` picks off 9.x, and on 9.x for head dims FA3 lacks)."""
    if cap.major == 10:
        return "cutlass"
    if cap.major == 9 and (dims.qk_head_dim, dims.v_head_dim) in FLASHINFER_FA3_HEAD_DIMS:
        return "fa3"
    return "fa2"


class FlashInferPrefill(MLAPrefillKernel):
    """FlashInfer ragged prefill.

    Option ``impl``: FlashInfer backend name to force (``fa3``, ``fa2``, ``cutlass`` or
    ``auto``); default :func:`default_path`.
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
            impl = default_path(cap, self.dims)
        if impl not in _PATHS:
            raise ValueError(f"impl must be one of {', '.join(_PATHS)}, got {impl!r}")
        if impl == "fa3" and cap.major != 9:
            raise BackendUnavailable(
                self.backend, [f"FlashInfer fa3 needs compute capability 9.x, got {cap}"]
            )
        head_dims = (self.dims.qk_head_dim, self.dims.v_head_dim)
        if impl == "fa3" and head_dims not in FLASHINFER_FA3_HEAD_DIMS:
            raise BackendUnavailable(
                self.backend, [f"FlashInfer fa3 is not built for head dims (qk, v) {head_dims}"]
            )
        if impl == "cutlass" and cap.major != 10:
            raise BackendUnavailable(
                self.backend, [f"FlashInfer cutlass needs compute capability 10.x, got {cap}"]
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
        self._run = self._wrapper.run
        self._planned: tuple[tuple[int, ...], tuple[int, ...], bool] | None = None
        self._planned_batch: RaggedBatch | None = None
        self._planned_causal = False
        self.plans = 0

    def _plan_on(
        self, wrapper: Any, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, causal: bool
    ) -> None:
        """Plan ``wrapper`` for this kernel's heads, dims, scale and dtype (MHA: H == H_kv)."""
        wrapper.plan(
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

    def _plan(self, batch: RaggedBatch, causal: bool) -> None:
        self._planned_batch, self._planned_causal = batch, causal
        key = (batch.host_cu_q, batch.host_cu_k, causal)
        if key == self._planned:  # new offsets tensors, same values: keep the plan
            return
        # Host indptrs: plan() needs them on the CPU anyway; passing them avoids a sync.
        qo_indptr = torch.tensor(batch.host_cu_q, dtype=torch.int32)
        kv_indptr = torch.tensor(batch.host_cu_k, dtype=torch.int32)
        self._plan_on(self._wrapper, qo_indptr, kv_indptr, causal)
        self._planned = key
        self.plans += 1

    def _forward(
        self, q: Tensor, k: Tensor, v: Tensor, batch: RaggedBatch, *, causal: bool, return_lse: bool
    ) -> tuple[Tensor, Tensor | None]:
        if batch is not self._planned_batch or causal is not self._planned_causal:
            self._plan(batch, causal)
        if q.stride(-1) != 1:
            q = q.contiguous()
        if k.stride(-1) != 1:
            k = k.contiguous()
        if v.stride(-1) != 1:
            v = v.contiguous()
        if not return_lse:
            return self._run(q, k, v), None
        if self._native_ln_hn:
            out, lse = self._run(q, k, v, return_lse=True, lse_base="ln", lse_layout="HN")
            return out, lse
        out, lse = self._run(q, k, v, return_lse=True)
        # [T, H] base 2 -> [H, T] natural log
        return out, lse_base2_to_contract(lse)

    def direct_calls(
        self, inputs: dict[str, Any], *, causal: bool, return_lse: bool
    ) -> dict[str, Any]:
        """FlashInfer's own wrapper, planned once from host indptrs, ``run`` only."""
        import flashinfer

        workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            workspace, "NHD", backend=self._fi_backend
        )
        self._plan_on(w, inputs["cu_seqlens_q"].cpu(), inputs["cu_seqlens_k"].cpu(), causal)
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        name = f"flashinfer-{self._fi_backend}-run"
        if return_lse and self._native_ln_hn:  # the contract's LSE, made by FlashInfer
            return {
                name: lambda: (
                    workspace,
                    w.run(q, k, v, return_lse=True, lse_base="ln", lse_layout="HN"),
                )
            }
        if return_lse:
            return {name: lambda: (workspace, w.run(q, k, v, return_lse=True))}
        return {name: lambda: (workspace, w.run(q, k, v))}
