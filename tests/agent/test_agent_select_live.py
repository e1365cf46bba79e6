"""The agent against a real service on loopback: the request it sends, the answer it
gets, ETag revalidation, a strict refusal, and a real run on this CPU machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.agent import NoBackendError, select_backend
from mla_switchboard.agent.cache import AnswerCache
from mla_switchboard.core.evaluator import Decision, decide_locally

CONFIGS = Path(__file__).resolve().parent / "configs"
CLUSTER = "agent-live"

# config, capability, device name, packages, expected backend, source, dims, heads
CASES: list[tuple[str, str, str | None, Any, str, str, tuple[int, int, int], int]] = [
    ("deepseek-v3.json", "10.0", "NVIDIA B200", "any", "TRTLLM_RAGGED", "priority",
     (128, 64, 128), 128),
    ("deepseek-v2-lite.json", "9.0", "NVIDIA H200", {"torch": "2.11.0", "flashinfer": "0.7.2"},
     "FLASH_ATTN", "priority", (128, 64, 128), 16),
    ("kimi-k2.json", "10.0", "NVIDIA B200", {"torch": "2.11.0", "cudnn": "1.32.0"},
     "CUDNN", "priority", (128, 64, 128), 64),
    # TRTLLM_RAGGED also takes GLM-5's (192, 64, 256) since the TOKENSPEED_MLA spec change
    ("glm-5", "10.0", "NVIDIA B200", "any", "TRTLLM_RAGGED", "priority", (192, 64, 256), 64),
    ("kimi-k2.5-multimodal.json", "8.0", "NVIDIA A100-SXM4-80GB", "any", "FLASH_ATTN",
     "priority", (128, 64, 128), 64),
    ("deepseek-v3.json", "none", None, {"torch": "2.13.0"}, "TORCH_SDPA", "fallback",
     (128, 64, 128), 128),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "capability", "device", "packages", "backend", "source", "dims", "heads"), CASES
)
def test_real_configs_give_the_right_request_and_answer(
    agent_service: Any,
    cache_dir: Path,
    gpu: Any,
    config: str,
    capability: str,
    device: str | None,
    packages: Any,
    backend: str,
    source: str,
    dims: tuple[int, int, int],
    heads: int,
) -> None:
    cap = None if capability == "none" else (int(capability[0:-2]), int(capability[-1]))
    gpu(device, cap)  # the probe sees this GPU: a real pod, recorded by the service
    result = select_backend(
        CONFIGS / config,
        cluster=CLUSTER,
        packages=packages,
        node="gpu-node-1",
        pod=f"pod-{config}",
        urls=[agent_service.url],
        token=agent_service.token,
        cache_dir=cache_dir,
        build=False,  # no CUDA here to build on
    )
    assert (result.backend.value, result.source) == (backend, source)
    assert result.decision_id and result.service_url == agent_service.url
    assert result.kernel is None and not result.pretend

    # The service saw the pod as described, and decided as the local engine would.
    with agent_service.client() as client:
        seen = client.get(f"/v1/selections/{result.decision_id}").json()
    model = seen["model"]
    assert (model["qk_nope_head_dim"], model["qk_rope_head_dim"], model["v_head_dim"]) == dims
    assert model["num_heads"] == heads
    assert seen["device"]["name"] == device
    expected_cap = None if capability == "none" else [int(p) for p in capability.split(".")]
    assert seen["device"]["capability"] == expected_cap
    assert (seen["node"], seen["pod"], seen["dtype"]) == ("gpu-node-1", f"pod-{config}", "bfloat16")
    local = decide_locally(result.request)
    assert isinstance(local, Decision)
    assert local.backend == result.backend
    assert list(local.candidates) == result.candidates


def test_second_boot_revalidates_with_etag(agent_service: Any, cache_dir: Path, gpu: Any) -> None:
    gpu("NVIDIA H200", (9, 0))
    kwargs: dict[str, Any] = dict(
        cluster=CLUSTER, packages="any", build=False,
        urls=[agent_service.url], token=agent_service.token, cache_dir=cache_dir,
    )  # fmt: skip
    first = select_backend(CONFIGS / "deepseek-v3.json", pod="r1-0", **kwargs)
    assert not first.revalidated
    entry, problem = AnswerCache(cache_dir).load(first.request)
    assert problem is None and entry is not None and entry.etag
    # A restarted pod (new name, same situation) finds the answer and gets a 304.
    second = select_backend(CONFIGS / "deepseek-v3.json", pod="r1-0-restarted", **kwargs)
    assert second.revalidated
    assert (second.backend, second.source) == (first.backend, first.source)
    assert second.decision_id and second.decision_id != first.decision_id
    assert second.candidates == first.candidates


def test_a_pretend_gpu_is_a_dry_run(agent_service: Any, cache_dir: Path) -> None:
    """``capability``/``device_name`` describe another GPU than this machine's: the
    service answers and records nothing, so the fleet never counts a laptop."""
    result = select_backend(
        CONFIGS / "deepseek-v3.json", cluster="agent-dry", capability="10.0",
        device_name="NVIDIA B200", packages="any", pod="laptop",
        urls=[agent_service.url], token=agent_service.token, cache_dir=cache_dir,
    )  # fmt: skip
    assert (result.backend.value, result.source) == ("TRTLLM_RAGGED", "priority")
    assert result.service_url == agent_service.url and result.pretend
    assert result.decision_id is None and result.kernel is None
    with agent_service.client() as client:
        listed = client.get("/v1/selections", params={"cluster": "agent-dry"}).json()
    assert listed["items"] == []


def test_strict_invalid_request_is_refused(agent_service: Any, cache_dir: Path) -> None:
    # GLM-5's head dims (256, 256) are not among those FlashInfer's CUTLASS kernel (10.x) takes
    with pytest.raises(NoBackendError, match="strict is true") as err:
        select_backend(
            CONFIGS / "glm-5",
            cluster=CLUSTER,
            capability="10.0",
            packages="any",
            requested_backend="flashinfer",
            strict=True,
            urls=[agent_service.url],
            token=agent_service.token,
            cache_dir=cache_dir,
        )
    assert err.value.kind == "requested_invalid"
    assert any(c.backend == "FLASHINFER" and not c.valid for c in err.value.candidates)


def test_real_pod_on_this_machine_builds_the_kernel(agent_service: Any, cache_dir: Path) -> None:
    """No pretending: torch's probe (no GPU here), real packages, the kernel built and
    checked against the reference."""
    result = select_backend(
        CONFIGS / "deepseek-v2-lite.json",
        cluster=CLUSTER,
        urls=[agent_service.url],
        token=agent_service.token,
        cache_dir=cache_dir,
        check=True,
    )
    assert result.request.device.capability is None
    assert result.request.packages is not None and "torch" in result.request.packages
    assert (result.backend.value, result.source) == ("TORCH_SDPA", "fallback")
    assert result.kernel is not None and result.kernel.impl == "torch-fp32-reference"
    assert result.kernel.num_heads == 16 and result.build_failures == []
