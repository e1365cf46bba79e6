"""Evidence ranking, the failure policy and the decision key, directly."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from mla_switchboard.core.evaluator import Decision, DecisionInputs, decide, decision_key
from mla_switchboard.core.evidence import (
    EvidenceIndex,
    FailurePolicy,
    Observation,
    failure_observation,
    situation_of,
)
from mla_switchboard.core.schemas import SEED_RULES, SelectRequest
from mla_switchboard.core.specs import Backend

from tests.core.conftest import NOW, override, request

H200 = request((9, 0), device="NVIDIA H200")
MEASURED = (override("*", policy="measured"),)


def measured(
    backend: str, tflops: float, pods: int = 2, samples: int = 3, req=H200
) -> list[Observation]:  # type: ignore[no-untyped-def]
    situation = situation_of(req)
    assert situation is not None
    return [
        Observation(
            situation, backend, f"bench-{i % pods}", tflops, ok=True, cluster="bench", at=NOW
        )
        for i in range(samples)
    ]


def failed(
    backend: str, pod: str, at=NOW, req=H200, cluster: str = "staging", error: str = "boom\nstack"
) -> Observation:  # type: ignore[no-untyped-def]
    situation = situation_of(req)
    assert situation is not None
    return Observation(situation, backend, pod, None, ok=False, cluster=cluster, at=at, error=error)


def test_ranking_needs_enough_samples_and_pods() -> None:
    index = EvidenceIndex(measured("FLASHINFER", 600, pods=1) + measured("CUDNN", 400))
    ev = index.rank(situation_of(H200), [Backend.FLASHINFER, Backend.CUDNN])
    assert ev is not None and ev.backend is Backend.CUDNN  # FLASHINFER: one pod only
    assert index.rank(situation_of(H200), [Backend.FLASHINFER]) is None


def test_ranking_is_fastest_first_with_runner_up_and_margin() -> None:
    index = EvidenceIndex(measured("FLASHINFER", 600) + measured("CUDNN", 400))
    ev = index.rank(situation_of(H200), list(Backend))
    assert ev is not None
    assert (ev.backend, ev.runner_up, ev.margin) == (Backend.FLASHINFER, Backend.CUDNN, 0.5)


def test_with_observations_leaves_the_old_index_unchanged() -> None:
    old = EvidenceIndex(measured("CUDNN", 400))
    new = old.with_observations(measured("FLASHINFER", 600))
    assert old.rank(situation_of(H200), list(Backend)).backend is Backend.CUDNN  # type: ignore[union-attr]
    assert new.rank(situation_of(H200), list(Backend)).backend is Backend.FLASHINFER  # type: ignore[union-attr]


def test_evidence_is_per_device_name_and_engine() -> None:
    index = EvidenceIndex(measured("FLASHINFER", 600) + measured("FLASH_ATTN", 200))
    h100 = request((9, 0), device="NVIDIA H100")
    vllm_h200 = request((9, 0), device="NVIDIA H200", engine=("vllm", "0.33.0"))
    assert index.rank(situation_of(h100), list(Backend)) is None
    assert index.rank(situation_of(vllm_h200), list(Backend)) is None


class TestFailurePolicy:
    def test_two_pods_exclude_by_default_and_say_who_when_and_what(self) -> None:
        index = EvidenceIndex(
            measured("FLASHINFER", 600)
            + measured("FLASH_ATTN", 200)
            + [failed("FLASHINFER", "pod-a"), failed("FLASHINFER", "pod-b")]
        )
        result = decide(H200, DecisionInputs(SEED_RULES, MEASURED, index), now=NOW)
        assert isinstance(result, Decision) and result.backend is Backend.FLASH_ATTN
        fi = next(c for c in result.candidates if c.backend is Backend.FLASHINFER)
        assert not fi.valid
        assert fi.reasons == [
            "failed on 2 pods in the last 24 h (measured policy): "
            "staging/pod-a 2026-11-30 12:00 UTC: boom; staging/pod-b 2026-11-30 12:00 UTC: boom"
        ]

    def test_failures_expire_with_the_window(self) -> None:
        index = EvidenceIndex(
            [
                *measured("FLASHINFER", 600),
                failed("FLASHINFER", "pod-a", at=NOW - timedelta(hours=25)),
            ]
        )
        result = decide(H200, DecisionInputs(SEED_RULES, MEASURED, index), now=NOW)
        assert isinstance(result, Decision) and result.backend is Backend.FLASHINFER

    def test_a_two_pod_policy_needs_two_pods(self) -> None:
        policy = FailurePolicy(min_pods=2, window=timedelta(hours=6))
        one = [
            failed("FLASHINFER", "pod-a"),
            failed("FLASHINFER", "pod-a", at=NOW - timedelta(hours=1)),
        ]
        index = EvidenceIndex(measured("FLASHINFER", 600) + one, failure_policy=policy)
        assert index.exclusions(situation_of(H200), NOW) == {}
        index = index.with_observations([failed("FLASHINFER", "pod-b", cluster="prod-west")])
        reason = index.exclusions(situation_of(H200), NOW)[Backend.FLASHINFER]
        assert reason.startswith("failed on 2 pods in the last 6 h")
        assert "prod-west/pod-b" in reason and "staging/pod-a" in reason

    def test_failures_count_only_for_their_situation(self) -> None:
        other = request(
            (9, 0), device="NVIDIA H200", packages={"torch": "2.11.0", "flashinfer": "0.6.0"}
        )
        index = EvidenceIndex(
            measured("FLASHINFER", 600)
            + measured("FLASH_ATTN", 200)
            + [failed("FLASHINFER", "pod-a", req=other)]
        )
        result = decide(H200, DecisionInputs(SEED_RULES, MEASURED, index), now=NOW)
        assert isinstance(result, Decision) and result.backend is Backend.FLASHINFER

    def test_failures_do_not_touch_the_priority_policy(self) -> None:
        index = EvidenceIndex([failed("FLASH_ATTN", "pod-a")])
        result = decide(H200, DecisionInputs(SEED_RULES, (), index), now=NOW)
        assert isinstance(result, Decision) and result.backend is Backend.FLASH_ATTN
        assert all(not c.reasons for c in result.candidates if c.backend is Backend.FLASH_ATTN)

    def test_failure_observation_keeps_cluster_and_error(self) -> None:
        obs = failure_observation(H200, "FLASHINFER", "ImportError: x", NOW, "pod-z")
        assert obs is not None and (obs.cluster, obs.pod, obs.error) == (
            "prod-east",
            "pod-z",
            "ImportError: x",
        )


# ---------------------------------------------------------------- the decision key

IGNORED = {"node", "pod"}  # they name the pod; the evaluator never reads them
VARIANTS: dict[str, Any] = {
    "cluster": "prod-west",
    "device.name": "NVIDIA H100",
    "device.capability": [10, 0],
    "model.name": "moonshotai/Kimi-K2",
    "model.qk_nope_head_dim": 192,
    "model.qk_rope_head_dim": 0,
    "model.v_head_dim": 256,
    "model.num_heads": 64,
    "dtype": "float16",
    "packages": {"torch": "2.11.0"},
    "requested_backend": "CUDNN",
    "strict": True,
    "engine.name": "sglang",
    "engine.version": "0.34.0",
}


def _leaves(model: type, prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        sub = field.annotation
        nested = [a for a in getattr(sub, "__args__", (sub,)) if hasattr(a, "model_fields")]
        if nested:
            out.extend(_leaves(nested[0], prefix + name + "."))
        else:
            out.append(prefix + name)
    return out


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    copy = dict(body)
    copy[head] = value if not rest else _with(dict(copy.get(head) or {"name": "vllm"}), rest, value)
    return copy


@pytest.mark.parametrize("path", sorted(set(_leaves(SelectRequest)) - IGNORED))
def test_every_field_the_evaluator_reads_is_in_the_key(path: str) -> None:
    """Enumerates the request schema: a new field must get a variant here and a place
    in decision_key, or this fails."""
    assert path in VARIANTS, f"new request field {path}: add it to decision_key and VARIANTS"
    base = request((9, 0), engine=("vllm", "0.33.0")).model_dump(mode="json")
    changed = SelectRequest.model_validate(_with(base, path, VARIANTS[path]))
    assert decision_key(changed) != decision_key(SelectRequest.model_validate(base))


def test_node_and_pod_change_neither_key_nor_answer() -> None:
    a, b = request((9, 0), pod="a"), request((9, 0), pod="b", node="n2")
    assert decision_key(a) == decision_key(b)
    inputs = DecisionInputs(SEED_RULES, MEASURED, EvidenceIndex(measured("FLASHINFER", 600)))
    assert decide(a, inputs, now=NOW) == decide(b, inputs, now=NOW)
