"""Which FlashInfer backend our FLASHINFER wrapper runs: the one the engines run there.

On 9.x FlashInfer's FA3 is built only for some head dims, and FlashInfer's ``auto``
runs FA2 for the others; forcing FA3 for those would fail to build. On 10.x the engines
run the CUTLASS kernel (whose head dims the spec enforces); FA2 everywhere else.
"""

from __future__ import annotations

import pytest
from mla_switchboard.core.specs import FLASHINFER_FA3_HEAD_DIMS, Capability, MLADims
from mla_switchboard.kernels.flashinfer import default_path


@pytest.mark.parametrize(
    ("cap", "dims", "path"),
    [
        ((9, 0), (128, 64, 128), "fa3"),  # (192, 128)
        ((9, 0), (192, 64, 256), "fa3"),  # (256, 256)
        ((9, 0), (64, 64, 128), "fa3"),  # (128, 128)
        ((9, 0), (256, 64, 128), "fa2"),  # (320, 128): no FA3 instantiation
        ((9, 0), (128, 64, 256), "fa2"),  # (192, 256)
        ((8, 0), (128, 64, 128), "fa2"),
        ((10, 0), (128, 64, 128), "cutlass"),
        ((11, 0), (128, 64, 128), "fa2"),
        ((12, 0), (128, 64, 128), "fa2"),
    ],
)
def test_default_path(cap: tuple[int, int], dims: tuple[int, int, int], path: str) -> None:
    assert default_path(Capability(*cap), MLADims(*dims)) == path


def test_fa3_only_for_its_head_dims() -> None:
    for qk, v in FLASHINFER_FA3_HEAD_DIMS:
        dims = MLADims(qk - 64, 64, v) if qk > 64 else MLADims(qk, 0, v)
        assert default_path(Capability(9, 0), dims) == "fa3"
