"""The one redaction of other clusters' pods and error text for a token limited to
some clusters (``service/reads/scope.py``), rendering causes stored as data
(``core/cause_words.py``), case by case."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from mla_switchboard.core import cause_words as words
from mla_switchboard.core.causes import (
    FailureHalt,
    MeasuredExclusion,
    PersonHalt,
    PodAt,
    PodError,
    SlowdownHalt,
)
from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.reads import scope

PROD = Principal("prod", "viewer", ("prod-*",), "t1")
FLEET = Principal("fleet", "viewer", None, "t2")
AT = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def failed(*where: str, latest: str | None = None) -> FailureHalt:
    pods = [PodAt(cluster=w.split("/")[0], pod=w.split("/")[1]) for w in where]
    last = (latest or where[-1]).split("/")
    return FailureHalt(
        sources=len(pods),
        verified_pods=0,
        static_sources=len(pods),
        max_failures=len(pods),
        pods=pods,
        latest=PodError(cluster=last[0], pod=last[1], error="RuntimeError: SECRET"),
        backend="FLASHINFER",
    )


def slow(*where: str) -> SlowdownHalt:
    return SlowdownHalt(
        staged="FLASHINFER",
        staged_tflops=10.0,
        staged_samples=4,
        pods=[PodAt(cluster=w.split("/")[0], pod=w.split("/")[1]) for w in where],
        without="CUDNN",
        without_tflops=20.0,
        without_samples=4,
        percent_slower=50.0,
        max_slowdown_pct=10,
        verified_pods=2,
        static_sources=0,
    )


def test_a_failure_halt_in_words_for_everyone_is_the_sentence_it_always_was() -> None:
    assert words.halt(failed("prod-east/p1", "dev-a/p9")) == (
        "2 evidence source(s) (0 verified pod(s), 2 static source(s)) reported a failure of "
        "what the rollout gave their stage pods, reaching max_failures 2: pods prod-east/p1, "
        "dev-a/p9 (clusters dev-a, prod-east); latest: dev-a/p9 ran FLASHINFER: "
        "RuntimeError: SECRET"
    )


@pytest.mark.parametrize(
    ("cause", "names", "hides"),
    [
        # every pod the caller's: the whole sentence
        (failed("prod-east/p1", "prod-west/p2"), ["prod-east/p1", "prod-west/p2", "SECRET"], []),
        # some: its own named, the rest counted, another cluster's error left out
        (
            failed("prod-east/p1", "dev-a/p9"),
            ["prod-east/p1", "1 pod in clusters outside your scope", words.OUTSIDE],
            ["dev-a", "p9", "SECRET"],
        ),
        # none: only that it was halted outside
        (failed("dev-a/p1", "dev-b/p2"), [words.OUTSIDE], ["dev-", "SECRET"]),
        # a pod whose name looks like a list of clusters is one pod of its own cluster
        (
            failed("prod-east/p1", "dev-a/c2 (clusters prod-east, prod-z"),
            ["prod-east/p1", "1 pod in clusters outside your scope"],
            ["dev-a", "prod-z", "SECRET"],
        ),
        # the speed guard's halt in the caller's own clusters is its own
        (slow("prod-east/a", "prod-east/b"), ["prod-east/a, prod-east/b", "50.0 % slower"], []),
        (
            slow("prod-east/a", "dev-b/secret"),
            ["prod-east/a, and 1 pod in clusters outside your scope", "50.0 % slower"],
            ["dev-b", "secret"],
        ),
        (PersonHalt(by="alice", note="INC-7 by hand"), ["halted by alice: INC-7 by hand"], []),
    ],
)
def test_halts_in_a_scoped_callers_words(cause: Any, names: list[str], hides: list[str]) -> None:
    text = words.halt(cause, PROD.may_see)
    for n in names:
        assert n in text, text
    for h in hides:
        assert h not in text, text
    reason, cut = scope.halted(PROD.may_see, words.halt(cause), cause.model_dump(mode="json"))
    assert reason == text
    for h in hides:
        assert h not in str(cut)
    # an unrestricted caller: as stored
    stored = cause.model_dump(mode="json")
    assert scope.halted(None, words.halt(cause), stored) == (words.halt(cause), stored)


@pytest.mark.parametrize(
    ("reason", "shown"),
    [
        ("2 stage pod(s) reported ...: prod-east/p1; latest: prod-east/p1 ran X: oom", "outside"),
        ("halted by alice: INC-7 by hand", "outside"),
        (None, None),
    ],
)
def test_a_halt_stored_as_text_alone(reason: str | None, shown: str | None) -> None:
    """Before causes were kept: a restricted caller cannot be told whose pods a text
    names, so it reads that the rollout was halted outside its scope."""
    expected = scope.OUTSIDE if shown == "outside" else None
    assert scope.halted(PROD.may_see, reason, None) == (expected, None)
    assert scope.halted(None, reason, None) == (reason, None)


@pytest.mark.parametrize(
    ("failed_pods", "mine", "outside"),
    [
        (["prod-east/p1", "dev-a/p9"], ["prod-east/p1"], 1),
        (["dev-a/p1", "dev-b/p2"], [], 2),
        (["prod-east/p1"], ["prod-east/p1"], 0),
        ([], [], 0),
    ],
)
def test_rollouts(failed_pods: list[str], mine: list[str], outside: int) -> None:
    r: dict[str, Any] = {
        "state": "active",
        "failures": len(failed_pods),
        "failed_pods": failed_pods,
    }
    shown = scope.rollout(PROD, r)
    assert shown["failed_pods"] == mine and shown["failed_pods_outside_scope"] == outside
    assert shown["failures"] == len(failed_pods) and shown["halted_reason"] is None
    assert scope.rollout(FLEET, r) is r  # an unrestricted caller: untouched


def exclusion(*where: str, pods: int | None = None, hours: float = 24) -> MeasuredExclusion:
    quoted = [
        PodError(cluster=w.split("/")[0], pod=w.split("/")[1], at=AT, error=f"err {w}")
        for w in where
    ]
    return MeasuredExclusion(pods=pods or len(quoted), window_h=hours, quoted=quoted)


@pytest.mark.parametrize(
    ("cause", "everyone", "prod"),
    [
        (
            exclusion("prod-east/p1", "prod-west/p2"),
            "failed on 2 pods in the last 24 h (measured policy): prod-east/p1 2026-12-02 "
            "10:00 UTC: err prod-east/p1; prod-west/p2 2026-12-02 10:00 UTC: err prod-west/p2",
            "same",
        ),
        (
            exclusion("prod-east/p1", "dev-a/p2"),
            None,
            "failed on 2 pods in the last 24 h (measured policy): prod-east/p1 2026-12-02 "
            "10:00 UTC: err prod-east/p1; and 1 pod not named (some in clusters outside "
            "your scope)",
        ),
        # a cluster named to sort before any letter is a cluster like any other
        (
            exclusion("_dev/p2"),
            None,
            "failed on 1 pod in the last 24 h (measured policy): and 1 pod not named (some "
            "in clusters outside your scope)",
        ),
        # a window far larger than a year is written out, never as 2e+06
        (
            exclusion("prod-east/p1", hours=2_000_000),
            "failed on 1 pod in the last 2000000 h (measured policy): prod-east/p1 2026-12-02 "
            "10:00 UTC: err prod-east/p1",
            "same",
        ),
        (
            exclusion("prod-east/p1", pods=5),
            "failed on 5 pods in the last 24 h (measured policy): prod-east/p1 2026-12-02 "
            "10:00 UTC: err prod-east/p1; and 4 more",
            "same",
        ),
    ],
)
def test_exclusions(cause: MeasuredExclusion, everyone: str | None, prod: str) -> None:
    full = words.exclusion(cause)
    if everyone is not None:
        assert full == everyone
    shown, cut = scope.exclusion(PROD.may_see, full, cause.model_dump(mode="json"))
    assert shown == (full if prod == "same" else prod)
    assert all(q["cluster"].startswith("prod-") for q in cut["quoted"])
    assert scope.exclusion(None, full, cause) == (full, cause)


def test_an_exclusion_stored_as_text_alone_keeps_its_count_only() -> None:
    old = "failed on 2 pods in the last 2e+06 h (measured policy): _dev/p: x; prod-east/q: y"
    assert scope.legacy_exclusion(old) == (
        f"failed on 2 pods in the last 2e+06 h (measured policy): {scope.OUTSIDE_PODS}"
    )
    assert scope.legacy_exclusion("Using FLASH_ATTN: first valid backend") == (
        "Using FLASH_ATTN: first valid backend"
    )
    # a preview says which backend a reason is against, before the reason
    why = "FLASHINFER: failed on 1 pod in the last 24 h (measured policy): dev-a/p: SECRET"
    preview = {"changes": [{"cluster": "prod-east", "reasons": [{"pods": 3, "why": [why]}]}]}
    shown = scope.texts(PROD, preview)
    assert shown["changes"][0]["reasons"][0]["why"] == [
        f"FLASHINFER: failed on 1 pod in the last 24 h (measured policy): {scope.OUTSIDE_PODS}"
    ]
    assert scope.texts(FLEET, preview) is preview


def test_audit_notes_and_decision_answers() -> None:
    def failure(where: str) -> dict[str, Any]:
        cluster, pod = where.split("/")
        cause = PodError(cluster=cluster, pod=pod, error="oom").model_dump(mode="json")
        return {"action": "rollout.failure", "note": f"{where}: oom", "cause": cause}

    assert scope.audit_entry(PROD, failure("dev-a/p9"))["note"] == scope.OUTSIDE_FAILURE
    assert scope.audit_entry(PROD, failure("dev-a/p9"))["cause"] is None
    assert scope.audit_entry(PROD, failure("prod-east/p1"))["note"] == "prod-east/p1: oom"
    # a pod name that starts like another cluster's pod is still its cluster's
    tricky = failure("dev-a/p1")
    tricky["note"] = "prod-east/x: oom"  # what a note could say; the cause decides
    assert scope.audit_entry(PROD, tricky)["note"] == scope.OUTSIDE_FAILURE
    # stored before causes were kept: outside, to a restricted caller only
    old = {"action": "rollout.failure", "note": "prod-east/p1: oom"}
    assert scope.audit_entry(PROD, old)["note"] == scope.OUTSIDE_FAILURE
    assert scope.audit_entry(FLEET, old) is old
    cause = slow("prod-east/a", "prod-east/b")
    slowed = {
        "action": "rollout.slowdown",
        "note": words.halt(cause),
        "cause": cause.model_dump(mode="json"),
    }
    assert scope.audit_entry(PROD, slowed)["note"] == words.halt(cause)
    assert scope.audit_entry(PROD, {**slowed, "cause": None})["note"] == scope.OUTSIDE

    excluded = exclusion("prod-east/p1", "dev-a/p2")
    candidate = {
        "backend": "FLASHINFER",
        "reasons": [words.exclusion(excluded)],
        "exclusion": excluded.model_dump(mode="json"),
    }
    answer = {"messages": [], "candidates": [candidate]}
    shown = scope.decision_answer(PROD, answer)
    assert "dev-a" not in str(shown) and "prod-east/p1" in shown["candidates"][0]["reasons"][0]
    assert scope.decision_answer(FLEET, answer) is answer


def test_an_answer_stored_before_causes_were_kept() -> None:
    """Its messages and reasons may quote a halt or an exclusion of any cluster, and
    nothing says whose: a restricted caller reads the counts and pointers only."""
    excluded = "failed on 1 pod in the last 24 h (measured policy): dev-a/p: SECRET"
    answer = {
        "messages": [
            "The rollout of override prod-east rev 3 is halted (pods dev-a/p9 SECRET): "
            "answered as without it.",
            f"Requested MLA prefill backend FLASHINFER is not valid: ['{excluded}']. Falling",
            "Using FLASH_ATTN: first valid backend",
        ],
        "candidates": [{"backend": "FLASHINFER", "reasons": [excluded]}],
    }
    shown = scope.decision_answer(PROD, answer)
    assert "SECRET" not in str(shown) and "dev-a" not in str(shown)
    assert shown["messages"][2] == "Using FLASH_ATTN: first valid backend"
    assert shown["messages"][0].startswith("The rollout of override prod-east rev 3 is halted (")


def test_a_previews_exclusions_in_a_scoped_callers_words() -> None:
    cause = exclusion("prod-east/p1", "dev-a/p2")
    why = [f"FLASHINFER: {words.exclusion(cause)}", "Using FLASH_ATTN: first valid backend"]
    reason = {"pods": 3, "why": why, "exclusions": {"FLASHINFER": cause.model_dump(mode="json")}}
    preview = {"pods_total": 3, "changes": [{"cluster": "prod-east", "reasons": [reason]}]}
    shown = scope.preview(PROD, preview)
    (mine,) = shown["changes"][0]["reasons"]
    assert mine["why"] == [
        f"FLASHINFER: {words.exclusion(cause, PROD.may_see)}",
        "Using FLASH_ATTN: first valid backend",
    ]
    assert "prod-east/p1" in mine["why"][0] and "dev-a" not in str(shown)
    assert scope.preview(FLEET, preview) is preview
