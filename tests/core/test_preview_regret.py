"""The preview and the regret as unit tables: the same evaluator and inputs as /v1/select."""

from __future__ import annotations

from dataclasses import replace

import pytest
from mla_switchboard.core.evaluator import Decision, DecisionInputs, assess, decide
from mla_switchboard.core.evidence import EvidenceIndex, Observation, situation_of
from mla_switchboard.core.schemas import SEED_RULES, SelectRequest
from mla_switchboard.service.fleet.groups import DecisionMemo, FleetSnapshot
from mla_switchboard.service.fleet.preview import replay, with_override
from mla_switchboard.service.fleet.regret import (
    cluster_exclusions,
    cluster_regret,
    regret_by_cluster,
)
from mla_switchboard.service.state import PodState

from tests.core.conftest import NOW, override, request

H200 = request((9, 0), device="NVIDIA H200")


def fleet(n: int, req: SelectRequest, cluster: str, inputs: DecisionInputs) -> list[PodState]:
    """Pods as the store lists them: each with the answer the inputs gave it."""
    pods = []
    for i in range(n):
        r = req.model_copy(update={"cluster": cluster, "pod": f"{cluster}-{i}"})
        d = decide(r, inputs, now=NOW)
        assert isinstance(d, Decision)
        pods.append(
            PodState(
                cluster,
                "node",
                r.pod or "",
                f"id{i}",
                d.backend.value,
                d.source,
                r.model_dump_json(),
            )
        )
    return pods


def evidence(**tflops: float) -> EvidenceIndex:
    situation = situation_of(H200)
    assert situation is not None
    return EvidenceIndex(
        [
            Observation(situation, b, f"bench-{i % 2}", t, ok=True, cluster="bench", at=NOW)
            for b, t in tflops.items()
            for i in range(3)
        ]
    )


def test_preview_of_a_measured_policy_sees_the_evidence() -> None:
    """Issue 11, reproduction 2: the preview used to report 0 pods changed."""
    current = DecisionInputs(SEED_RULES, (), evidence(FLASHINFER=600, FLASH_ATTN=200))
    pods = fleet(58, H200, "prod-west", current)
    proposed = replace(
        current,
        overrides=tuple(with_override(current.overrides, "*", override("*", policy="measured"))),
    )
    p = replay(FleetSnapshot.of_pods(pods), current, proposed, now=NOW)
    assert (p.pods_total, p.pods_changed, p.pods_pending) == (58, 58, 0)
    (change,) = p.model_dump()["changes"]
    assert (change["cluster"], change["from"], change["to"], change["pods"]) == (
        "prod-west",
        "FLASH_ATTN",
        "FLASHINFER",
        58,
    )
    assert change["reasons"] == [
        {
            "pods": 58,
            "why": [
                "Using FLASHINFER: fastest correct backend measured for this device, dims, "
                "dtype and engine (600 TFLOP/s median over 3 samples from 2 pods)."
            ],
            "exclusions": {},  # no reason here is an exclusion by failures
        }
    ]


def test_preview_counts_refusals_and_pending_pods_apart() -> None:
    current = DecisionInputs(SEED_RULES)
    pods = fleet(
        4, request((10, 0), requested_backend="TRTLLM_RAGGED", strict=True), "east", current
    )
    pods += [
        replace(fleet(1, H200, "east", current)[0], backend="CUDNN")
    ]  # booted under older rules
    proposed = replace(current, overrides=(override("east", deny=["TRTLLM_RAGGED"]),))
    p = replay(FleetSnapshot.of_pods(pods), current, proposed, now=NOW)
    assert (p.pods_invalid, p.pods_changed, p.pods_pending) == (4, 0, 1)
    assert "denied by override east" in p.invalid[0].reason


def test_regret_against_the_best_valid_measured_backend() -> None:
    inputs = DecisionInputs(SEED_RULES, (), evidence(FLASHINFER=600, FLASH_ATTN=200, CUDNN=400))
    pods = fleet(3, H200, "west", inputs)  # priority: FLASH_ATTN
    r = regret_by_cluster(FleetSnapshot.of_pods(pods), inputs, now=NOW)["west"]
    assert (r["pods_measured"], r["pods_on_best"], r["best_alternatives"]) == (
        3,
        0,
        {"FLASHINFER": 3},
    )
    assert r["throughput_lost_pct"] == pytest.approx(100 * (1 - 200 / 600), abs=0.01)
    denied = replace(inputs, overrides=(override("west", deny=["FLASHINFER"]),))
    r = regret_by_cluster(FleetSnapshot.of_pods(pods), denied, now=NOW)["west"]
    assert r["best_alternatives"] == {"CUDNN": 3}  # what this pod may run, not the fastest


def test_regret_skips_backends_failure_evidence_excludes() -> None:
    situation = situation_of(H200)
    assert situation is not None
    failed = Observation(
        situation,
        "FLASHINFER",
        "pod-x",
        None,
        ok=False,
        cluster="staging",
        at=NOW,
        error="segfault",
    )
    ev = evidence(FLASHINFER=600, FLASH_ATTN=200).with_observations(
        [failed, replace(failed, pod="pod-y")]
    )
    inputs = DecisionInputs(SEED_RULES, (override("*", policy="measured"),), ev)
    pods = fleet(2, H200, "west", inputs)
    assert {p.backend for p in pods} == {"FLASH_ATTN"}
    r = regret_by_cluster(FleetSnapshot.of_pods(pods), inputs, now=NOW)["west"]
    assert (r["pods_on_best"], r["throughput_lost_pct"]) == (2, 0.0)


def test_evidence_too_thin_to_rank_measures_no_pod_and_assesses_none() -> None:
    situation = situation_of(H200)
    assert situation is not None
    thin = EvidenceIndex(  # one pod's samples: under min_pods (2) for every backend
        [
            Observation(situation, b, "bench-0", t, ok=True, cluster="bench", at=NOW)
            for b, t in (("FLASHINFER", 600.0), ("FLASH_ATTN", 200.0))
            for _ in range(3)
        ]
    )
    inputs = DecisionInputs(SEED_RULES, (), thin)
    pods = fleet(3, H200, "west", inputs)
    memo = DecisionMemo(NOW)
    r = cluster_regret(FleetSnapshot.of_pods(pods).groups, inputs, now=NOW, memo=memo)
    assert (r["pods"], r["pods_measured"], r["pods_on_best"]) == (3, 0, 0)
    assert r["throughput_lost_pct"] == 0.0 and r["best_alternatives"] == {}
    assert memo.made == 0  # nothing could be ranked: no assessment was needed

    enough = DecisionInputs(SEED_RULES, (), evidence(FLASHINFER=600, FLASH_ATTN=200))
    memo = DecisionMemo(NOW)
    r = cluster_regret(FleetSnapshot.of_pods(pods).groups, enough, now=NOW, memo=memo)
    assert r["pods_measured"] == 3 and memo.made > 0


def test_exclusions_are_the_assessments_and_need_none_without_failures() -> None:
    situation = situation_of(H200)
    assert situation is not None
    failed = Observation(
        situation, "FLASHINFER", "pod-x", None, ok=False, cluster="staging", at=NOW, error="oops"
    )
    measured = (override("*", policy="measured"),)
    ev = evidence(FLASHINFER=600, FLASH_ATTN=200).with_observations(
        [failed, replace(failed, pod="pod-y")]
    )
    inputs = DecisionInputs(SEED_RULES, measured, ev)
    pods = fleet(2, H200, "west", inputs)
    groups = FleetSnapshot.of_pods(pods).groups
    found = cluster_exclusions(groups, inputs, now=NOW)
    request = pods[0].request  # what a pod of the group asks
    assert request is not None
    assessed = assess(request, inputs, NOW)
    assert found == {b.value: why for b, why in assessed.exclusions.items()}
    assert set(found) == {"FLASHINFER"}

    quiet = DecisionInputs(SEED_RULES, measured, evidence(FLASHINFER=600, FLASH_ATTN=200))
    memo = DecisionMemo(NOW)
    assert cluster_exclusions(groups, quiet, now=NOW, memo=memo) == {}
    assert memo.made == 0  # no failure in the situation: nothing assessed
