"""service/priority.py's hand-over of the GIL: background threads give the event loop
the interpreter while it has pods to answer, and do not pay for it when nobody asked."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from mla_switchboard.service import priority
from mla_switchboard.service.priority import ASKED_WITHIN_S, asked_lately, loop_asked

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts the thread's context switches (Linux)"
)


@pytest.fixture(autouse=True)
def _restore_asked_at() -> Iterator[None]:
    kept = priority._asked_at
    yield
    priority._asked_at = kept


def _gave_up_the_cpu(calls: int) -> int:
    """How many times this thread gave up the CPU while calling ``let_the_loop_in``
    ``calls`` times (its voluntary context switches)."""
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    for _ in range(calls):
        priority.let_the_loop_in()
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before


@pytest.mark.parametrize(
    ("since_asked", "lately"),
    [(0.0, True), (ASKED_WITHIN_S / 2, True), (ASKED_WITHIN_S, False), (60.0, False)],
)
def test_the_loop_counts_as_asked_for_a_while_after_a_request(
    since_asked: float, lately: bool
) -> None:
    loop_asked(now=1000.0)
    assert asked_lately(now=1000.0 + since_asked) is lately


def test_a_background_step_hands_the_cpu_over_only_while_pods_ask() -> None:
    loop_asked(now=time.monotonic() - 2 * ASKED_WITHIN_S)
    quiet = _gave_up_the_cpu(200)
    loop_asked()
    asked = _gave_up_the_cpu(200)
    assert quiet <= 5, f"gave up the CPU {quiet} times with nobody asking"
    assert asked >= 150, f"gave up the CPU {asked} times of 200 while the loop was asked"


def test_a_pods_call_counts_as_the_loop_asked_and_a_persons_read_does_not(
    shared_inprocess: httpx.Client,
) -> None:
    def asks(method: str, path: str) -> bool:
        loop_asked(now=time.monotonic() - 2 * ASKED_WITHIN_S)
        shared_inprocess.request(method, path, json={} if method == "POST" else None)
        return asked_lately()

    assert asks("POST", "/v1/select")  # the plain ASGI handler's path
    assert asks("POST", "/v1/measurements")  # refused or not: a pod is waiting on it
    # a read a person asks for runs on the fleet-read thread while the loop waits for
    # it: it must not turn the hand-over on for itself
    assert not asks("GET", "/v1/selections/summary")
    assert not asks("GET", "/healthz")
    assert not asks("GET", "/v1/select")
