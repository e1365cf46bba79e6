"""One call at a time on a thread of its own, waited for only so long.

A database that stops answering without refusing (its processes frozen, a network
that drops packets instead of resetting the connection) keeps a driver call blocked
until some TCP or server timeout fires, seconds to minutes later. The decision writer
must go on spilling to its local log meanwhile, so it never makes a store call on its
own thread: it hands the call to a ``CallThread`` and stops waiting after a bound. The
call goes on where it is; the writer makes no other until it has collected that one's
outcome (``collect``), so the store never sees two of its calls at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Call:
    """One call and, once ``done`` is set, its outcome: ``error`` None when it returned."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.error: BaseException | None = None


class CallThread:
    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._next: Call | None = None
        self._outliving: Call | None = None  # waited for in vain, outcome not collected
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """A call that outlived its wait has not been collected yet."""
        return self._outliving is not None

    def run(self, fn: Callable[[], None], wait_s: float) -> Call:
        """Run ``fn`` on the thread and wait for it at most ``wait_s``. The call is
        returned either way: ``done`` unset means it is still running (then ``busy``
        until ``collect`` has returned it)."""
        if self._outliving is not None:
            raise RuntimeError("a call is still running")
        self._ensure_thread()
        call = Call(fn)
        with self._cond:
            self._next = call
            self._cond.notify()
        if not call.done.wait(wait_s):
            self._outliving = call
        return call

    def collect(self) -> Call | None:
        """The call that outlived its wait, once it has finished (then no longer
        ``busy``); None while it runs, or when there is none."""
        call = self._outliving
        if call is None or not call.done.is_set():
            return None
        self._outliving = None
        return call

    def _ensure_thread(self) -> None:
        if self._thread is None:
            # a daemon: a call blocked on a dead database must not keep the process alive
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._next is None:
                    self._cond.wait()
                call, self._next = self._next, None
            try:
                call.fn()
            except BaseException as exc:  # handed to the caller, which decides
                call.error = exc
            call.done.set()
