"""The calling contract on CPU: creation, refusals with the spec's reasons, input errors."""

from __future__ import annotations

import math

import mla_switchboard.kernels.base as base
import pytest
import torch
from mla_switchboard import kernels
from mla_switchboard.kernels import SPECS, Backend, Capability, Dtype, MLADims, SelectionContext
from mla_switchboard.kernels.base import BackendUnavailable, MLAPrefillKernel
from mla_switchboard.kernels.measure import make_inputs

H = 4
R1 = (128, 64, 128)
SCALE = 1 / math.sqrt(192)
GPU_ONLY = [b for b in Backend if SPECS[b].needs_gpu]


def sdpa(dtype: str | torch.dtype = "bfloat16", heads: int = H) -> MLAPrefillKernel:
    return kernels.get("TORCH_SDPA").create(heads, *R1, SCALE, dtype, "cpu")


def batch(lens_q: list[int], lens_k: list[int] | None = None, dtype: torch.dtype = torch.bfloat16):
    return make_inputs(
        num_heads=H,
        qk_head_dim=192,
        v_head_dim=128,
        seqlens_q=lens_q,
        seqlens_k=lens_k,
        dtype=dtype,
        device="cpu",
    )


# ------------------------------------------------------------------- creation
@pytest.mark.parametrize("dtype", ["bf16", "torch.bfloat16", torch.bfloat16, "half", "fp32"])
def test_create_accepts_torch_dtypes_and_spec_spellings(dtype: object) -> None:
    inst = kernels.get("TORCH_SDPA").create(H, *R1, SCALE, dtype, "cpu")
    assert isinstance(inst, MLAPrefillKernel)
    assert inst.impl == "torch-fp32-reference"
    assert inst.dtype in (torch.bfloat16, torch.float16, torch.float32)
    assert inst.device == torch.device("cpu")


def test_create_rejects_bad_arguments_with_the_argument_named() -> None:
    cls = kernels.get("TORCH_SDPA")
    with pytest.raises(ValueError, match="num_heads"):
        cls.create(0, *R1, SCALE, "bf16", "cpu")
    with pytest.raises(ValueError, match="v_head_dim"):
        cls.create(H, 128, 64, -1, SCALE, "bf16", "cpu")
    with pytest.raises(ValueError, match="softmax_scale"):
        cls.create(H, *R1, float("nan"), "bf16", "cpu")
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        cls.create(H, *R1, SCALE, "int8", "cpu")
    with pytest.raises(ValueError, match=r"torch\.int8 not supported"):
        cls.create(H, *R1, SCALE, torch.int8, "cpu")
    with pytest.raises(TypeError, match="takes no options"):
        cls.create(H, *R1, SCALE, "bf16", "cpu", impl="x")


def _installed_for(backend: Backend) -> dict[str, str]:
    return base._installed(SPECS[backend].package_names)


@pytest.mark.parametrize("backend", GPU_ONLY, ids=str)
def test_gpu_only_backends_refuse_cpu_with_the_spec_reasons(backend: Backend) -> None:
    with pytest.raises(BackendUnavailable) as info:
        kernels.get(backend).create(H, *R1, SCALE, "bf16", "cpu")
    ctx = SelectionContext(
        capability=None, dims=MLADims(*R1), dtype=Dtype.BFLOAT16, packages=_installed_for(backend)
    )
    expected = SPECS[backend].validate(ctx)
    assert expected and info.value.reasons == expected
    assert info.value.backend is backend
    for reason in expected:
        assert reason in str(info.value)
    assert f"no CUDA device (needs compute capability {SPECS[backend].capability_text})" in str(
        info.value
    )


def test_trtllm_ragged_refuses_hopper_with_the_spec_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stand in an H200 (9.0): the refusal must come from the spec, before any import.
    monkeypatch.setattr(base, "device_capability", lambda device: Capability(9, 0))
    with pytest.raises(BackendUnavailable) as info:
        kernels.get("TRTLLM_RAGGED").create(H, *R1, SCALE, "bf16", "cuda")
    assert "compute capability 9.0 not supported (needs 10.x)" in info.value.reasons


def test_spec_reasons_for_dims_and_dtype_reach_the_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(base, "device_capability", lambda device: Capability(9, 0))
    with pytest.raises(BackendUnavailable) as info:
        kernels.get("CUDNN").create(H, 192, 64, 256, SCALE, "fp32", "cuda")
    reasons = info.value.reasons
    assert "dtype float32 not supported (needs bfloat16 or float16)" in reasons
    assert (
        "model MLA dims (192, 64, 256) not supported (needs DeepSeek-R1 dims (128, 64, 128))"
        in reasons
    )


def test_torch_sdpa_on_a_missing_cuda_device_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal is for CPU-only machines")
    with pytest.raises(BackendUnavailable, match="no CUDA device is available"):
        kernels.get("TORCH_SDPA").create(H, *R1, SCALE, "bf16", "cuda")


# -------------------------------------------------------------------- calling
def test_prefill_returns_out_and_lse_in_the_contract_layout() -> None:
    inst = sdpa()
    inputs = batch([3, 5, 1])
    out = inst.prefill(**inputs)
    assert isinstance(out, torch.Tensor)
    assert out.shape == (9, H, 128) and out.dtype == torch.bfloat16
    out2, lse = inst.prefill(**inputs, return_lse=True)
    assert torch.equal(out, out2)
    assert lse.shape == (H, 9) and lse.dtype == torch.float32 and lse.is_contiguous()


def test_empty_batch_returns_empty_tensors() -> None:
    inst = sdpa()
    inputs = batch([0, 0])
    out, lse = inst.prefill(**inputs, return_lse=True)
    assert out.shape == (0, H, 128) and lse.shape == (H, 0)


def test_zero_length_sequences_inside_a_batch_are_fine() -> None:
    inst = sdpa("fp32")
    full = batch([4, 0, 3], dtype=torch.float32)
    out, lse = inst.prefill(**full, return_lse=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def _err(inst: MLAPrefillKernel, match: str, **changes: object) -> None:
    inputs = batch([3, 5])
    inputs.update(changes)
    causal = bool(inputs.pop("causal", True))
    with pytest.raises(ValueError, match=match):
        inst.prefill(**inputs, causal=causal)


def test_shape_errors_name_the_argument() -> None:
    inst = sdpa()
    q = torch.zeros(8, H, 192, dtype=torch.bfloat16)
    _err(inst, r"q must be 3-D", q=q[0])
    _err(inst, r"q must have shape \[T_q, 4, 192\]", q=torch.zeros(8, H, 128, dtype=torch.bfloat16))
    _err(inst, r"q must have shape \[T_q, 4, 192\]", q=torch.zeros(8, 2, 192, dtype=torch.bfloat16))
    _err(inst, r"k must have shape \[T_k, 4, 192\]", k=torch.zeros(8, H, 64, dtype=torch.bfloat16))
    _err(inst, r"v must have shape \[T_k, 4, 128\]", v=torch.zeros(8, H, 192, dtype=torch.bfloat16))
    _err(inst, "k and v must have the same number of tokens", v=torch.zeros(7, H, 128).bfloat16())


def test_dtype_and_type_errors_name_the_argument() -> None:
    inst = sdpa()
    _err(inst, "q has dtype torch.float16 but this TORCH_SDPA kernel was created for "
         "torch.bfloat16", q=torch.zeros(8, H, 192, dtype=torch.float16))  # fmt: skip
    _err(inst, "v has dtype torch.float32", v=torch.zeros(8, H, 128))
    _err(inst, "k must be a torch.Tensor", k=[1, 2])
    _err(inst, "cu_seqlens_q must have dtype torch.int32, got torch.int64",
         cu_seqlens_q=torch.tensor([0, 3, 8]))  # fmt: skip
    _err(
        inst, "cu_seqlens_k must be 1-D", cu_seqlens_k=torch.tensor([[0, 3, 8]], dtype=torch.int32)
    )
    _err(inst, "max_seqlen_q must be a non-negative int", max_seqlen_q=5.0)
    _err(inst, "max_seqlen_k must be a non-negative int", max_seqlen_k=True)
    with pytest.raises(ValueError, match="causal must be a bool"):
        inst.prefill(**batch([3, 5]), causal=1)  # type: ignore[arg-type]


def test_offset_value_errors_name_the_argument() -> None:
    inst = sdpa()
    i32 = torch.int32
    _err(inst, "cu_seqlens_q must start at 0", cu_seqlens_q=torch.tensor([1, 3, 8], dtype=i32))
    _err(inst, "cu_seqlens_k must be non-decreasing",
         cu_seqlens_k=torch.tensor([0, 6, 5], dtype=i32))  # fmt: skip
    _err(inst, r"cu_seqlens_q\[-1\] = 7 must equal the number of q tokens \(8\)",
         cu_seqlens_q=torch.tensor([0, 3, 7], dtype=i32))  # fmt: skip
    _err(inst, "cu_seqlens_q and cu_seqlens_k must have the same length",
         cu_seqlens_q=torch.tensor([0, 3, 5, 8], dtype=i32))  # fmt: skip
    _err(inst, r"max_seqlen_q = 4 is smaller than the longest sequence in cu_seqlens_q \(5\)",
         max_seqlen_q=4)  # fmt: skip


def test_semantic_errors_instead_of_undefined_rows() -> None:
    inst = sdpa()
    inputs = batch([3, 5], [3, 0])
    with pytest.raises(ValueError, match="sequence 1 has 5 query tokens but no key/value"):
        inst.prefill(**inputs, causal=False)
    inputs = batch([3, 5], [3, 4])
    with pytest.raises(ValueError, match="sequence 1 has more query tokens"):
        inst.prefill(**inputs, causal=True)
    inst.prefill(**inputs, causal=False)  # fine without a causal mask


def test_offsets_are_read_once_per_tensor_and_again_after_an_in_place_change() -> None:
    inst = sdpa()
    inputs = batch([3, 5])
    inst.prefill(**inputs)
    cu = inputs["cu_seqlens_q"]
    assert inst._host_q.get(cu) == (0, 3, 8)
    cu[1] = 4  # in-place write bumps the version counter: re-read, and refuse the lie
    inputs["max_seqlen_q"] = 5
    inst.prefill(**inputs, causal=False)
    assert inst._host_q.get(cu) == (0, 4, 8)
