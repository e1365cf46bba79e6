"""A filled fleet for the console's layout tests and the README's screenshots: pods as
they boot (``POST /v1/select``), a long GPU name, an engine, a staged rollout, a plain
override and measured evidence on a few of a cluster's pods. One place, so the pictures
in ``docs/images/`` show what the tests checked (``scripts/screenshots.py`` uses it)."""

from __future__ import annotations

from typing import Any

from tests.browser.test_console import VLLM, boot, east, west
from tests.browser.test_dashboard_browser import ALL, body
from tests.served import Server

LONG_GPU = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
RTX_PODS = 12
MIXED_H200 = 4  # the measured share of cluster "mixed"
MIXED_B200 = 40
STAGED = {
    "force": "FLASHINFER",
    "note": "INC-4711: FlashInfer on prod-east, staged",
    "rollout": {"percent": 20, "max_failures": 3, "steps": [20, 50, 100], "step_every": "1h"},
}
FORCED = {"force": "FLASH_ATTN", "note": "pin prod-west while vLLM 0.33 settles"}


def rtx(i: int) -> dict[str, Any]:
    b = body("edge-rtx", f"rtx-node-{i % 3}", f"deepseek-r1-prefill-7f9c8d6b5-{i:05d}", [12, 0])
    b["device"]["name"] = LONG_GPU
    b["engine"] = VLLM
    return b


def measurement(pod: str) -> dict[str, Any]:
    return {
        "cluster": "mixed",
        "pod": pod,
        "device": {"name": "NVIDIA H200", "capability": [9, 0]},
        "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                  "num_heads": 128},
        "dtype": "bfloat16",
        "packages": ALL,
        "results": [
            {"backend": b, "shape": {"seqlens": [4096], "num_heads": 128}, "median_ms": 1.0,
             "tflops": t, "correct": True}
            for b, t in {"FLASHINFER": 600.0, "FLASH_ATTN": 200.0}.items()
        ],
    }  # fmt: skip


def fill_fleet(service: Server) -> int:
    """Boot the fleet and write its overrides; the number of pods."""
    bodies = [rtx(i) for i in range(RTX_PODS)]
    bodies += [east(i) for i in range(1000)] + [west(i) for i in range(40)]
    bodies += [body("mixed", "m-h", f"h-{i}", [9, 0]) for i in range(MIXED_H200)]
    bodies += [body("mixed", "m-b", f"b-{i:02d}", [10, 0]) for i in range(MIXED_B200)]
    boot(service, bodies)
    with service.client() as api:
        for i in (0, 1, 0, 1):  # two H200 pods bench twice: trusted evidence for their kind
            r = api.post("/v1/measurements", json=measurement(f"h-{i}"))
            assert r.status_code == 201, r.text
        for scope, spec in (("prod-east", STAGED), ("prod-west", FORCED)):
            r = api.put(f"/v1/overrides/{scope}", json=spec)
            assert r.status_code in (200, 201), r.text
    return len(bodies)
