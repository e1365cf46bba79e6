"""Importing the specs (what the service does) must never load torch or a kernel package.

Checked in a fresh interpreter, because this test process has long since imported
torch for the other kernel tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "flashinfer", "cudnn", "flash_attn", "flash_attn_interface", "triton")


def _loaded_after(code: str) -> list[str]:
    probe = (
        "import json, sys\n"
        f"{code}\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & set(heavy))))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_importing_kernels_and_specs_loads_no_heavy_module() -> None:
    code = (
        "import mla_switchboard.kernels, mla_switchboard.core.specs\n"
        "from mla_switchboard.kernels import SPECS, SelectionContext, Capability, R1_DIMS, Dtype\n"
        "ctx = SelectionContext(Capability(9, 0), R1_DIMS, Dtype.BFLOAT16)\n"
        "[s.validate(ctx) for s in SPECS.values()]"
    )
    assert _loaded_after(code) == []


def test_get_wrapper_class_loads_torch_but_no_kernel_package() -> None:
    # The wrapper modules import torch at top; their backend packages only in create().
    code = (
        "from mla_switchboard import kernels\n"
        "names = [kernels.get(b).__name__ for b in "
        "('TORCH_SDPA', 'FLASH_ATTN', 'FLASHINFER', 'CUDNN', 'TRTLLM_RAGGED')]\n"
        "assert names == ['TorchSdpaPrefill', 'FlashAttnPrefill', 'FlashInferPrefill', "
        "'CudnnPrefill', 'TrtllmRaggedPrefill'], names"
    )
    assert _loaded_after(code) == ["torch"]


def test_measure_module_loads_no_kernel_package() -> None:
    assert _loaded_after("import mla_switchboard.kernels.measure") == ["torch"]
