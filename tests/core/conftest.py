"""Builders for the core's unit tables: requests and inputs, no HTTP, no store."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core.schemas import Override, SelectRequest

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
R1 = (128, 64, 128)
KIMI = (192, 64, 256)
SMALL = (64, 64, 128)
GLM5 = (256, 0, 256)
BIG = (256, 64, 128)
ALL = {"torch": "2.11.0", "flashinfer": "0.7.2", "cudnn": "1.32.0", "flash_attn": "2.8.3"}


def request(
    cap: tuple[int, int] | None = (9, 0),
    dims: tuple[int, int, int] = R1,
    dtype: str = "bfloat16",
    packages: dict[str, str] | None = None,
    *,
    cluster: str = "prod-east",
    device: str = "NVIDIA H200",
    engine: tuple[str, str | None] | None = None,
    pod: str | None = "pod-0",
    model: str = "deepseek-ai/DeepSeek-R1",
    **extra: Any,
) -> SelectRequest:
    body: dict[str, Any] = {
        "cluster": cluster,
        "pod": pod,
        "device": {"name": device, "capability": None if cap is None else list(cap)},
        "model": {
            "name": model,
            "qk_nope_head_dim": dims[0],
            "qk_rope_head_dim": dims[1],
            "v_head_dim": dims[2],
            "num_heads": 16,
        },
        "dtype": dtype,
        "packages": ALL if packages is None else packages,
        **extra,
    }
    if engine is not None:
        body["engine"] = {"name": engine[0], "version": engine[1]}
    return SelectRequest.model_validate(body)


def override(cluster: str = "*", **spec: Any) -> Override:
    return Override.model_validate(
        {
            "cluster": cluster,
            "note": spec.pop("note", "test"),
            "created_at": NOW,
            "created_by": "test",
            "revision": 1,
            **spec,
        }
    )
