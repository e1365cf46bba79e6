"""Every MLA dims class the spec accepts on this GPU runs, per backend and dtype, within
the reference's tolerances (``bench/shape_sweep.py`` has the classes, the batches and
the JSON the H200 run committed). A backend the spec refuses here is skipped with the
spec's reason; a missing package, with the wrapper's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip(
        "no CUDA device: the shape sweep needs one (see bench/gpu_run.sh)",
        allow_module_level=True,
    )

from mla_switchboard.core.specs import SPECS, Backend, Capability, Dtype  # noqa: E402

from bench.shape_sweep import CASES, DIMS_CLASSES, DTYPES, accepted, run_case  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize(("causal", "chunk"), CASES, ids=lambda x: str(x))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("dims_class", list(DIMS_CLASSES))
@pytest.mark.parametrize("backend", list(SPECS), ids=lambda b: b.value)
def test_every_accepted_shape_runs(
    backend: Backend, dims_class: str, dtype: Dtype, causal: bool, chunk: bool
) -> None:
    cap = Capability(*torch.cuda.get_device_capability(0))
    dims = DIMS_CLASSES[dims_class]
    refused = accepted(backend, cap, dims, dtype)
    if refused:
        pytest.skip(f"the spec refuses {backend} here: {'; '.join(refused)}")
    result = run_case(backend, dims, dtype, causal=causal, chunk=chunk)
    if result["status"] == "unavailable":
        pytest.skip(result["reason"])
    assert result["status"] == "passed", result
