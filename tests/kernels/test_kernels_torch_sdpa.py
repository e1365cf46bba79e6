"""TORCH_SDPA against an independent naive implementation, plus the measure helpers on CPU.

The naive reference below shares no code with ``kernels/``: it walks every sequence
and every query row, keeps the keys the bottom-right causal mask allows, and
computes the softmax and its natural-log LSE in float64.
"""

from __future__ import annotations

import math

import mla_switchboard.kernels.torch_sdpa as torch_sdpa
import pytest
import torch
from mla_switchboard import kernels
from mla_switchboard.kernels.measure import (
    benchmark,
    causal_flops,
    default_tolerances,
    make_inputs,
    reference_check,
)


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: list[int],
    cu_k: list[int],
    scale: float,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-by-row masked softmax in float64; returns out [T, H, Dv] and lse [H, T]."""
    t_q, h, _ = q.shape
    out = torch.zeros(t_q, h, v.shape[-1], dtype=torch.float64)
    lse = torch.full((h, t_q), float("-inf"), dtype=torch.float64)
    q64, k64, v64 = q.double(), k.double(), v.double()
    for b in range(len(cu_q) - 1):
        lq, lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        for i in range(lq):
            visible = min(lk, i + (lk - lq) + 1) if causal else lk  # bottom-right diagonal
            keys = k64[cu_k[b] : cu_k[b] + visible]  # [n, H, D]
            vals = v64[cu_k[b] : cu_k[b] + visible]
            row = cu_q[b] + i
            for head in range(h):
                scores = (keys[:, head] @ q64[row, head]) * scale  # [n]
                m = scores.max()
                row_lse = m + torch.log(torch.exp(scores - m).sum())
                p = torch.exp(scores - row_lse)
                out[row, head] = p @ vals[:, head]
                lse[head, row] = row_lse
    return out, lse


DIMS = [(128, 64, 128), (16, 8, 24)]  # R1 dims, and odd dims TORCH_SDPA must accept too


@pytest.mark.parametrize("dims", DIMS, ids=["r1", "odd"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("chunk", [False, True], ids=["self", "context-chunk"])
def test_torch_sdpa_matches_the_naive_reference(
    dims: tuple[int, int, int], causal: bool, chunk: bool
) -> None:
    heads = 3
    lens_k = [1, 7, 16, 0, 5]
    lens_q = [max(1, n // 3) if n else 0 for n in lens_k] if chunk else lens_k
    scale = 1 / math.sqrt(dims[0] + dims[1])
    inputs = make_inputs(
        num_heads=heads,
        qk_head_dim=dims[0] + dims[1],
        v_head_dim=dims[2],
        seqlens_q=lens_q,
        seqlens_k=lens_k,
        dtype="fp32",
        device="cpu",
        seed=3,
    )
    inst = kernels.get("TORCH_SDPA").create(heads, *dims, scale, "fp32", "cpu")
    out, lse = inst.prefill(**inputs, causal=causal, return_lse=True)
    ref_out, ref_lse = naive_attention(
        inputs["q"],
        inputs["k"],
        inputs["v"],
        inputs["cu_seqlens_q"].tolist(),
        inputs["cu_seqlens_k"].tolist(),
        scale,
        causal,
    )
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_causal_mask_is_bottom_right_aligned() -> None:
    # One sequence, 2 new queries after 3 cached keys: the last query sees all 5 keys,
    # the first sees 4. With top-left alignment they would see 1 and 2.
    inputs = make_inputs(
        num_heads=1, qk_head_dim=8, v_head_dim=8, seqlens_q=[2], seqlens_k=[5],
        dtype="fp32", device="cpu",
    )  # fmt: skip
    inst = kernels.get("TORCH_SDPA").create(1, 4, 4, 8, 0.5, "fp32", "cpu")
    out, lse = inst.prefill(**inputs, causal=True, return_lse=True)
    full_out = inst.prefill(**inputs, causal=False)
    torch.testing.assert_close(out[1], full_out[1])  # the last query sees everything
    assert not torch.allclose(out[0], full_out[0])
    k, q = inputs["k"][:4, 0], inputs["q"][0, 0]
    torch.testing.assert_close(lse[0, 0], torch.logsumexp((k @ q) * 0.5, dim=0))


def test_blocking_over_heads_and_rows_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = make_inputs(
        num_heads=4, qk_head_dim=24, v_head_dim=8, seqlens_q=[33, 9], seqlens_k=[40, 9],
        dtype="fp32", device="cpu",
    )  # fmt: skip
    inst = kernels.get("TORCH_SDPA").create(4, 16, 8, 8, 0.2, "fp32", "cpu")
    whole = inst.prefill(**inputs, return_lse=True)
    # 256 bytes of scores per block: forces one head and a few rows at a time.
    monkeypatch.setitem(torch_sdpa._SCORE_BUDGET_BYTES, "cpu", 256)
    blocked = inst.prefill(**inputs, return_lse=True)
    torch.testing.assert_close(whole[0], blocked[0])
    torch.testing.assert_close(whole[1], blocked[1])


def test_lse_merges_context_chunks_like_vllm() -> None:
    # Attention over [prefix | new] equals the LSE-weighted merge of attention over the
    # prefix (non-causal) and over the new tokens (causal): the use the LSE exists for.
    heads, prefix, new = 2, 11, 5
    inputs = make_inputs(
        num_heads=heads, qk_head_dim=12, v_head_dim=6, seqlens_q=[new], seqlens_k=[prefix + new],
        dtype="fp32", device="cpu", seed=1,
    )  # fmt: skip
    inst = kernels.get("TORCH_SDPA").create(heads, 8, 4, 6, 0.3, "fp32", "cpu")
    full, full_lse = inst.prefill(**inputs, causal=True, return_lse=True)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    i32 = torch.int32
    a, lse_a = inst.prefill(
        q, k[:prefix], v[:prefix], torch.tensor([0, new], dtype=i32),
        torch.tensor([0, prefix], dtype=i32), new, prefix, causal=False, return_lse=True,
    )  # fmt: skip
    b, lse_b = inst.prefill(
        q, k[prefix:], v[prefix:], torch.tensor([0, new], dtype=i32),
        torch.tensor([0, new], dtype=i32), new, new, causal=True, return_lse=True,
    )  # fmt: skip
    lse = torch.logaddexp(lse_a, lse_b)  # [H, T]
    wa = torch.exp(lse_a - lse).t().unsqueeze(-1)
    wb = torch.exp(lse_b - lse).t().unsqueeze(-1)
    torch.testing.assert_close(wa * a + wb * b, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, full_lse)


def test_bf16_instance_rounds_only_the_output() -> None:
    inst = kernels.get("TORCH_SDPA").create(2, 128, 64, 128, 192**-0.5, "bf16", "cpu")
    res = reference_check(inst, seqlens=[1, 37, 64], dtype="bf16", device="cpu")
    assert res.ok, res
    assert res.max_abs_err_lse == 0.0  # same fp32 math on the same inputs
    assert 0 < res.max_abs_err_out <= default_tolerances("bf16").atol_out
    chunk = reference_check(
        inst, seqlens=[8, 40], dtype="bf16", device="cpu", q_shorter_than_kv=True, causal=True
    )
    assert chunk.ok and chunk.seqlens_q == (2, 10), chunk


def test_reference_check_reports_a_wrong_kernel() -> None:
    class Wrong(torch_sdpa.TorchSdpaPrefill):
        def _forward(self, q, k, v, batch, *, causal, return_lse):  # type: ignore[override]
            out, lse = super()._forward(q, k, v, batch, causal=causal, return_lse=return_lse)
            return out, lse / math.log(2.0)  # a base-2 LSE slipping through

    inst = Wrong.create(2, 16, 8, 16, 0.25, "fp16", "cpu")
    res = reference_check(inst, seqlens=[9, 3], dtype="fp16", device="cpu")
    assert not res.ok and res.error == "out of tolerance: lse"
    assert res.max_abs_err_lse > 0.5


def test_causal_flops_convention() -> None:
    # Causal self-attention: S^2 * H * (d_qk + d_v); non-causal twice that.
    assert causal_flops([4096], num_heads=128, qk_head_dim=192, v_head_dim=128) == (
        4096**2 * 128 * 320
    )
    assert (
        causal_flops([100, 50], num_heads=16, qk_head_dim=192, v_head_dim=128, causal=False)
        == 2 * (100**2 + 50**2) * 16 * 320
    )
    # Context chunk: 10 queries over 40 keys keep 40*10 - 10^2/2 pairs.
    assert causal_flops([10], [40], num_heads=1, qk_head_dim=1, v_head_dim=1) == 2 * 350 * 2


def test_benchmark_runs_on_cpu() -> None:
    inst = kernels.get("TORCH_SDPA").create(2, 128, 64, 128, 192**-0.5, "bf16", "cpu")
    res = benchmark(
        inst, seqlens=[32, 16], num_heads=2, dtype="bf16", device="cpu", warmup=1, iters=3
    )
    assert res.backend == "TORCH_SDPA" and res.impl == "torch-fp32-reference"
    assert res.median_ms > 0 and res.tflops > 0 and res.iters == 3
    assert set(res.to_json()) >= {"backend", "impl", "shape", "median_ms", "tflops"}
    with pytest.raises(ValueError, match="num_heads 3 does not match"):
        benchmark(inst, seqlens=[4], num_heads=3, dtype="bf16", device="cpu")
