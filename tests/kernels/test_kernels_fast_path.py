"""CPU tests of the engine code paths and the per-call cost.

What runs here without a GPU: the base class's repeated-call fast path (no re-check,
no host copy, the same batch object, every input error still caught), the
FLASH_ATTN path order with a stand-in ``vllm.vllm_flash_attn``, and the
TOKENSPEED_MLA call as vLLM makes it, with a stand-in ``tokenspeed_mla``. The real
kernels run in tests/gpu.
"""

from __future__ import annotations

import math
import sys
import types
from typing import Any

import mla_switchboard.kernels.base as base
import pytest
import torch
from mla_switchboard import kernels
from mla_switchboard.kernels import Capability, MLADims
from mla_switchboard.kernels.flash_attn import FlashAttnPrefill, fa3_head_dims, vllm_fa_version
from mla_switchboard.kernels.measure import host_us_per_call, make_inputs
from mla_switchboard.kernels.tokenspeed_mla import TokenspeedMlaPrefill

H = 4
R1 = (128, 64, 128)
SCALE = 1 / math.sqrt(192)


def sdpa(heads: int = H) -> Any:
    return kernels.get("TORCH_SDPA").create(heads, *R1, SCALE, "bf16", "cpu")


def inputs_for(lens: list[int], heads: int = H, dims: tuple[int, int, int] = R1) -> dict[str, Any]:
    return make_inputs(
        num_heads=heads, qk_head_dim=dims[0] + dims[1], v_head_dim=dims[2], seqlens_q=lens,
        dtype="bf16", device="cpu",
    )  # fmt: skip


# ------------------------------------------------------------------ fast path
def test_repeated_calls_skip_the_checks_and_reuse_the_batch_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inst = sdpa()
    x = inputs_for([3, 5])
    seen: list[Any] = []
    real_forward = inst._forward

    def spy(q: Any, k: Any, v: Any, batch: Any, **kw: Any) -> Any:
        seen.append(batch)
        return real_forward(q, k, v, batch, **kw)

    monkeypatch.setattr(inst, "_forward", spy)
    inst.prefill(**x)
    checks = []
    monkeypatch.setattr(inst, "check_inputs", lambda *a, **k: checks.append(1))
    for _ in range(3):  # new q/k/v each layer, the same offsets tensors
        inst.prefill(**dict(x, q=x["q"].clone(), k=x["k"].clone(), v=x["v"].clone()))
    assert checks == []
    assert all(b is seen[0] for b in seen)
    assert seen[0].lens_q == (3, 5) and seen[0].equal_lengths is False


def test_the_fast_path_still_refuses_every_changed_input() -> None:
    inst = sdpa()
    x = inputs_for([3, 5])
    inst.prefill(**x)
    with pytest.raises(ValueError, match="q must have shape"):
        inst.prefill(**dict(x, q=x["q"][:, :, :100]))
    with pytest.raises(ValueError, match="q has dtype"):
        inst.prefill(**dict(x, q=x["q"].half()))
    with pytest.raises(ValueError, match="max_seqlen_q = 4"):
        inst.prefill(**dict(x, max_seqlen_q=4))
    with pytest.raises(ValueError, match="max_seqlen_q must be a non-negative int"):
        inst.prefill(**dict(x, max_seqlen_q=5.0))
    with pytest.raises(ValueError, match="causal must be a bool"):
        inst.prefill(**x, causal=1)
    with pytest.raises(ValueError, match="return_lse must be a bool"):
        inst.prefill(**x, return_lse=1)
    with pytest.raises(ValueError, match=r"q must be a torch\.Tensor"):
        inst.prefill(**dict(x, q=[1, 2]))
    x["cu_seqlens_q"][1] = 9  # in place: the version counter moves, the check runs
    with pytest.raises(ValueError, match="non-decreasing"):
        inst.prefill(**x)


def test_repeated_call_host_cost_is_small_on_cpu() -> None:
    """The fast path's own cost, measured where the kernel is cheap: a few us."""
    inst = sdpa(heads=1)
    x = make_inputs(
        num_heads=1, qk_head_dim=192, v_head_dim=128, seqlens_q=[1], dtype="bf16",
        device="cpu",
    )  # fmt: skip
    inst.prefill(**x)
    forward = inst._forward
    inst._forward = lambda *a, **k: (x["q"], None)  # time the wrapper, not the kernel
    try:
        us = host_us_per_call(lambda: inst.prefill(**x), "cpu", iters=200)
    finally:
        inst._forward = forward
    assert us < 15.0, us


def test_qk_rope_head_dim_zero_is_accepted() -> None:
    inst = kernels.get("TORCH_SDPA").create(2, 256, 0, 256, 1 / 16, "bf16", "cpu")
    x = make_inputs(
        num_heads=2, qk_head_dim=256, v_head_dim=256, seqlens_q=[4, 2], dtype="bf16",
        device="cpu",
    )  # fmt: skip
    out, lse = inst.prefill(**x, return_lse=True)
    assert out.shape == (6, 2, 256) and lse.shape == (2, 6)
    with pytest.raises(ValueError, match="qk_rope_head_dim must be a non-negative int"):
        kernels.get("TORCH_SDPA").create(2, 256, -1, 256, 1 / 16, "bf16", "cpu")
    with pytest.raises(ValueError, match="qk_nope_head_dim must be a positive int"):
        kernels.get("TORCH_SDPA").create(2, 0, 64, 128, 1 / 16, "bf16", "cpu")


# ------------------------------------------------------------- FLASH_ATTN paths
def test_vllm_picks_fa3_on_hopper_fa4_on_blackwell_fa2_elsewhere() -> None:
    every = lambda v: True  # noqa: E731
    assert vllm_fa_version(9, every) == 3
    assert vllm_fa_version(10, every) == 4
    assert vllm_fa_version(8, every) == 2
    assert vllm_fa_version(12, every) == 2
    assert vllm_fa_version(10, lambda v: v != 4) == 2


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]) -> None:
    vllm = types.ModuleType("vllm")
    vllm.__path__ = []  # a package
    fa = types.ModuleType("vllm.vllm_flash_attn")

    def flash_attn_varlen_func(**kw: Any) -> Any:
        calls.append(kw)
        t_q, h = kw["q"].shape[0], kw["q"].shape[1]
        out = torch.zeros((t_q, h, kw["v"].shape[-1]), dtype=kw["q"].dtype)
        lse = torch.zeros((h, t_q), dtype=torch.float32)
        return (out, lse) if kw["return_softmax_lse"] else out

    fa.flash_attn_varlen_func = flash_attn_varlen_func  # type: ignore[attr-defined]
    fa.is_fa_version_supported = lambda v: v in (2, 3)  # type: ignore[attr-defined]
    fa.fa_version_unsupported_reason = lambda v: "not built"  # type: ignore[attr-defined]
    vllm.vllm_flash_attn = fa  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.vllm_flash_attn", fa)
    monkeypatch.setattr(base.importlib.util, "find_spec", lambda name: object())


def _flash_attn(
    cap: Capability, dims: tuple[int, int, int] = R1, **options: Any
) -> FlashAttnPrefill:
    inst = FlashAttnPrefill(
        num_heads=H, dims=MLADims(*dims), softmax_scale=SCALE, dtype=torch.bfloat16,
        device=torch.device("cpu"), capability=cap,
    )  # fmt: skip
    inst._build(**options)
    return inst


@pytest.mark.parametrize(
    ("cap", "impl", "v_dim"),
    [(Capability(9, 0), "vllm-fa3", 128), (Capability(8, 0), "vllm-fa2", 192)],
    ids=["hopper", "ampere"],
)
def test_flash_attn_tries_vllms_flash_attention_first(
    monkeypatch: pytest.MonkeyPatch, cap: Capability, impl: str, v_dim: int
) -> None:
    calls: list[dict[str, Any]] = []
    _fake_vllm(monkeypatch, calls)
    inst = _flash_attn(cap)
    assert inst.impl == impl
    x = inputs_for([3, 5])
    out, lse = inst.prefill(**x, return_lse=True)
    kw = calls[-1]
    assert kw["fa_version"] == int(impl[-1])
    assert kw["v"].shape[-1] == v_dim  # FA3 on 9.x native, FA2 padded as vLLM does
    assert kw["cu_seqlens_q"] is x["cu_seqlens_q"] and kw["max_seqlen_q"] == 5
    assert kw["causal"] is True and kw["softmax_scale"] == SCALE
    assert out.shape == (8, H, 128) and lse.shape == (H, 8)
    direct = inst.direct_calls(x, causal=True, return_lse=False)
    assert list(direct) == [impl]
    direct[impl]()
    assert calls[-1]["return_softmax_lse"] is False


@pytest.mark.parametrize(
    ("model", "called"),
    [
        ((192, 128), (192, 128)),  # DeepSeek-R1: a pair FA3 takes
        ((192, 64), (192, 128)),  # v outside (96, 128]: padded into it
        ((256, 256), (256, 256)),
        ((128, 128), (128, 128)),
        ((96, 64), (96, 96)),  # MiniCPM3-like: neither range, equal dims
        ((192, 256), (256, 256)),
        ((64, 512), (64, 512)),  # qk <= 64 takes v up to 512
        ((60, 60), (64, 64)),  # multiples of 8
    ],
)
def test_fa3_is_called_with_head_dims_it_takes(
    model: tuple[int, int], called: tuple[int, int]
) -> None:
    assert fa3_head_dims(*model) == called


def test_fa3_refuses_head_dims_past_256() -> None:
    with pytest.raises(ValueError, match="up to 256"):
        fa3_head_dims(264, 128)


def test_flash_attn_pads_v_for_fa3_and_slices_the_output_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(128, 64, 64): FA3 refuses q/k 192 with v 64 ("V headdim in (96, 128]"), so v
    goes in padded to 128 and the output comes back with its own 64 columns."""
    calls: list[dict[str, Any]] = []
    _fake_vllm(monkeypatch, calls)
    inst = _flash_attn(Capability(9, 0), dims=(128, 64, 64))
    x = inputs_for([3, 5], dims=(128, 64, 64))
    out, lse = inst.prefill(**x, return_lse=True)
    assert calls[-1]["q"].shape[-1] == 192 and calls[-1]["v"].shape[-1] == 128
    assert out.shape == (8, H, 64) and lse.shape == (H, 8)


def test_flash_attn_without_vllm_says_why_it_moved_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base.importlib.util, "find_spec", lambda name: None)
    inst = _flash_attn(Capability(9, 0))
    assert inst.impl == "torch-bundled-fa2"
    assert inst.tried[0] == "vllm: vLLM not installed"
    assert inst.tried[1].startswith("flash-attn3: ")


# ----------------------------------------------------------------- TOKENSPEED
def test_tokenspeed_is_called_as_vllm_calls_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    mod = types.ModuleType("tokenspeed_mla")

    def tokenspeed_mla_prefill(**kw: Any) -> Any:
        calls.append(kw)
        t_q, h = kw["query"].shape[0], kw["query"].shape[1]
        out = torch.zeros((t_q, h, kw["value"].shape[-1]), dtype=torch.bfloat16)
        lse = torch.arange(t_q * h, dtype=torch.float32).reshape(t_q, h)
        return (out, lse) if kw["return_lse"] else out

    mod.tokenspeed_mla_prefill = tokenspeed_mla_prefill  # type: ignore[attr-defined]
    mod.warmup_compile_prefill = lambda **kw: calls.append({"warmup": kw})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tokenspeed_mla", mod)
    inst = TokenspeedMlaPrefill(
        num_heads=H, dims=MLADims(*R1), softmax_scale=SCALE, dtype=torch.float16,
        device=torch.device("cpu"), capability=Capability(10, 0),
    )  # fmt: skip
    inst._build()
    assert calls[0] == {
        "warmup": {"q_dtype": torch.float16, "d_qk": 192, "d_v": 128, "enable_pdl": False}
    }
    x = make_inputs(
        num_heads=H, qk_head_dim=192, v_head_dim=128, seqlens_q=[1, 2], seqlens_k=[3, 5],
        dtype="fp16", device="cpu",
    )  # fmt: skip
    out, lse = inst.prefill(**x, causal=True, return_lse=True)
    kw = calls[-1]
    assert kw["cum_seq_lens"] is x["cu_seqlens_k"] and kw["cum_seq_lens_q"] is x["cu_seqlens_q"]
    assert (kw["max_seq_len"], kw["max_seq_len_q"], kw["batch_size"]) == (5, 2, 2)
    assert kw["seq_lens"].tolist() == [3, 5] and kw["is_causal"] is True
    assert kw["softmax_scale"] == SCALE and kw["enable_pdl"] is False
    assert out.dtype == torch.float16  # the package writes bf16; fp16 instances convert
    assert lse.shape == (H, 3) and lse.is_contiguous()
    assert lse[1, 2].item() == 2 * H + 1  # [T, H] -> [H, T]


def test_tokenspeed_refuses_hopper_with_the_spec_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "device_capability", lambda device: Capability(9, 0))
    with pytest.raises(base.BackendUnavailable) as info:
        kernels.get("TOKENSPEED_MLA").create(H, *R1, SCALE, "bf16", "cpu")
    assert "compute capability 9.0 not supported (needs 10.x)" in info.value.reasons
