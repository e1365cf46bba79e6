"""Building the chosen kernel: fallback order, failure reports to the real service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from mla_switchboard.agent import KernelBuildError, select_backend
from mla_switchboard.agent import pod as agent_pod
from mla_switchboard.agent.client import report_failure
from mla_switchboard.agent.instantiate import KernelShape, build_kernel, build_order
from mla_switchboard.agent.notes import Notes
from mla_switchboard.agent.probe import DeviceProbe
from mla_switchboard.core.schemas import Candidate
from mla_switchboard.core.specs import Backend, Dtype

CONFIGS = Path(__file__).resolve().parent / "configs"
SHAPE = KernelShape(
    num_heads=4,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    softmax_scale=192**-0.5,
    dtype=Dtype.BFLOAT16,
    device="cpu",
)


def _candidate(backend: Backend, valid: bool) -> Candidate:
    return Candidate(backend=backend, valid=valid, reasons=[] if valid else ["no"], role="priority")


def test_build_order_follows_the_decision_then_torch_sdpa() -> None:
    candidates = [
        _candidate(Backend.TRTLLM_RAGGED, False),
        _candidate(Backend.FLASHINFER, True),
        _candidate(Backend.CUDNN, True),
        _candidate(Backend.FLASH_ATTN, True),
    ]
    assert build_order(Backend.CUDNN, candidates) == [
        Backend.CUDNN,
        Backend.FLASHINFER,
        Backend.FLASH_ATTN,
        Backend.TORCH_SDPA,
    ]


def test_a_backend_that_does_not_build_falls_back_and_is_reported(
    agent_service: Any, gpu: Any
) -> None:
    """FLASH_ATTN cannot build on this CPU machine: the failure reaches the service and
    TORCH_SDPA, the next valid candidate, is built instead. (The probe sees an H200: a
    real pod, whose decision the service recorded.)"""
    gpu("NVIDIA H200", (9, 0))
    decision = select_backend(
        CONFIGS / "deepseek-v2-lite.json",
        cluster="agent-build",
        packages="any",
        urls=[agent_service.url],
        token=agent_service.token,
        use_cache=False,
        build=False,
    )
    assert decision.backend is Backend.FLASH_ATTN and decision.decision_id
    reported: list[tuple[Backend, str | None]] = []

    def on_failure(backend: Backend, error: str) -> None:
        outcome = report_failure(
            decision.decision_id or "",
            backend.value,
            error,
            urls=[agent_service.url],
            token=agent_service.token,
        )
        reported.append((backend, outcome))

    notes = Notes()
    outcome = build_kernel(
        build_order(decision.backend, decision.candidates),
        SHAPE,
        notes=notes,
        check=True,
        on_failure=on_failure,
    )
    assert outcome.backend is Backend.TORCH_SDPA and outcome.kernel.impl == "torch-fp32-reference"
    assert [b for b, _ in outcome.failures] == [Backend.FLASH_ATTN]
    assert "no CUDA device" in outcome.failures[0][1]
    assert reported == [(Backend.FLASH_ATTN, None)]  # None: recorded
    assert any("FLASH_ATTN did not build" in n for n in notes)
    with agent_service.client() as client:
        detail = client.get(f"/v1/selections/{decision.decision_id}").json()
    assert [f["backend"] for f in detail["failures"]] == ["FLASH_ATTN"]
    assert "no CUDA device" in detail["failures"][0]["error"]


def test_when_nothing_builds_every_failure_is_reported(
    agent_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod whose GPU the probe sees but CUDA cannot use (e.g. a CPU-only torch next to
    the driver): the decision names FLASH_ATTN, nothing builds on "cuda", and the agent
    says so instead of handing back a kernel that is not there."""
    monkeypatch.setattr(
        agent_pod, "probe_device", lambda: DeviceProbe("NVIDIA H200", (9, 0), "nvml")
    )
    with pytest.raises(KernelBuildError, match="no MLA prefill kernel builds") as err:
        select_backend(
            CONFIGS / "kimi-k2.json",
            cluster="agent-build",
            urls=[agent_service.url],
            token=agent_service.token,
            use_cache=False,
        )
    assert [b for b, _ in err.value.failures] == ["FLASH_ATTN", "TORCH_SDPA"]
    listing = httpx.get(
        agent_service.url + "/v1/selections",
        params={"cluster": "agent-build", "limit": 1},
        headers={"Authorization": f"Bearer {agent_service.token}"},
    ).json()
    decision_id = listing["items"][0]["decision_id"]
    with agent_service.client() as client:
        detail = client.get(f"/v1/selections/{decision_id}").json()
    assert sorted(f["backend"] for f in detail["failures"]) == ["FLASH_ATTN", "TORCH_SDPA"]


def test_report_failure_is_best_effort(closed_url: str, hanging_server: Any) -> None:
    assert report_failure("x", "CUDNN", "boom", urls=[], token=None) == "no service URL configured"
    assert "ConnectError" in (
        report_failure("x", "CUDNN", "boom", urls=[closed_url], token=None) or ""
    )
    outcome = report_failure(
        "x", "CUDNN", "boom", urls=[hanging_server.url], token=None, timeout_s=0.3
    )
    assert outcome is not None
