"""service/priority.py's hand-over of the GIL: background threads give the event loop
the interpreter while pods call (a pod's call being answered, and a moment after), and
do not pay for it otherwise."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mla_switchboard.service import priority
from mla_switchboard.service.priority import (
    ASKED_WITHIN_S,
    answering_a_pod,
    loop_waiting,
    pod_calls_in_flight,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts the thread's context switches (Linux)"
)


def _gave_up_the_cpu(calls: int) -> int:
    """How many times this thread gave up the CPU while calling ``let_the_loop_in``
    ``calls`` times (its voluntary context switches)."""
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    for _ in range(calls):
        priority.let_the_loop_in()
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before


@pytest.fixture
def quiet() -> Iterator[None]:
    """No pod's call answered lately (another test's app may have answered one), and
    the latest as it was afterwards."""
    kept = priority._answered_at
    priority._answered_at = time.monotonic() - 2 * ASKED_WITHIN_S
    yield
    priority._answered_at = kept


@pytest.mark.parametrize(
    ("since_answered", "waiting"),
    [(0.0, True), (ASKED_WITHIN_S / 2, True), (ASKED_WITHIN_S * 1.5, False), (60.0, False)],
)
def test_the_loop_may_want_the_gil_for_a_while_after_a_pods_answer(
    since_answered: float, waiting: bool, quiet: None
) -> None:
    with answering_a_pod():
        assert loop_waiting(now=time.monotonic() + 3600)  # however long the answer takes
    answered = priority._answered_at
    assert loop_waiting(now=answered + since_answered) is waiting


def test_a_background_step_hands_the_cpu_over_only_while_pods_call(quiet: None) -> None:
    nobody = _gave_up_the_cpu(200)
    with answering_a_pod():
        answering = _gave_up_the_cpu(200)
    priority._answered_at = time.monotonic() - 2 * ASKED_WITHIN_S  # (the table above)
    later = _gave_up_the_cpu(200)
    assert nobody <= 5, f"gave up the CPU {nobody} times with no pod calling"
    assert answering >= 150, f"gave up the CPU {answering} times of 200 while a pod was answered"
    assert later <= 5, f"gave up the CPU {later} times long after the pod's answer"


def test_a_pods_call_is_counted_while_it_is_answered_and_a_persons_read_is_not(
    shared_inprocess: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    app: Any = shared_inprocess.app  # type: ignore[attr-defined]
    seen: list[int] = []
    answer = app._answer

    async def observed(scope: Any, receive: Any, send: Any) -> None:
        seen.append(pod_calls_in_flight())
        await answer(scope, receive, send)

    monkeypatch.setattr(app, "_answer", observed)

    def counted(method: str, path: str) -> int:
        seen.clear()
        shared_inprocess.request(method, path, json={} if method == "POST" else None)
        assert pod_calls_in_flight() == 0  # and no longer once answered
        return seen[0]

    assert counted("POST", "/v1/select") == 1  # the plain ASGI handler's path
    assert counted("POST", "/v1/measurements") == 1  # refused or not: a pod waits on it
    # a read a person asks for runs on the fleet-read thread while the loop waits for
    # it: it must not turn the hand-over on for itself
    assert counted("GET", "/v1/selections/summary") == 0
    assert counted("GET", "/healthz") == 0
    assert counted("GET", "/v1/select") == 0
