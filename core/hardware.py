"""Physical limits of the GPUs the fleet runs: the dense bf16 tensor-core peak by name.

A measured figure above its GPU's peak is not a measurement (``POST /v1/measurements``
refuses it, naming the field): an attention kernel cannot do more floating-point work
per second than the tensor cores can. Figures are NVIDIA's datasheet dense (no
sparsity) BF16 peaks in TFLOP/s, for the fastest variant of each name (SXM where there
is one); fp16 has the same peak and fp32 a lower one, so the bound holds for every
dtype the service takes.

A name is matched on whole words, most specific first (``H100 PCIe`` before ``H100``,
``H200`` never as ``H20``). A GPU not in the table gets ``UNKNOWN_PEAK_TFLOPS``: a
generous bound above every GPU made so far, which still refuses the absurd (a forged report
of 99,999 TFLOP/s), without refusing a new GPU's honest numbers; add the GPU
here to tighten it.
"""

from __future__ import annotations

import re

# (word pattern, dense bf16 TFLOP/s), most specific first
PEAKS: tuple[tuple[str, float], ...] = (
    # Blackwell
    ("GB300", 2500.0),
    ("B300", 2500.0),
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("B100", 1750.0),
    ("RTX PRO 6000", 503.8),
    # Hopper
    ("GH200", 989.5),
    ("H200", 989.5),
    ("H100 PCIE", 756.5),
    ("H100 NVL", 835.5),
    ("H100", 989.5),
    ("H800", 989.5),
    ("H20", 148.0),
    # Ada
    ("L40S", 362.1),
    ("L40", 181.0),
    ("L20", 119.5),
    ("L4", 121.0),
    ("RTX 6000 ADA", 364.2),
    ("RTX 4090", 165.2),
    # Ampere
    ("A100", 312.0),
    ("A800", 312.0),
    ("A30", 165.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("A40", 149.7),
    ("RTX A6000", 154.8),
)
UNKNOWN_PEAK_TFLOPS = 5000.0
"""The bound for a GPU not in the table (or no name): twice the fastest one listed."""

_COMPILED = tuple(
    (re.compile(r"(?<![A-Z0-9])" + re.escape(name) + r"(?![A-Z0-9])"), peak) for name, peak in PEAKS
)


def peak_bf16_tflops(device_name: str | None) -> tuple[float, str | None]:
    """(dense bf16 peak in TFLOP/s, the table entry matched or None for unknown)."""
    normalized = " ".join((device_name or "").upper().replace("-", " ").split())
    for (pattern, peak), (name, _) in zip(_COMPILED, PEAKS, strict=True):
        if pattern.search(normalized):
            return peak, name
    return UNKNOWN_PEAK_TFLOPS, None
