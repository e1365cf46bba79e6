"""The decision table, through the in-process app and a real server.

Expected backends come from the issue's table (the spec), not from the code: e.g.
Blackwell's list is TRTLLM_RAGGED, FLASHINFER, CUDNN, FLASH_ATTN; everything else
FLASH_ATTN; nothing valid falls back to FLASH_ATTN then TORCH_SDPA.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

R1 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_heads": 128}
GLM = {"qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256, "num_heads": 64}
# head dims (128, 128): FlashInfer's trtllm-gen ragged DeepSeek kernel takes them, as its
# CUTLASS kernel (10.x), FLASH_ATTN and TORCH_SDPA do
SMALL = {"qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_heads": 16}
# no rope part, head dims (256, 256): on 10.x the trtllm-gen ragged kernel (GLM-5's),
# FLASH_ATTN and TORCH_SDPA take them, FlashInfer's CUTLASS kernel does not
NOPE = {"qk_nope_head_dim": 256, "qk_rope_head_dim": 0, "v_head_dim": 256, "num_heads": 16}
# head dims (192, 256): neither FlashInfer kernel takes them on 10.x
ODD = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 256, "num_heads": 16}
BIG = {"qk_nope_head_dim": 256, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_heads": 16}
ALL = {"torch": "2.11.0", "flashinfer": "0.7.2", "cudnn": "1.32.0", "flash_attn": "2.8.3"}


def body(cap: list[int] | None = (9, 0), dims: dict[str, int] = R1, **kw: Any) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "cluster": "prod-east",
        "node": "gpu-17",
        "pod": "r1-0",
        "device": {"name": "GPU", "capability": None if cap is None else list(cap)},
        "model": {"name": "deepseek-ai/DeepSeek-R1", **dims},
        "dtype": "bfloat16",
        **kw,
    }


def select(api: httpx.Client, payload: dict[str, Any]) -> dict[str, Any]:
    r = api.post("/v1/select", json=payload)
    assert r.status_code == 200, r.text
    return r.json()


def reasons_of(answer: dict[str, Any], backend: str) -> list[str]:
    (c,) = [c for c in answer["candidates"] if c["backend"] == backend]
    return c["reasons"]


CASES = [
    # id, capability, dims, dtype, packages, expected backend, expected source
    ("blackwell-all", [10, 0], R1, "bfloat16", ALL, "TRTLLM_RAGGED", "priority"),
    (
        "blackwell-no-flashinfer",
        [10, 0],
        R1,
        "bf16",
        {"torch": "2", "cudnn": "1"},
        "CUDNN",
        "priority",
    ),
    ("blackwell-torch-only", [10, 0], R1, "float16", {"torch": "2"}, "FLASH_ATTN", "priority"),
    ("blackwell-glm-dims", [10, 0], GLM, "bfloat16", ALL, "TRTLLM_RAGGED", "priority"),
    ("blackwell-small-dims", [10, 0], SMALL, "bfloat16", ALL, "TRTLLM_RAGGED", "priority"),
    ("blackwell-nope-dims", [10, 0], NOPE, "bfloat16", ALL, "TRTLLM_RAGGED", "priority"),
    ("blackwell-odd-dims", [10, 0], ODD, "bfloat16", ALL, "FLASH_ATTN", "priority"),
    ("blackwell-too-big-for-fa", [10, 0], BIG, "bfloat16", ALL, "TORCH_SDPA", "fallback"),
    ("blackwell-fp32", [10, 3], R1, "float32", ALL, "TORCH_SDPA", "fallback"),
    ("hopper", [9, 0], R1, "bfloat16", ALL, "FLASH_ATTN", "priority"),
    ("hopper-unknown-packages", [9, 0], R1, "torch.bfloat16", None, "FLASH_ATTN", "priority"),
    ("ampere", [8, 0], R1, "half", ALL, "FLASH_ATTN", "priority"),
    ("ada", [8, 9], GLM, "fp16", ALL, "FLASH_ATTN", "priority"),
    ("turing", [7, 5], R1, "bfloat16", ALL, "TORCH_SDPA", "fallback"),
    ("consumer-blackwell-12", [12, 0], R1, "bfloat16", ALL, "FLASH_ATTN", "priority"),
    ("no-gpu", None, R1, "bfloat16", ALL, "TORCH_SDPA", "fallback"),
    ("no-gpu-fp32", None, GLM, "fp32", ALL, "TORCH_SDPA", "fallback"),
]


@pytest.mark.parametrize(
    ("cap", "dims", "dtype", "packages", "backend", "source"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decision_table(
    api: httpx.Client, cap: Any, dims: Any, dtype: str, packages: Any, backend: str, source: str
) -> None:
    answer = select(api, body(cap, dims, dtype=dtype, packages=packages))
    assert (answer["backend"], answer["source"]) == (backend, source)
    assert answer["rules_revision"] >= 1
    assert answer["decision_id"]
    # Every backend is accounted for, once, with reasons exactly when invalid.
    assert sorted(c["backend"] for c in answer["candidates"]) == sorted(
        ["TRTLLM_RAGGED", "FLASHINFER", "CUDNN", "FLASH_ATTN", "TOKENSPEED_MLA", "TORCH_SDPA"]
    )
    for c in answer["candidates"]:
        assert c["valid"] == (not c["reasons"])
    chosen = next(c for c in answer["candidates"] if c["backend"] == backend)
    assert chosen["valid"]
    assert answer["messages"]


def test_reasons_name_the_fact(api: httpx.Client) -> None:
    answer = select(api, body([9, 0], GLM, dtype="float32", packages={"torch": "2"}))
    assert "compute capability 9.0 not supported (needs 10.x)" in reasons_of(
        answer, "TRTLLM_RAGGED"
    )
    fi = reasons_of(answer, "FLASHINFER")
    assert any(r.startswith("dtype float32 not supported") for r in fi)
    assert "required package flashinfer not installed" in fi
    cudnn = reasons_of(answer, "CUDNN")
    assert any(
        r.startswith(
            "model MLA dims (192, 64, 256) not supported (needs DeepSeek-R1 dims (128, 64, 128))"
        )
        for r in cudnn
    )
    assert "required package cudnn not installed" in cudnn


def test_turing_reason(api: httpx.Client) -> None:
    answer = select(api, body([7, 5]))
    assert any(
        "compute capability 7.5 not supported" in r for r in reasons_of(answer, "FLASH_ATTN")
    )


def test_no_gpu_reason(api: httpx.Client) -> None:
    answer = select(api, body(None))
    assert all(
        any("no CUDA device" in r for r in c["reasons"])
        for c in answer["candidates"]
        if c["backend"] != "TORCH_SDPA"
    )


def test_priority_order_is_visible(api: httpx.Client) -> None:
    answer = select(api, body([10, 0], packages={"torch": "2", "cudnn": "1"}))
    order = [c["backend"] for c in answer["candidates"]][:4]
    assert order == ["TRTLLM_RAGGED", "FLASHINFER", "CUDNN", "FLASH_ATTN"]
    assert [c["role"] for c in answer["candidates"][:3]] == ["priority"] * 3


class TestRequested:
    def test_valid_request_wins(self, api: httpx.Client) -> None:
        answer = select(api, body([9, 0], requested_backend="flashinfer", packages=ALL))
        assert (answer["backend"], answer["source"]) == ("FLASHINFER", "requested")

    def test_torch_sdpa_on_gpu_can_be_requested(self, api: httpx.Client) -> None:
        answer = select(api, body([9, 0], requested_backend="TORCH_SDPA"))
        assert (answer["backend"], answer["source"]) == ("TORCH_SDPA", "requested")

    def test_invalid_non_strict_falls_back(self, api: httpx.Client) -> None:
        answer = select(
            api, body([9, 0], requested_backend="TRTLLM_RAGGED", packages=ALL, strict=False)
        )
        assert (answer["backend"], answer["source"]) == ("FLASH_ATTN", "priority")
        text = " ".join(answer["messages"])
        assert "Requested MLA prefill backend TRTLLM_RAGGED is not valid" in text
        assert "compute capability 9.0 not supported (needs 10.x)" in text
        assert "Falling back to auto-selection." in text

    def test_invalid_strict_is_409_with_reasons(self, api: httpx.Client) -> None:
        r = api.post(
            "/v1/select",
            json=body([9, 0], requested_backend="cudnn", packages={"torch": "2"}, strict=True),
        )
        assert r.status_code == 409
        detail = r.json()["detail"]
        assert "CUDNN" in detail["message"]
        assert "required package cudnn not installed" in reasons_of(detail, "CUDNN")

    def test_strict_to_a_release_without_the_flag_is_409_with_why(self, api: httpx.Client) -> None:
        """vLLM 0.20.2 runs TRTLLM_RAGGED but has no flag to be told it: a strict request
        is refused rather than answered as if honoured; a lenient one is answered
        without it, with no flag, and says the engine decides."""
        legacy = {"name": "vllm", "version": "0.20.2"}
        asked = {"requested_backend": "TRTLLM_RAGGED", "packages": ALL, "engine": legacy}
        r = api.post("/v1/select", json=body([10, 0], strict=True, **asked))
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert detail["kind"] == "requested_invalid"
        why = "vLLM 0.20.2 has no --attention-config.mla_prefill_backend (added in vLLM 0.21.0)"
        assert f"cannot be passed to the engine: {why}" in detail["message"]
        assert f"the engine cannot be told it: {why}" in reasons_of(detail, "TRTLLM_RAGGED")
        answer = select(api, body([10, 0], strict=False, **asked))
        assert answer["source"] != "requested" and answer["engine_args"] == []
        assert any("the engine decides" in m for m in answer["messages"])

    def test_strict_valid_is_fine(self, api: httpx.Client) -> None:
        answer = select(api, body([10, 0], requested_backend="CUDNN", strict=True))
        assert (answer["backend"], answer["source"]) == ("CUDNN", "requested")

    def test_missing_package_request(self, api: httpx.Client) -> None:
        answer = select(api, body([10, 0], requested_backend="FLASHINFER", packages={"torch": "2"}))
        assert answer["backend"] == "FLASH_ATTN"
        assert "required package flashinfer not installed" in reasons_of(answer, "FLASHINFER")


def test_no_valid_backend_at_all_is_409(api: httpx.Client) -> None:
    # packages says nothing is installed, torch included: not even TORCH_SDPA can run.
    r = api.post("/v1/select", json=body([9, 0], packages={}))
    assert r.status_code == 409
    assert r.json()["detail"]["kind"] == "no_valid_backend"


def test_same_request_same_answer(api: httpx.Client) -> None:
    a = select(api, body([10, 0], packages={"torch": "2", "cudnn": "1"}))
    b = select(api, body([10, 0], packages={"torch": "2", "cudnn": "1"}))
    assert a["decision_id"] != b["decision_id"]
    a.pop("decision_id"), b.pop("decision_id")
    assert a == b


def test_etag_revalidation(api: httpx.Client) -> None:
    r = api.post("/v1/select", json=body())
    etag = r.headers["etag"]
    again = api.post("/v1/select", json=body(), headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.headers["etag"] == etag
    assert again.headers["x-decision-id"]
    other = api.post("/v1/select", json=body([10, 0]), headers={"If-None-Match": etag})
    assert other.status_code == 200
