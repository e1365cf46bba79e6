"""GPU correctness suite: every backend that can run here against the fp32 reference.

Run on a CUDA machine with ``python3 -m pytest -rs tests/gpu`` (``bench/gpu_run.sh``
does it on the H200 with the carried wheels). Without CUDA, or without a backend's
package, the tests skip with the reason printed (``-rs``).

Batches: ragged lengths 1, 37, 256, 513, 4096 (a single token, odd lengths that
straddle kernel tiles, and one long sequence), self-attention and a context chunk
(each sequence's last quarter as queries, bottom-right causal), causal and not,
bf16 and fp16, 16 and 128 heads, DeepSeek-R1 dims. Tolerances are
``kernels.measure.default_tolerances``; its docstring gives the reasoning.

``KERNELS_GPU_BACKENDS=A,B`` limits the backends (each GPU call carries one
package's wheels); ``KERNELS_GPU_REPORT=path.jsonl`` appends every check's result.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip(
        "no CUDA device: the GPU kernel suite needs one (see bench/gpu_run.sh)",
        allow_module_level=True,
    )

from mla_switchboard import kernels  # noqa: E402
from mla_switchboard.kernels import R1_DIMS  # noqa: E402
from mla_switchboard.kernels.base import BackendUnavailable, MLAPrefillKernel  # noqa: E402
from mla_switchboard.kernels.measure import CheckResult, reference_check, reference_outputs  # noqa: E402

DEVICE = "cuda"
SCALE = 1.0 / math.sqrt(R1_DIMS.qk_head_dim)
SEQLENS = [1, 37, 256, 513, 4096]
ALL_BACKENDS = ["TORCH_SDPA", "FLASH_ATTN", "FLASHINFER", "CUDNN"]
_selected = os.environ.get("KERNELS_GPU_BACKENDS")
BACKENDS = [b.strip().upper() for b in _selected.split(",")] if _selected else ALL_BACKENDS
REPORT = os.environ.get("KERNELS_GPU_REPORT")

_instances: dict[tuple[Any, ...], MLAPrefillKernel | str] = {}
_references: dict[tuple[Any, ...], tuple[Any, Any]] = {}


def _instance(backend: str, heads: int, dtype: str, **options: Any) -> MLAPrefillKernel:
    """One instance per (backend, heads, dtype, options), as a serving process would keep."""
    key = (backend, heads, dtype, tuple(sorted(options.items())))
    if key not in _instances:
        try:
            _instances[key] = kernels.get(backend).create(
                heads, *_r1(), SCALE, dtype, DEVICE, **options
            )
        except (BackendUnavailable, ImportError) as exc:
            _instances[key] = f"{backend} unavailable here: {exc}"
    inst = _instances[key]
    if isinstance(inst, str):
        pytest.skip(inst)
    return inst


def _r1() -> tuple[int, int, int]:
    return (R1_DIMS.qk_nope_head_dim, R1_DIMS.qk_rope_head_dim, R1_DIMS.v_head_dim)


def _reference(heads: int, dtype: str, causal: bool, chunk: bool) -> tuple[Any, Any]:
    key = (heads, dtype, causal, chunk)
    if key not in _references:
        _references[key] = reference_outputs(
            num_heads=heads,
            dims=R1_DIMS,
            softmax_scale=SCALE,
            seqlens=SEQLENS,
            causal=causal,
            dtype=dtype,
            device=DEVICE,
            q_shorter_than_kv=chunk,
        )
    return _references[key]


def _record(res: CheckResult, test_id: str) -> None:
    line = {"test": test_id, **res.to_json()}
    print(json.dumps(line, default=str))
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps(line, default=str) + "\n")


def _check(
    backend: str, heads: int, dtype: str, causal: bool, chunk: bool, **options: Any
) -> CheckResult:
    if backend not in BACKENDS:
        pytest.skip(f"{backend} not selected (KERNELS_GPU_BACKENDS={_selected})")
    inst = _instance(backend, heads, dtype, **options)
    res = reference_check(
        inst,
        seqlens=SEQLENS,
        causal=causal,
        dtype=dtype,
        device=DEVICE,
        q_shorter_than_kv=chunk,
        reference=_reference(heads, dtype, causal, chunk),
    )
    opts = ",".join(f"{k}={v}" for k, v in sorted(options.items()))
    _record(res, f"{backend}[{opts}]-{dtype}-H{heads}-causal={causal}-chunk={chunk}")
    return res


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [False, True], ids=["self", "chunk"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("heads", [16, 128], ids=["H16", "H128"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_backend_matches_fp32_reference(
    backend: str, dtype: str, heads: int, causal: bool, chunk: bool
) -> None:
    res = _check(backend, heads, dtype, causal, chunk)
    assert res.ok, res


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [False, True], ids=["self", "chunk"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("FLASH_ATTN", {"impl": "torch-bundled-fa2"}),
        ("CUDNN", {"bucket_batch": False}),
        ("CUDNN", {"stats_layout": "padded"}),
    ],
    ids=["fa-torch-bundled", "cudnn-exact-batch", "cudnn-padded-stats"],
)
def test_backend_variants_match_fp32_reference(
    backend: str, options: dict[str, Any], causal: bool, chunk: bool
) -> None:
    res = _check(backend, 16, "bfloat16", causal, chunk, **options)
    assert res.ok, res


@pytest.mark.gpu
def test_cudnn_reuses_one_graph_across_lengths_in_a_bucket() -> None:
    if "CUDNN" not in BACKENDS:
        pytest.skip("CUDNN not selected")
    inst = _instance("CUDNN", 16, "bfloat16")
    before = inst.graph_builds  # type: ignore[attr-defined]
    first = reference_check(inst, seqlens=[700, 900, 5], dtype="bfloat16", device=DEVICE)
    builds = inst.graph_builds  # type: ignore[attr-defined]
    second = reference_check(
        inst, seqlens=[1000, 3, 50, 2], dtype="bfloat16", device=DEVICE, seed=1
    )
    assert first.ok and second.ok, (first, second)
    assert builds - before <= 1
    assert inst.graph_builds == builds  # type: ignore[attr-defined]  # B 3, 4 -> 4; S <= 1024


@pytest.mark.gpu
def test_flashinfer_reuses_its_plan_for_the_same_batch() -> None:
    if "FLASHINFER" not in BACKENDS:
        pytest.skip("FLASHINFER not selected")
    inst = _instance("FLASHINFER", 16, "bfloat16")
    from mla_switchboard.kernels.measure import make_inputs

    inputs = make_inputs(
        num_heads=16, qk_head_dim=192, v_head_dim=128, seqlens_q=[100, 7],
        dtype="bfloat16", device=DEVICE,
    )  # fmt: skip
    plans = inst.plans  # type: ignore[attr-defined]
    a = inst.prefill(**inputs)
    b = inst.prefill(**inputs)
    assert inst.plans == plans + 1  # type: ignore[attr-defined]
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    inst.prefill(**inputs, causal=False)
    assert inst.plans == plans + 2  # type: ignore[attr-defined]


@pytest.mark.gpu
def test_trtllm_ragged_refuses_this_gpu_unless_blackwell() -> None:
    major, minor = torch.cuda.get_device_capability()
    if major == 10:
        pytest.skip("Blackwell: TRTLLM_RAGGED should run here; use the reference check")
    with pytest.raises(BackendUnavailable) as info:
        kernels.get("TRTLLM_RAGGED").create(16, *_r1(), SCALE, "bfloat16", DEVICE)
    assert f"compute capability {major}.{minor} not supported (needs 10.x)" in info.value.reasons


@pytest.mark.gpu
def test_every_runnable_backend_reports_its_code_path() -> None:
    seen = {}
    for backend in BACKENDS:
        try:
            seen[backend] = _instance(backend, 16, "bfloat16").impl
        except pytest.skip.Exception:
            continue
    print("impls:", seen)
    assert all(impl and impl != "unbuilt" for impl in seen.values())
