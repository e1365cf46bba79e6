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


# ------------------------------------------- engine code paths and per-call cost
@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [False, True], ids=["self", "chunk"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("heads", [16, 128], ids=["H16", "H128"])
def test_cudnn_dense_graph_for_equal_lengths(heads: int, causal: bool, chunk: bool) -> None:
    """Equal-length batches run cuDNN's dense graph (no ragged offsets), LSE in [H, T]."""
    if "CUDNN" not in BACKENDS:
        pytest.skip("CUDNN not selected")
    inst = _instance("CUDNN", heads, "bfloat16")
    res = reference_check(
        inst, seqlens=[384, 384, 384], causal=causal, dtype="bfloat16", device=DEVICE,
        q_shorter_than_kv=chunk,
    )  # fmt: skip
    _record(res, f"CUDNN[dense]-bfloat16-H{heads}-causal={causal}-chunk={chunk}")
    assert inst.last_mode == "dense"  # type: ignore[attr-defined]
    assert res.ok, res


@pytest.mark.gpu
def test_flash_attn_runs_vllms_fa3_on_hopper_when_vllm_is_installed() -> None:
    """Issue 12 item 7: a vLLM pod's FLASH_ATTN is vLLM's bundled FlashAttention."""
    if "FLASH_ATTN" not in BACKENDS:
        pytest.skip("FLASH_ATTN not selected")
    try:
        import vllm.vllm_flash_attn  # noqa: F401
    except Exception as exc:
        pytest.skip(f"vllm.vllm_flash_attn not importable here: {exc}")
    inst = _instance("FLASH_ATTN", 16, "bfloat16")
    major, _ = torch.cuda.get_device_capability()
    expected = {9: "vllm-fa3", 10: "vllm-fa4"}.get(major, "vllm-fa2")
    assert inst.impl == expected, getattr(inst, "tried", None)


def _repeated_inputs(heads: int = 16) -> dict[str, Any]:
    from mla_switchboard.kernels.measure import make_inputs

    return make_inputs(
        num_heads=heads, qk_head_dim=192, v_head_dim=128, seqlens_q=[512] * 8,
        dtype="bfloat16", device=DEVICE,
    )  # fmt: skip


def _syncs(fn: Any) -> bool:
    """Whether ``fn`` makes a synchronising CUDA call (a device-to-host copy, say)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return False
    except RuntimeError:
        return True
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("return_lse", [False, True], ids=["out", "lse"])
@pytest.mark.parametrize("backend", ["FLASH_ATTN", "FLASHINFER", "CUDNN"])
def test_repeated_call_costs_at_most_15us_of_host_time_beyond_the_library(
    backend: str, return_lse: bool
) -> None:
    """Issue 14 item 1: same offsets again (every layer of a forward pass): no
    device-to-host copy, no re-planning, <= 15 us of host time beyond the library."""
    from mla_switchboard.kernels.measure import host_us_interleaved

    if backend not in BACKENDS:
        pytest.skip(f"{backend} not selected")
    inst = _instance(backend, 16, "bfloat16")
    inputs = _repeated_inputs()
    direct = inst.direct_calls(inputs, causal=True, return_lse=return_lse)
    assert direct, f"{backend} offers no direct call"

    def wrapper() -> Any:
        return inst.prefill(**inputs, causal=True, return_lse=return_lse)

    for fn in (wrapper, *direct.values()):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    plans = getattr(inst, "plans", None)
    builds = getattr(inst, "graph_builds", None)
    direct_syncs = any(_syncs(fn) for fn in direct.values())
    if not direct_syncs:
        assert not _syncs(wrapper), f"{inst.impl}: a repeated call synchronised the GPU"
    host = host_us_interleaved({"wrapper": wrapper, **direct}, DEVICE, iters=60)
    wrapper_us = host.pop("wrapper")
    direct_us = min(host.values())
    print(f"{backend} {inst.impl} lse={return_lse}: host {wrapper_us:.1f} us per call, "
          f"direct {direct_us:.1f} us, overhead {wrapper_us - direct_us:.1f} us")  # fmt: skip
    assert getattr(inst, "plans", None) == plans
    assert getattr(inst, "graph_builds", None) == builds
    assert wrapper_us - direct_us <= 15.0


@pytest.mark.gpu
def test_flashinfer_keeps_its_plan_for_new_tensors_with_the_same_offsets() -> None:
    if "FLASHINFER" not in BACKENDS:
        pytest.skip("FLASHINFER not selected")
    inst = _instance("FLASHINFER", 16, "bfloat16")
    a = _repeated_inputs()
    inst.prefill(**a)
    plans = inst.plans  # type: ignore[attr-defined]
    b = dict(a, cu_seqlens_q=a["cu_seqlens_q"].clone(), cu_seqlens_k=a["cu_seqlens_k"].clone())
    inst.prefill(**b)
    assert inst.plans == plans  # type: ignore[attr-defined]
    b["cu_seqlens_q"][1:] -= 1  # in place: a different batch now, must be re-read
    b["cu_seqlens_k"][1:] -= 1
    b["q"], b["k"], b["v"] = b["q"][:-1], b["k"][:-1], b["v"][:-1]
    b["cu_seqlens_q"][-1] = b["cu_seqlens_k"][-1] = b["q"].shape[0]
    inst.prefill(**b)
    assert inst.plans == plans + 1  # type: ignore[attr-defined]
