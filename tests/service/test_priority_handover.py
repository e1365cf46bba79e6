"""service/priority.py's hand-over of the GIL: background threads give the event loop
the interpreter while it may be waiting for it (a pod's call being answered, or input
waiting on the loop's descriptor), and do not pay for it otherwise."""

from __future__ import annotations

import asyncio
import resource
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from mla_switchboard.service import priority
from mla_switchboard.service.priority import (
    answering_a_pod,
    backend_descriptor,
    loop_waiting,
    pod_calls_in_flight,
    watch_loop,
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
def unwatched() -> Iterator[None]:
    """No loop watched during the test (an app started by another test may be), and
    whatever was watched before afterwards."""
    kept = priority._watched
    priority._watched = None
    yield
    priority._watched = kept


def test_a_background_step_hands_the_cpu_over_only_while_a_pod_is_answered(
    unwatched: None,
) -> None:
    quiet = _gave_up_the_cpu(200)
    with answering_a_pod():
        asked = _gave_up_the_cpu(200)
    after = _gave_up_the_cpu(200)
    assert quiet <= 5, f"gave up the CPU {quiet} times with nobody waiting"
    assert asked >= 150, f"gave up the CPU {asked} times of 200 while a pod was answered"
    assert after <= 5, f"gave up the CPU {after} times after the pod's answer"


def _asyncio_loop() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop()


def _uvloop_loop() -> asyncio.AbstractEventLoop:
    uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed")
    return uvloop.new_event_loop()  # type: ignore[no-any-return]


@pytest.mark.parametrize("make_loop", [_asyncio_loop, _uvloop_loop], ids=["asyncio", "uvloop"])
def test_input_waiting_on_the_loop_hands_it_the_cpu_until_it_is_read(
    make_loop: Callable[[], asyncio.AbstractEventLoop], unwatched: None
) -> None:
    loop = make_loop()
    ours, theirs = socket.socketpair()
    try:
        assert backend_descriptor(loop) is not None
        loop.add_reader(ours.fileno(), lambda: None)
        loop.run_until_complete(asyncio.sleep(0))  # libuv registers its watchers here
        unwatch = watch_loop(loop)
        assert not loop_waiting()
        theirs.send(b"x")  # a request's bytes arrive
        assert loop_waiting()
        assert _gave_up_the_cpu(50) >= 40
        ours.recv(1)  # the loop read them
        assert not loop_waiting()
        assert _gave_up_the_cpu(50) <= 5
        theirs.send(b"y")
        unwatch()  # a stopped app's loop is not watched any more
        assert not loop_waiting()
    finally:
        loop.remove_reader(ours.fileno())
        loop.close()
        ours.close()
        theirs.close()


def test_a_loop_without_a_descriptor_is_not_watched(unwatched: None) -> None:
    class Plain:
        pass

    assert backend_descriptor(Plain()) is None  # type: ignore[arg-type]
    watch_loop(Plain())()  # type: ignore[arg-type]
    assert priority._watched is None and not loop_waiting()


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
