"""Staged overrides in the evaluator: who is in the stage, and what each pod is told."""

from __future__ import annotations

from mla_switchboard.core.causes import PodAt, SlowdownHalt
from mla_switchboard.core.evaluator import Decision, DecisionInputs, decide, decision_key, in_stage
from mla_switchboard.core.schemas import SEED_RULES, Override, OverrideSpec, rollout_id
from mla_switchboard.core.specs import Backend

from tests.core.conftest import NOW, override, request

PODS = [request((10, 0), cluster="prod-east", pod=f"r1-{i}") for i in range(1000)]


def staged(percent: int, state: str = "active", **spec) -> Override:  # type: ignore[no-untyped-def]
    body = {"force": "FLASHINFER", **spec}
    rid = rollout_id("prod-east", OverrideSpec.model_validate({**body, "note": "x"}))
    return override(
        "prod-east",
        **body,
        revision=12,
        rollout={"percent": percent, "id": rid, "state": state, "halted_reason": "boom"},
    )


def test_ten_percent_is_ten_percent_and_fifty_keeps_them_all() -> None:
    ten = {p.pod for p in PODS if in_stage(p, staged(10))}
    fifty = {p.pod for p in PODS if in_stage(p, staged(50))}
    assert 70 <= len(ten) <= 130
    assert 470 <= len(fifty) <= 530
    assert ten <= fifty


def test_the_stage_depends_on_the_effect_not_on_the_percent() -> None:
    deny = {p.pod for p in PODS if in_stage(p, staged(10, force=None, deny=["TRTLLM_RAGGED"]))}
    force = {p.pod for p in PODS if in_stage(p, staged(10))}
    assert deny != force  # a new rollout draws new pods


def test_pods_without_a_name_are_never_in_a_partial_stage() -> None:
    nameless = request((10, 0), cluster="prod-east", pod=None)
    assert not in_stage(nameless, staged(99))
    assert in_stage(nameless, staged(100))


def test_in_and_out_answers_say_so() -> None:
    o = staged(10)
    inputs = DecisionInputs(SEED_RULES, (o,))
    inside = next(p for p in PODS if in_stage(p, o))
    outside = next(p for p in PODS if not in_stage(p, o))
    a, b = decide(inside, inputs, now=NOW), decide(outside, inputs, now=NOW)
    assert isinstance(a, Decision) and isinstance(b, Decision)
    assert (a.backend, a.source) == (Backend.FLASHINFER, "override")
    assert (b.backend, b.source) == (Backend.TRTLLM_RAGGED, "priority")  # as without it
    assert "In the 10 % rollout of override prod-east rev 12." in a.messages
    assert any(
        m.startswith("Not in the 10 % rollout of override prod-east rev 12") for m in b.messages
    )
    assert a.overrides[0].rollout is not None and a.overrides[0].rollout.in_stage
    assert b.overrides[0].effect == "none" and not b.overrides[0].rollout.in_stage  # type: ignore[union-attr]
    assert decision_key(inside, (o,)) != decision_key(outside, (o,))


def test_a_halted_rollout_applies_to_nobody() -> None:
    inputs = DecisionInputs(SEED_RULES, (staged(50, state="halted"),))
    for pod in PODS[:50]:
        result = decide(pod, inputs, now=NOW)
        assert isinstance(result, Decision) and result.backend is Backend.TRTLLM_RAGGED
    # a reason stored as text alone cannot be told apart by cluster: pointed at
    assert any("is halted (its reason: GET /v1/overrides/prod-east)" in m for m in result.messages)


def test_a_halted_cluster_rollout_quotes_its_own_clusters_pods_only() -> None:
    """A cluster's rollout may be halted by the speed of pods of clusters its evidence
    trusts; the pod's answer names its own cluster's pods and counts the others."""
    o = staged(50, state="halted")
    assert o.rollout is not None
    cause = SlowdownHalt(
        staged="FLASHINFER",
        staged_tflops=10.0,
        staged_samples=4,
        pods=[PodAt(cluster="prod-east", pod="a"), PodAt(cluster="dev-a", pod="secret")],
        without="CUDNN",
        without_tflops=20.0,
        without_samples=4,
        percent_slower=50.0,
        max_slowdown_pct=10,
        verified_pods=2,
        static_sources=0,
    )
    rollout = o.rollout.model_copy(update={"halted_cause": cause})
    inputs = DecisionInputs(SEED_RULES, (o.model_copy(update={"rollout": rollout}),))
    result = decide(PODS[0], inputs, now=NOW)
    assert isinstance(result, Decision)
    (halted,) = [m for m in result.messages if "is halted" in m]
    assert "prod-east/a" in halted and "1 pod in clusters outside your scope" in halted
    assert "secret" not in halted and "dev-a" not in halted


def test_a_complete_rollout_applies_to_everybody() -> None:
    inputs = DecisionInputs(SEED_RULES, (staged(30, state="complete"),))
    assert all(decide(p, inputs, now=NOW).backend is Backend.FLASHINFER for p in PODS[:50])  # type: ignore[union-attr]


def test_a_halted_fleet_rollout_points_at_its_reason_rather_than_quoting_it() -> None:
    """A fleet rollout's halt reason names pods and errors of any cluster, and the
    answer goes to one cluster's pod: the pod reads where to look, not the text."""
    body = {"force": "FLASHINFER"}
    rid = rollout_id("*", OverrideSpec.model_validate({**body, "note": "x"}))
    reason = "2 evidence source(s) ...: pods dev-a/p9 (clusters dev-a); latest: SECRET"
    fleet = override(
        "*",
        **body,
        revision=3,
        rollout={"percent": 50, "id": rid, "state": "halted", "halted_reason": reason},
    )
    result = decide(PODS[0], DecisionInputs(SEED_RULES, (fleet,)), now=NOW)
    assert isinstance(result, Decision)
    halted = [m for m in result.messages if "is halted" in m]
    assert halted == [
        "The rollout of fleet override (*) rev 3 is halted (its reason: GET /v1/overrides/*):"
        " answered as without it."
    ]
