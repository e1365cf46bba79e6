"""The select cache follows evidence per situation: a report never empties it.

Evidence arrives with every benchmark report, and most decisions never read it (only
policy ``measured`` does, and then only its own situation). The cache keeps every
decision that did not read the evidence that changed, decides again exactly those
that did, and starts over when an index is replaced or evidence expires (the
generation)."""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta

import pytest
from mla_switchboard.core.evaluator import DecisionInputs, decision_key
from mla_switchboard.core.evidence import (
    EvidenceIndex,
    FailurePolicy,
    Observation,
    Situation,
    packages_key,
)
from mla_switchboard.core.schemas import SEED_RULES, Override, SelectRequest
from mla_switchboard.service.evidence.trust import TrustedEvidence
from mla_switchboard.service.selector import Rendered, Selector

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PACKAGES = {"torch": "2.11.0", "flashinfer": "0.7.2", "cudnn": "1.32.0", "flash_attn": "2.8.3"}
R1 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
KEY = packages_key(PACKAGES)
H200 = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", KEY, "switchboard")
H100 = Situation("NVIDIA H100", "9.0", "128,64,128", "bfloat16", KEY, "switchboard")


def override(cluster: str) -> Override:
    return Override.model_validate(
        {
            "cluster": cluster,
            "policy": "measured",
            "note": "t",
            "created_at": NOW - timedelta(days=1),
            "created_by": "t",
            "revision": 1,
        }
    )


def request(cluster: str, device: str = "NVIDIA H200", pod: str = "p") -> SelectRequest:
    return SelectRequest.model_validate(
        {
            "cluster": cluster,
            "pod": pod,
            "device": {"name": device, "capability": [9, 0]},
            "model": R1,
            "dtype": "bfloat16",
            "packages": PACKAGES,
        }
    )


def ok(situation: Situation, backend: str, pod: str, tflops: float) -> Observation:
    return Observation(situation, backend, pod, tflops, ok=True, cluster="m", at=NOW)


class Service:
    """What the runtime does, small: trusted indexes, inputs published on change."""

    def __init__(self) -> None:
        def index() -> EvidenceIndex:
            return EvidenceIndex(
                min_samples=2, min_pods=2, failure_policy=FailurePolicy(min_pods=1)
            )

        self.trusted = TrustedEvidence(index)
        self.overrides = (override("m"),)
        self.version = 0
        self.now = NOW
        self.selector = Selector(clock=lambda: self.now, inputs_for=self.trusted.inputs_for)
        self.publish()

    def publish(self) -> None:
        self.version += 1
        self.inputs = DecisionInputs(
            rules=SEED_RULES,
            overrides=self.overrides,
            evidence=self.trusted.all,
            tag=(1, self.version),
            evidence_generation=self.trusted.generation,
        )

    def add(self, *observations: Observation) -> None:
        assert self.trusted.add(observations)
        self.publish()

    def backend(self, req: SelectRequest) -> str:
        result = self.selector.select(req, self.inputs)
        assert isinstance(result, Rendered)
        return result.backend


@pytest.fixture
def svc() -> Service:
    s = Service()
    s.add(ok(H200, "CUDNN", "seed", 1.0))  # cluster m has an index from here on
    return s


def test_decisions_that_read_no_evidence_outlive_every_report(svc: Service) -> None:
    priority = request("p")  # no override: policy priority, evidence never read
    first = svc.backend(priority)
    decided = svc.selector.decided
    for i in range(20):
        svc.add(ok(H200, "FLASH_ATTN", f"pod-{i}", 900.0 + i))
    assert svc.backend(priority) == first
    assert svc.selector.decided == decided  # every one a cache hit


def test_a_measured_decision_follows_its_own_situations_evidence(svc: Service) -> None:
    measured = request("m")
    before = svc.backend(measured)
    assert before == "FLASH_ATTN"  # the seed order on 9.0, evidence too thin
    svc.add(ok(H200, "FLASHINFER", "a", 900.0), ok(H200, "FLASHINFER", "b", 910.0))
    assert svc.backend(measured) == "FLASHINFER"  # decided again, with the evidence
    decided = svc.selector.decided
    assert svc.backend(request("m", pod="another")) == "FLASHINFER"
    assert svc.selector.decided == decided  # and kept while nothing changes


def test_other_situations_evidence_keeps_a_measured_decision(svc: Service) -> None:
    measured = request("m")
    svc.backend(measured)
    decided = svc.selector.decided
    for i in range(10):
        svc.add(ok(H100, "FLASH_ATTN", f"h100-{i}", 700.0))
    svc.backend(measured)
    assert svc.selector.decided == decided


def test_a_replaced_index_empties_the_cache(svc: Service) -> None:
    priority = request("p")
    svc.backend(priority)
    decided = svc.selector.decided
    fresh = svc.trusted.fresh()
    fresh.add([ok(H200, "FLASHINFER", "a", 900.0), ok(H200, "FLASHINFER", "b", 900.0)])
    svc.trusted.swap(fresh)  # a full reload
    svc.publish()
    assert svc.backend(request("m")) == "FLASHINFER"
    svc.backend(priority)
    assert svc.selector.decided == decided + 2


def test_a_new_clusters_first_report_reaches_its_cached_decisions() -> None:
    """A cluster without evidence is decided on a shared empty index; its first report
    makes an index of its own, which no per-situation stamp could notice."""
    svc = Service()
    measured = request("m")
    assert svc.backend(measured) == "FLASH_ATTN"
    svc.add(ok(H200, "FLASHINFER", "a", 900.0), ok(H200, "FLASHINFER", "b", 910.0))
    assert svc.backend(measured) == "FLASHINFER"


def test_an_exclusion_that_lapses_is_seen(svc: Service) -> None:
    measured = request("m")
    failed = Observation(
        H200, "FLASH_ATTN", "f", None, ok=False, cluster="m", at=NOW - timedelta(hours=23)
    )
    svc.add(failed)
    result = svc.selector.select(measured, svc.inputs)
    assert isinstance(result, Rendered)
    excluded = next(c for c in result.decision.candidates if c.backend.value == "FLASH_ATTN")
    assert not excluded.valid and result.backend != "FLASH_ATTN"
    # two hours on the failure has left the policy's 24 h window: the prune says so
    svc.now = NOW + timedelta(hours=2)
    assert svc.trusted.prune(svc.now, timedelta(days=30))
    svc.publish()
    result = svc.selector.select(measured, svc.inputs)
    assert isinstance(result, Rendered)
    assert result.backend == "FLASH_ATTN"


def staged(cluster: str, percent: int = 20) -> Override:
    return Override.model_validate(
        {
            "cluster": cluster,
            "force": "FLASHINFER",
            "note": "canary",
            "rollout": {"id": f"r-{cluster}", "percent": percent, "state": "active"},
            "created_at": NOW - timedelta(days=1),
            "created_by": "t",
            "revision": 1,
        }
    )


def test_only_the_fleets_and_the_pods_own_rollouts_are_in_its_key() -> None:
    inputs = DecisionInputs(
        rules=SEED_RULES,
        overrides=(staged("*"), staged("a"), staged("b"), staged("c", percent=100)),
    )
    assert [o.cluster for o in inputs.staged_for("a")] == ["*", "a"]
    assert [o.cluster for o in inputs.staged_for("z")] == ["*"]
    assert [o.cluster for o in inputs.staged_for("c")] == ["*"]  # 100 %: no stage
    # another cluster's rollout never splits this cluster's decisions
    key = decision_key(request("a", pod="p1"), inputs.overrides)
    assert len(key[-1]) == 2
    assert decision_key(request("a", pod="p1"), inputs.staged_for("a")) == key


def _hit_cost(overrides: tuple[Override, ...], n: int = 3000) -> float:
    """Thread CPU seconds of ``n`` selects answered from the cache."""
    selector = Selector(clock=lambda: NOW)
    inputs = DecisionInputs(rules=SEED_RULES, overrides=overrides, tag=(1, 1))
    requests = [request("cluster-0005", pod=f"p{i}") for i in range(n)]
    for r in requests[:50]:
        selector.select(r, inputs)  # the two stage keys of this cluster are cached
    began = time.thread_time()
    for r in requests:
        selector.select(r, inputs)
    return time.thread_time() - began


@pytest.mark.serial
def test_a_select_costs_the_same_whatever_other_clusters_roll_out() -> None:
    """A fleet with a staged override per cluster: a pod's select reads its own
    cluster's and the fleet's, so 100x the clusters with rollouts costs the same."""
    few = tuple(staged(f"cluster-{i:04d}") for i in range(10))
    many = tuple(staged(f"cluster-{i:04d}") for i in range(1000))
    runs = [(_hit_cost(few), _hit_cost(many)) for _ in range(5)]
    small = statistics.median(a for a, _ in runs)
    large = statistics.median(b for _, b in runs)
    assert large < 1.5 * small, (small, large, runs)
