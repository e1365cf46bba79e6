"""The backend specs as a unit table: what each kernel runs, checked directly.

FLASHINFER is the one whose dims depend on the device: FlashInfer runs its CUTLASS
ragged kernel on 10.x (what vLLM, SGLang and our wrapper call there), built for the
(qk, v) head dims (192, 128), (128, 128) and (64, 64) only, and elsewhere FA3 (9.x, for
the head dims it has) or FA2, which FlashInfer JIT-builds for the device from 8.0 to
12.x for any head dims (flashinfer-python 0.7.2: ``utils.py``
``determine_attention_backend``, ``jit/attention/modules.py`` large-head FA2 for 8.x to
12.x, ``compilation_context.py`` compute_110a and compute_120f).
"""

from __future__ import annotations

import pytest
from mla_switchboard.core.specs import (
    FLASHINFER_CUTLASS_HEAD_DIMS,
    SPECS,
    Backend,
    Capability,
    Dtype,
    MLADims,
    SelectionContext,
)

from tests.core.conftest import BIG, GLM5, KIMI, R1, SMALL

FLASHINFER = SPECS[Backend.FLASHINFER]
WIDE_V = (128, 64, 256)


def _reasons(
    cap: tuple[int, int], dims: tuple[int, int, int], dtype: str = "bfloat16"
) -> list[str]:
    ctx = SelectionContext(Capability(*cap), MLADims(*dims), Dtype(dtype), None)
    return FLASHINFER.validate(ctx)


@pytest.mark.parametrize(
    ("cap", "dims", "valid"),
    [
        ((8, 0), R1, True),
        ((8, 6), KIMI, True),
        ((8, 9), SMALL, True),
        ((9, 0), R1, True),  # FA3
        ((9, 0), BIG, True),  # (320, 128): FA2
        ((9, 0), WIDE_V, True),  # (192, 256): FA2
        ((10, 0), R1, True),  # CUTLASS (192, 128)
        ((10, 3), SMALL, True),  # CUTLASS (128, 128)
        ((10, 0), (64, 0, 64), True),  # CUTLASS (64, 64)
        ((10, 0), KIMI, False),  # (256, 256): not a CUTLASS instantiation
        ((10, 0), GLM5, False),
        ((10, 0), BIG, False),
        ((11, 0), R1, True),  # FA2 for SM110
        ((11, 0), KIMI, True),
        ((12, 0), R1, True),  # FA2 for SM120 (RTX 5090)
        ((12, 1), GLM5, True),
        ((7, 5), R1, False),
    ],
)
def test_flashinfer_runs_where_its_kernels_are_built(cap, dims, valid: bool) -> None:  # type: ignore[no-untyped-def]
    assert (not _reasons(cap, dims)) is valid, _reasons(cap, dims)


def test_a_cutlass_refusal_names_the_kernel_and_its_head_dims() -> None:
    (why,) = _reasons((10, 0), KIMI)
    assert "on 10.x" in why and "CUTLASS" in why and "(256, 256)" in why
    for pair in FLASHINFER_CUTLASS_HEAD_DIMS:
        assert str(pair) in why


def test_flashinfer_still_needs_half_precision_and_a_gpu() -> None:
    assert any("dtype" in r for r in _reasons((9, 0), R1, "float32"))
    ctx = SelectionContext(None, MLADims(*R1), Dtype.BFLOAT16, None)
    assert FLASHINFER.validate(ctx) == ["no CUDA device (needs compute capability 8.x to 12.x)"]


def test_the_dims_text_says_where_the_dims_narrow() -> None:
    assert FLASHINFER.dims_text == (
        "any; on 10.x (qk, v) (64, 64) or (128, 128) or (192, 128) only"
    )
    # a backend that runs on one major only, narrowed there: its head dims, no "any"
    assert (
        SPECS[Backend.TRTLLM_RAGGED].dims_text == "(qk, v) (128, 128) or (192, 128) or (256, 256)"
    )
    narrowed = {Backend.FLASHINFER, Backend.TRTLLM_RAGGED}
    assert all(not s.head_dims_by_major for b, s in SPECS.items() if b not in narrowed)
