"""TOKENSPEED_MLA: TokenSpeed's CuTe DSL MLA prefill kernel (Blackwell only).

Why: vLLM (checked in 0.33.0) offers ``TOKENSPEED_MLA`` as an MLA
prefill backend on compute capability 10.x for DeepSeek-R1 dims, from the package
``tokenspeed_mla`` (PyPI ``tokenspeed-mla``). A backend the engine can run must be
one we can measure, so it sits behind the same contract as the others.

NOT RUN ON HARDWARE HERE: no Blackwell GPU is available to this project. On any
other machine ``create`` raises :class:`~kernels.base.BackendUnavailable` with the
spec's reasons (no CUDA device, ``compute capability 9.0 not supported (needs
10.x)``, ``required package tokenspeed_mla not installed``), or the package's own
import failure. The call follows vLLM 0.33.0's use of it
(``vllm/v1/attention/backends/mla/prefill/tokenspeed_mla.py``) and
``tokenspeed_mla.tokenspeed_mla_prefill`` as published in tokenspeed-mla 2.0.4:

* ``query [T_q, H, 192]``, ``key [T_k, H, 192]``, ``value [T_k, H, 128]``
  (``value`` made contiguous: vLLM notes the kernel misreads a strided view),
  ``cum_seq_lens`` / ``max_seq_len`` for the keys and ``cum_seq_lens_q`` /
  ``max_seq_len_q`` for the queries, ``seq_lens`` (read by nobody, passed for
  parity, computed once per batch), ``batch_size``, ``softmax_scale``.
* ``is_causal`` uses the kernel's ``WINDOW_MASK_INFERENCE`` mask, whose diagonal is
  offset by ``seqlen_k - seqlen_q``: bottom-right, our contract.
* The output is always bf16 (the package allocates bf16 and rejects another ``out``
  dtype); an fp16 instance converts it. The LSE comes back ``[T_q, H]`` in natural
  log (vLLM only transposes it before ``merge_attn_states``); we transpose it to
  ``[H, T_q]``. Confirm both with ``kernels.measure.reference_check`` on the first
  SM100 run.
"""

from __future__ import annotations

from typing import Any

from mla_switchboard.core.specs import Backend
from mla_switchboard.kernels.base import BackendUnavailable, MLAPrefillKernel, RaggedBatch
from torch import Tensor

__all__ = ["TokenspeedMlaPrefill"]


class TokenspeedMlaPrefill(MLAPrefillKernel):
    """``tokenspeed_mla.tokenspeed_mla_prefill`` behind the common contract (SM100 only).

    Option ``warmup`` (default True): JIT-compile the prefill kernel for this dtype
    at ``create`` (``warmup_compile_prefill``), as vLLM does at start-up.
    """

    backend = Backend.TOKENSPEED_MLA

    def _build(self, *, warmup: bool = True, **options: Any) -> None:
        super()._build(**options)
        try:
            import tokenspeed_mla
            from tokenspeed_mla import tokenspeed_mla_prefill
        except Exception as exc:  # ImportError, or a broken install failing at import
            raise BackendUnavailable(
                self.backend, [f"tokenspeed_mla failed to import: {type(exc).__name__}: {exc}"]
            ) from exc
        self._fn = tokenspeed_mla_prefill
        self.version = str(getattr(tokenspeed_mla, "__version__", "unknown"))
        if warmup:
            try:
                tokenspeed_mla.warmup_compile_prefill(
                    q_dtype=self.dtype,
                    d_qk=self.dims.qk_head_dim,
                    d_v=self.dims.v_head_dim,
                    enable_pdl=False,
                )
            except Exception as exc:  # the package's stub raises ImportError without CuTe DSL
                raise BackendUnavailable(
                    self.backend,
                    [f"tokenspeed_mla could not compile its prefill kernel: {exc}"],
                ) from exc
        self.impl = "tokenspeed-mla-prefill"

    def _forward(
        self, q: Tensor, k: Tensor, v: Tensor, batch: RaggedBatch, *, causal: bool, return_lse: bool
    ) -> tuple[Tensor, Tensor | None]:
        res = self._fn(
            query=q if q.is_contiguous() else q.contiguous(),
            key=k if k.is_contiguous() else k.contiguous(),
            value=v if v.is_contiguous() else v.contiguous(),
            seq_lens=batch.kv_lengths(),  # unused by the kernel, required by the signature
            cum_seq_lens=batch.cu_seqlens_k,
            max_seq_len=batch.max_seqlen_k,
            batch_size=batch.batch_size,
            softmax_scale=self.softmax_scale,
            is_causal=causal,
            return_lse=return_lse,
            cum_seq_lens_q=batch.cu_seqlens_q,
            max_seq_len_q=batch.max_seqlen_q,
            enable_pdl=False,
        )
        out, lse = res if return_lse else (res, None)
        if out.dtype is not self.dtype:
            out = out.to(self.dtype)
        if lse is None:
            return out, None
        return out, lse.t().contiguous()
