"""A request's store calls, each waited for at most a deadline, with a known outcome.

A database that stops answering without refusing (its processes frozen, a host that
drops packets) keeps a driver call blocked until some TCP or server timeout fires,
seconds to minutes later; the server's own ``statement_timeout`` cannot fire either,
since the server is what is frozen. An admin or a dashboard waiting that long sees a
hung page. So while a request is served (``StoreDeadline.serving``), every call into a
store runs on a worker thread of the deadline's own and the request waits for it at
most ``deadline_s``; past it the request gets ``StoreTimeout`` (503, with Retry-After)
and the call is *abandoned*: it goes on where it is, but the engine's hooks
(``StoreDeadline.watch``) refuse its next statement and its commit. So the outcome of
a timed-out write is known unless its commit was already sent: a store write is one
transaction (the change and its audit entry together), and a transaction that never
commits changes nothing.

Background jobs (the configuration poller, evidence sync, the decision writer) call
the same stores outside any request and run as before, on their own threads.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Engine, event
from sqlalchemy.exc import SQLAlchemyError

T = TypeVar("T")

log = logging.getLogger("switchboard.store")

REQUEST_CONNECTIONS = 20
"""The most connections the request engine opens (``store/db.py`` ``make_engine``)."""


class StoreTimeout(SQLAlchemyError):
    """The store did not answer within the deadline. ``message`` says what that means
    for the request (nothing read, nothing changed, or a change whose commit was sent
    and may or may not be stored); ``retry_after_s`` when to try again."""

    def __init__(self, message: str, *, outcome_unknown: bool, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.outcome_unknown = outcome_unknown
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class _Serving:
    """One request being served: whether it may change anything (not GET or HEAD),
    and when it arrived (``time.monotonic()``)."""

    writes: bool
    started: float


def serving_a_write() -> bool:
    """Whether the request being served may change anything (not GET or HEAD): what a
    503 says it did not do."""
    serving = _SERVING.get()
    return serving is not None and serving.writes


@dataclass(eq=False)
class _Call:
    """One store call on a worker: ``abandoned`` once its caller stopped waiting (its
    statements and commit are refused from then on), ``committing`` once its commit
    was sent (then what it did is unknown until the store answers)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    abandoned: bool = False
    committing: bool = False


_SERVING: ContextVar[_Serving | None] = ContextVar("switchboard_store_serving", default=None)
_CALL: ContextVar[_Call | None] = ContextVar("switchboard_store_call", default=None)


class StoreDeadline:
    """The deadline of store calls made while serving a request (``deadline_s``), and
    the worker threads they run on (``workers``: as many as the engine's pool holds
    connections; a call beyond them queues, and is dropped unstarted at its deadline)."""

    def __init__(self, deadline_s: float, *, workers: int = 20) -> None:
        self.deadline_s = deadline_s
        self.workers = workers
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="store-call")
        self._lock = threading.Lock()
        self._outliving = 0  # abandoned calls still running (each holds a worker)

    @property
    def outliving(self) -> int:
        """Abandoned calls still waiting on the store."""
        return self._outliving

    @contextmanager
    def serving(self, method: str) -> Iterator[None]:
        """Mark the current context as serving a request of ``method``: store calls
        made within it (also on the threads FastAPI runs sync routes on, which copy
        the context) wait at most the deadline."""
        writes = method.upper() not in ("GET", "HEAD")
        token = _SERVING.set(_Serving(writes, time.monotonic()))
        try:
            yield
        finally:
            _SERVING.reset(token)

    def call(self, fn: Callable[[], T], what: str = "a store call") -> T:
        """``fn()`` (a store call), bounded when serving a request; as is otherwise, and
        inside a call already bounded (a store calling itself)."""
        serving = _SERVING.get()
        if serving is None or _CALL.get() is not None:
            return fn()
        if self._outliving >= self.workers:
            # every worker waits on the store already: answer now, not in deadline_s
            raise self._timeout(serving, started=False, waiting=True)
        wait_s = self.deadline_s
        if self._outliving:
            # the store is presumed hung (earlier calls are still unanswered): this
            # request's calls share one deadline from its arrival, so one queued
            # behind another's wait (the one fleet-read thread) is not held twice
            wait_s = min(wait_s, max(serving.started + self.deadline_s - time.monotonic(), 0.05))
        call = _Call()
        context = copy_context()
        context.run(_CALL.set, call)
        future: Future[T] = self._executor.submit(context.run, fn)
        try:
            return self._await(future, wait_s)
        except FutureTimeout:
            pass
        if future.cancel():
            raise self._timeout(serving, started=False) from None
        with call.lock:
            if future.done():  # it answered just now
                return future.result()
            call.abandoned = True
            committing = call.committing
        with self._lock:
            self._outliving += 1
        future.add_done_callback(self._released)
        log.warning(
            "%s did not answer within %g s: abandoned (%d waiting)",
            what,
            self.deadline_s,
            self._outliving,
        )
        raise self._timeout(serving, started=True, committing=committing) from None

    def _await(self, future: Future[T], wait_s: float) -> T:
        """The one place a request waits for its store call: a test that must decide
        which step outlives the deadline (the commit, not the statements before it)
        starts this clock at that step."""
        return future.result(wait_s)

    def _released(self, _: Future[Any]) -> None:
        with self._lock:
            self._outliving -= 1

    def _timeout(
        self,
        serving: _Serving,
        *,
        started: bool,
        committing: bool = False,
        waiting: bool = False,
    ) -> StoreTimeout:
        why = (
            f"{self._outliving} earlier calls are still waiting for it"
            if waiting
            else f"the store did not answer within {self.deadline_s:g} s"
        )
        return _timeout(
            why, self.deadline_s, writes=serving.writes, started=started, committing=committing
        )

    def watch(self, engine: Engine) -> None:
        """Refuse the statements and the commit of an abandoned call on ``engine``, and
        note when a bounded call sends its commit."""
        event.listen(engine, "before_cursor_execute", _refuse_if_abandoned)
        event.listen(engine, "commit", _committing)

    def bound(self, store: T) -> T:
        """``store`` with each public method bounded (``call``)."""
        return _Bounded(store, self)  # type: ignore[return-value]

    def close(self) -> None:
        """Stop taking calls; abandoned ones are left to end (or not) by themselves."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def write_timeout(deadline_s: float, *, started: bool, committing: bool) -> StoreTimeout:
    """What a write's request is answered when it stopped waiting for the store after
    ``deadline_s``: nothing changed (``started``: it was abandoned before committing),
    or, once its commit was sent, an outcome not known."""
    why = f"the store did not answer within {deadline_s:g} s"
    return _timeout(why, deadline_s, writes=True, started=started, committing=committing)


def _timeout(
    why: str, deadline_s: float, *, writes: bool, started: bool, committing: bool
) -> StoreTimeout:
    retry = max(1, round(deadline_s))
    if not writes:
        message = f"{why} (database frozen, overloaded or unreachable); retry shortly"
        return StoreTimeout(message, outcome_unknown=False, retry_after_s=retry)
    if committing:
        message = (
            f"{why} while committing: the change may or may not have been applied; "
            "reload to check (or retry with the same Idempotency-Key, which answers "
            "what happened)"
        )
        return StoreTimeout(message, outcome_unknown=True, retry_after_s=retry)
    done = "it was abandoned before committing" if started else "it never started"
    message = (
        f"{why} (database frozen, overloaded or unreachable): nothing was changed "
        f"({done}); retry shortly"
    )
    return StoreTimeout(message, outcome_unknown=False, retry_after_s=retry)


def _refuse_if_abandoned(*_: Any) -> None:
    call = _CALL.get()
    if call is not None and call.abandoned:
        raise StoreTimeout(
            "abandoned: its caller stopped waiting", outcome_unknown=False, retry_after_s=1
        )


def _committing(_: Any) -> None:
    call = _CALL.get()
    if call is None:
        return
    with call.lock:
        if call.abandoned:
            raise StoreTimeout(
                "abandoned before its commit: rolled back", outcome_unknown=False, retry_after_s=1
            )
        call.committing = True


class _Bounded:
    """A store whose public methods go through ``StoreDeadline.call``; everything else
    (attributes, private helpers) is the store's own."""

    def __init__(self, store: Any, deadline: StoreDeadline) -> None:
        object.__setattr__(self, "_store", store)
        object.__setattr__(self, "_deadline", deadline)

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if name.startswith("_") or not callable(found):
            return found
        deadline = self._deadline
        what = f"{type(self._store).__name__}.{name}"

        @functools.wraps(found)
        def bounded(*args: Any, **kwargs: Any) -> Any:
            return deadline.call(lambda: found(*args, **kwargs), what)

        return bounded

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._store, name, value)

    def __repr__(self) -> str:
        return f"bounded({self._store!r})"


def store_deadline(engine: Engine, deadline_s: float) -> StoreDeadline | None:
    """The deadline for ``engine``'s request calls; None for an in-memory SQLite
    database, whose one connection lives on the thread that opened it (a worker
    thread would see another, empty database) and which cannot hang on anything."""
    if engine.dialect.name == "sqlite" and (engine.url.database or ":memory:") == ":memory:":
        return None
    # as many workers as the request engine has connections (``make_engine``: 10 + 10
    # on PostgreSQL, SQLAlchemy's 5 + 10 on SQLite): a worker beyond them would only
    # wait for a connection, a wait the pool bounds by the same deadline
    return StoreDeadline(deadline_s, workers=REQUEST_CONNECTIONS)
