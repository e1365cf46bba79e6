"""service/priority.py's hand-over of the GIL: background threads give the event loop
the interpreter while it has pods to answer, and do not pay for it when nobody asked."""

from __future__ import annotations

import resource
import sys
import time

import httpx
import pytest
from mla_switchboard.service import priority
from mla_switchboard.service.priority import ASKED_WITHIN_S, asked_lately, loop_asked

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts the thread's context switches (Linux)"
)


@pytest.fixture(autouse=True)
def _restore_asked_at() -> object:
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


def test_every_request_the_app_answers_counts_as_the_loop_asked(
    shared_inprocess: httpx.Client,
) -> None:
    for path in ("/healthz", "/v1/backends"):
        loop_asked(now=time.monotonic() - 2 * ASKED_WITHIN_S)
        assert not asked_lately()
        shared_inprocess.get(path)
        assert asked_lately(), path
    loop_asked(now=time.monotonic() - 2 * ASKED_WITHIN_S)
    shared_inprocess.post("/v1/select", json={})  # the plain ASGI handler's path too
    assert asked_lately()
