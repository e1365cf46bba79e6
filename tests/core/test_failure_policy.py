"""The failure policy as tables: how many distinct pods' failures exclude a backend,
what fewer do (said, not excluded), and that failures alone never leave a pod with no
valid backend."""

from __future__ import annotations

from datetime import timedelta

import pytest
from mla_switchboard.core.causes import ExclusionWaived, FailuresBelowPolicy
from mla_switchboard.core.evaluator import Decision, DecisionInputs, Refusal, assess, decide
from mla_switchboard.core.evidence import EvidenceIndex, FailurePolicy, Observation
from mla_switchboard.core.schemas import SEED_RULES
from mla_switchboard.core.specs import Backend

from tests.core.conftest import NOW, override, request
from tests.core.test_evidence import H200, MEASURED, failed, measured

FI = Backend.FLASHINFER


def index(failures: list[Observation], policy: FailurePolicy | None = None) -> EvidenceIndex:
    return EvidenceIndex(
        measured("FLASHINFER", 600) + measured("FLASH_ATTN", 200) + failures,
        failure_policy=policy or FailurePolicy(),
    )


# (policy's min_pods (None: the default), failing pods of FLASHINFER, excluded?)
EXCLUDES = [
    (None, [], False),
    (None, ["pod-a"], False),  # one pod's wrong result: not enough by default
    (None, ["pod-a", "pod-a"], False),  # the same pod twice is one pod
    (None, ["pod-a", "pod-b"], True),  # a second pod confirms it
    (1, ["pod-a"], True),  # SWITCHBOARD_FAILURE_MIN_PODS=1: one pod is enough
    (3, ["pod-a", "pod-b"], False),
    (3, ["pod-a", "pod-b", "pod-c"], True),
]


@pytest.mark.parametrize(("min_pods", "pods", "excluded"), EXCLUDES)
def test_how_many_pods_exclude_a_backend(
    min_pods: int | None, pods: list[str], excluded: bool
) -> None:
    policy = FailurePolicy() if min_pods is None else FailurePolicy(min_pods=min_pods)
    failures = [failed("FLASHINFER", p, at=NOW - timedelta(minutes=i)) for i, p in enumerate(pods)]
    result = decide(H200, DecisionInputs(SEED_RULES, MEASURED, index(failures, policy)), now=NOW)
    assert isinstance(result, Decision)
    fi = next(c for c in result.candidates if c.backend is FI)
    assert fi.valid is not excluded
    assert (fi.exclusion is not None) is excluded
    assert result.backend is (Backend.FLASH_ATTN if excluded else FI)


# (policy's min_pods, failing pods) -> what the answer says of the valid FLASHINFER
BELOW = [
    (2, 1, "1 of 2 pods needed to exclude FLASHINFER for this situation"),
    (3, 1, "1 of 3 pods needed to exclude FLASHINFER for this situation"),
    (3, 2, "2 of 3 pods needed to exclude FLASHINFER for this situation"),
]


@pytest.mark.parametrize(("min_pods", "pods", "said"), BELOW)
def test_fewer_pods_than_the_policy_needs_are_said_in_the_answer(
    min_pods: int, pods: int, said: str
) -> None:
    failures = [failed("FLASHINFER", f"pod-{i}") for i in range(pods)]
    ev = index(failures, FailurePolicy(min_pods=min_pods))
    result = decide(H200, DecisionInputs(SEED_RULES, MEASURED, ev), now=NOW)
    assert isinstance(result, Decision) and result.backend is FI
    fi = next(c for c in result.candidates if c.backend is FI)
    assert fi.valid and fi.reasons == []
    assert fi.failures == FailuresBelowPolicy(
        backend="FLASHINFER", pods=pods, needed=min_pods, window_h=24.0
    )
    assert any(m.startswith(said) for m in result.messages), result.messages


def test_failures_outside_the_window_are_not_said() -> None:
    ev = index([failed("FLASHINFER", "pod-a", at=NOW - timedelta(hours=25))])
    result = decide(H200, DecisionInputs(SEED_RULES, MEASURED, ev), now=NOW)
    assert isinstance(result, Decision)
    assert all(c.failures is None for c in result.candidates)
    assert not any("needed to exclude" in m for m in result.messages)


def every_valid(backends_pods: dict[str, int], req=H200) -> list[Observation]:  # type: ignore[no-untyped-def]
    return [failed(b, f"{b}-pod-{i}", req=req) for b, n in backends_pods.items() for i in range(n)]


def test_failures_never_leave_a_pod_with_no_valid_backend() -> None:
    inputs = DecisionInputs(SEED_RULES, MEASURED, EvidenceIndex())
    valid = assess(H200, inputs, NOW).valid()
    assert len(valid) >= 2
    # every valid backend failed on 3 pods, but the last one on 2: it is kept
    pods = {b.value: 3 for b in valid}
    pods[valid[-1].value] = 2
    ev = EvidenceIndex(every_valid(pods))
    result = decide(H200, DecisionInputs(SEED_RULES, MEASURED, ev), now=NOW)
    assert isinstance(result, Decision), result
    assert result.backend is valid[-1]
    kept = next(c for c in result.candidates if c.backend is valid[-1])
    assert kept.valid and kept.exclusion is None
    assert kept.failures == ExclusionWaived(backend=valid[-1].value, pods=2, window_h=24.0)
    assert [c.backend for c in result.candidates if c.valid] == [valid[-1]]
    assert any("the one with the fewest failing pods (2 pods" in m for m in result.messages)


def test_the_tie_goes_to_the_registry_order() -> None:
    inputs = DecisionInputs(SEED_RULES, MEASURED, EvidenceIndex())
    valid = assess(H200, inputs, NOW).valid()
    ev = EvidenceIndex(every_valid({b.value: 2 for b in valid}))
    result = decide(H200, DecisionInputs(SEED_RULES, MEASURED, ev), now=NOW)
    assert isinstance(result, Decision) and result.backend is valid[0]


def test_a_backend_invalid_for_another_reason_is_never_kept() -> None:
    """Only what failures alone excluded comes back: a denied backend stays denied, and a
    pod whose every backend is denied or failing still gets the failing one."""
    inputs = DecisionInputs(SEED_RULES, MEASURED, EvidenceIndex())
    valid = assess(H200, inputs, NOW).valid()
    denied, failing = valid[0], valid[1:]
    overrides = (
        override("*", policy="measured"),
        override("west", deny=[denied.value]),
    )
    ev = EvidenceIndex(every_valid({b.value: 2 for b in failing}))
    req = request((9, 0), device="NVIDIA H200", cluster="west")
    result = decide(req, DecisionInputs(SEED_RULES, overrides, ev), now=NOW)
    assert isinstance(result, Decision), result
    assert result.backend is failing[0] and result.backend is not denied


def test_the_last_one_is_kept_only_under_policy_measured() -> None:
    """Failures exclude nothing outside policy measured: nothing to keep either."""
    inputs = DecisionInputs(SEED_RULES, (), EvidenceIndex(every_valid({"FLASHINFER": 5})))
    result = decide(H200, inputs, now=NOW)
    assert not isinstance(result, Refusal)
    assert all(c.failures is None and c.exclusion is None for c in result.candidates)
