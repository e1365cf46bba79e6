"""Trust scopes' indexes: kept up to date report by report, built before a
configuration naming them is in force, and never built on the event loop."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.evidence import EvidenceIndex, Observation, Situation
from mla_switchboard.core.schemas import SEED_RULES, Override, SelectRequest
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.evidence.trust import TrustedEvidence, scopes_of

S = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", "{}", "switchboard")
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def ok(cluster: str, pod: str, tflops: float) -> Observation:
    return Observation(S, "FLASHINFER", pod, tflops, ok=True, cluster=cluster, at=NOW)


def override(cluster: str, trust: list[str] | None) -> Override:
    return Override.model_validate(
        {
            "cluster": cluster,
            "policy": "measured",
            "trust_clusters": trust,
            "note": "t",
            "created_at": NOW,
            "created_by": "t",
            "revision": 1,
        }
    )


def request(cluster: str) -> SelectRequest:
    return SelectRequest.model_validate(
        {
            "cluster": cluster,
            "pod": "p",
            "device": {"name": S.device, "capability": [9, 0]},
            "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
            "dtype": "bfloat16",
            "packages": {},
        }
    )


def samples(index: EvidenceIndex) -> list[float]:
    return sorted(t for _, _, t in index.samples(S, Backend.FLASHINFER))


def evidence_for(
    trusted: TrustedEvidence, cluster: str, overrides: tuple[Override, ...]
) -> list[float]:
    inputs = DecisionInputs(SEED_RULES, overrides)
    return samples(trusted.inputs_for(request(cluster), inputs, NOW).evidence)


def test_which_scopes_need_an_index_of_their_own() -> None:
    named = (
        override("a", ["bench-*"]),
        override("b", ["prod-east"]),  # one cluster by name: its own index
        override("c", ["*", "x"]),  # everything: the all-clusters index
        override("d", ["x", "y", "x"]),
        override("e", None),
    )
    assert scopes_of(named) == {("bench-*",), ("x", "y")}


def test_every_report_reaches_each_index_that_trusts_its_cluster() -> None:
    trusted = TrustedEvidence(EvidenceIndex)
    overrides = (override("prod-east", ["bench-*"]),)
    assert trusted.ensure_scopes(overrides)  # before the configuration is in force
    trusted.add([ok("bench-1", "b1", 500.0), ok("prod-east", "p1", 300.0)])
    trusted.add([ok("bench-2", "b2", 510.0), ok("prod-west", "w1", 100.0)])
    assert evidence_for(trusted, "prod-east", overrides) == [500.0, 510.0]
    assert evidence_for(trusted, "prod-east", ()) == [300.0]  # its own cluster by default
    assert evidence_for(trusted, "dev", ()) == []  # nothing reported there
    assert samples(trusted.all) == [100.0, 300.0, 500.0, 510.0]
    assert not trusted.ensure_scopes(overrides)  # already there: nothing built


def test_a_scope_built_later_starts_from_what_its_clusters_reported() -> None:
    trusted = TrustedEvidence(EvidenceIndex)
    trusted.add([ok("bench-1", "b1", 500.0), ok("prod-east", "p1", 300.0)])
    overrides = (override("*", ["bench-*", "prod-*"]),)
    trusted.ensure_scopes(overrides)
    assert evidence_for(trusted, "dev", overrides) == [300.0, 500.0]


def test_on_the_event_loop_a_missing_scope_is_empty_and_built_in_the_background() -> None:
    changes: list[int] = []
    trusted = TrustedEvidence(EvidenceIndex, on_change=lambda: changes.append(1))
    trusted.add([ok("bench-1", "b1", 500.0)])
    overrides = (override("prod-east", ["bench-*"]),)  # never published: a race

    async def decide_on_the_loop() -> list[float]:
        return evidence_for(trusted, "prod-east", overrides)

    assert asyncio.run(decide_on_the_loop()) == []
    deadline = time.monotonic() + 5
    while not changes:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert evidence_for(trusted, "prod-east", overrides) == [500.0]


def test_elsewhere_a_missing_scope_is_built_at_once() -> None:
    trusted = TrustedEvidence(EvidenceIndex)
    trusted.add([ok("bench-1", "b1", 500.0)])
    overrides = (override("prod-east", ["bench-?"]),)  # a preview of a new override
    assert evidence_for(trusted, "prod-east", overrides) == [500.0]


def test_a_rebuild_keeps_the_scopes_and_a_scope_named_meanwhile() -> None:
    trusted = TrustedEvidence(EvidenceIndex)
    trusted.ensure_scopes((override("a", ["bench-*"]),))
    fresh = trusted.fresh()
    trusted.ensure_scopes((override("a", ["bench-*"]), override("b", ["x-*", "y"])))
    fresh.add([ok("bench-1", "b1", 500.0), ok("x-1", "x1", 200.0)])
    trusted.swap(fresh)
    a, b = (override("a", ["bench-*"]),), (override("b", ["x-*", "y"]),)
    assert evidence_for(trusted, "a", a) == [500.0]
    assert evidence_for(trusted, "b", b) == [200.0]
