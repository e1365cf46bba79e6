"""The one redaction of other clusters' pods and error text for a token limited to
some clusters (``service/reads/scope.py``), case by case."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from mla_switchboard.core.evaluator import FLEET_HALT_POINTER
from mla_switchboard.core.evidence import FailureNote, FailurePolicy
from mla_switchboard.service.auth import Principal
from mla_switchboard.service.reads import scope

PROD = Principal("prod", "viewer", ("prod-*",), "t1")
FLEET = Principal("fleet", "viewer", None, "t2")

FAILED = (
    "2 stage pod(s) reported a failure of what the rollout gave them, reaching "
    "max_failures 2: pods prod-east/p1, {dev}/p9 (clusters {clusters}); latest: {dev}/p9 "
    "ran FLASHINFER: RuntimeError: SECRET"
)
SLOW = (
    "stage pods measured FLASHINFER at 10.0 TFLOP/s median (4 samples from 2 pods: "
    "prod-east/a, {other}/b; clusters {clusters}) against CUDNN at 20.0 without the "
    "override (4 samples): 50.0 % slower (max_slowdown_pct 10)"
)
EXCLUDED = (
    "failed on 2 pods in the last 24 h (measured policy): prod-east/p1 2026-12-02 10:00 UTC: "
    "bad; {other}/p2: SECRET; x"
)


@pytest.mark.parametrize(
    ("principal", "reason", "shown"),
    [
        (FLEET, FAILED.format(dev="dev-a", clusters="dev-a, prod-east"), "same"),
        (PROD, FAILED.format(dev="dev-a", clusters="dev-a, prod-east"), scope.OUTSIDE),
        (PROD, FAILED.format(dev="prod-west", clusters="prod-east, prod-west"), "same"),
        (PROD, SLOW.format(other="dev-b", clusters="dev-b, prod-east"), scope.OUTSIDE),
        (PROD, SLOW.format(other="prod-west", clusters="prod-east, prod-west"), "same"),
        (PROD, "halted by alice: INC-7 by hand", "same"),  # a person's note, for everyone
        (PROD, "a guard's reason in a shape not known here", scope.OUTSIDE),
        (PROD, None, None),
    ],
)
def test_halt_reasons(principal: Principal, reason: str | None, shown: str | None) -> None:
    assert scope.halt_reason(principal, reason) == (reason if shown == "same" else shown)


@pytest.mark.parametrize(
    ("principal", "failed", "mine", "outside"),
    [
        (PROD, ["prod-east/p1", "dev-a/p9"], ["prod-east/p1"], 1),
        (PROD, ["dev-a/p1", "dev-b/p2"], [], 2),
        (PROD, ["prod-east/p1"], ["prod-east/p1"], 0),
        (PROD, [], [], 0),
    ],
)
def test_rollouts(principal: Principal, failed: list[str], mine: list[str], outside: int) -> None:
    r: dict[str, Any] = {"state": "active", "failures": len(failed), "failed_pods": failed}
    shown = scope.rollout(principal, r)
    assert shown["failed_pods"] == mine and shown["failed_pods_outside_scope"] == outside
    assert shown["failures"] == len(failed) and shown["halted_reason"] is None
    assert scope.rollout(FLEET, r) is r  # an unrestricted caller: untouched


@pytest.mark.parametrize(
    ("reason", "shown"),
    [
        (EXCLUDED.format(other="dev-a"), "redacted"),
        (EXCLUDED.format(other="prod-west"), "same"),
        ("Using FLASH_ATTN: first valid backend", "same"),
        # an error text shaped like another cluster's pod: redacted on doubt
        (
            "failed on 1 pod in the last 24 h (measured policy): prod-east/p: x; dev-a/y z",
            "redacted",
        ),
    ],
)
def test_exclusions(reason: str, shown: str) -> None:
    out = scope.exclusion(PROD, reason)
    if shown == "same":
        assert out == reason
    else:
        assert out.endswith(f"(measured policy): {scope.OUTSIDE_PODS}") and "dev-a" not in out
    assert scope.exclusion(FLEET, reason) == reason


def test_audit_notes_and_decision_messages() -> None:
    row = {"action": "rollout.failure", "note": "dev-a/p9: SECRET", "before": None, "after": None}
    assert scope.audit_entry(PROD, row)["note"] == scope.OUTSIDE_FAILURE
    assert (
        scope.audit_entry(PROD, {**row, "note": "prod-east/p1: oom"})["note"] == "prod-east/p1: oom"
    )
    reason = FAILED.format(dev="dev-a", clusters="dev-a, prod-east")
    message = (
        f"The rollout of fleet override (*) rev 3 is halted ({reason}): answered as without it."
    )
    answer = {"messages": [message], "rejected": [{"reasons": [EXCLUDED.format(other="dev-a")]}]}
    shown = scope.decision_answer(PROD, answer)
    assert "SECRET" not in str(shown) and scope.OUTSIDE in shown["messages"][0]
    assert scope.decision_answer(FLEET, answer) is answer


def test_a_policys_reason_counts_other_clusters_pods_without_naming_them() -> None:
    notes = [
        FailureNote(c, f"p{i}", None, f"err {c}") for i, c in enumerate(["dev-a", "prod-e"] * 3)
    ]
    policy = FailurePolicy()
    everything = policy.exclusion_of_latest(notes, _now())
    assert everything is not None and "dev-a/p0" in everything
    mine = policy.exclusion_of_latest(notes, _now(), lambda c: c.startswith("prod-"))
    assert mine == (
        "failed on 6 pods in the last 24 h (measured policy): prod-e/p1: err prod-e; "
        "prod-e/p3: err prod-e; prod-e/p5: err prod-e; 3 pods in clusters outside your scope"
    )


def _now() -> datetime:
    return datetime.now(UTC)


def test_a_decisions_pointer_to_a_halted_fleet_rollout_is_kept() -> None:
    """A decision made since answers point at the rollout instead of quoting its
    reason: nothing to redact, and never the misleading "outside your scope"."""
    message = (
        f"The rollout of fleet override (*) rev 3 is halted ({FLEET_HALT_POINTER}):"
        " answered as without it."
    )
    assert scope.text(PROD, message) == message
