"""The HTTP server's own limits: what a client can make the event loop, and the process's
file descriptors, do before any route (or token check) runs.

uvicorn's httptools protocol bounds none of these. One client sending a 64 MB header to
``/healthz`` kept the event loop busy concatenating it (quadratic); a client that never
finished its headers, or its body, held its connection for as long as it liked. 1,100
clients each sending a byte of a 60,000-byte body every 5 s held every descriptor of a
1,024 limit: ``accept()`` failed, libuv's answer to that is to accept and close whatever
is queued, and 598 of 599 selects on new connections failed. Two layers bound them:

- the body's read time is ASGI middleware (service/api/body_deadline.py): a documented
  interface, any ASGI server keeps it;
- header size, header read time and the connection limit (with a newcomer taking the
  place of the connection that has waited longest on its client) must act before a
  request's headers are read, where no server setting reaches: they are uvicorn's
  httptools protocol subclassed, in one module pinned to the uvicorn versions it was
  checked against (service/api/uvicorn_guard.py).

Connections the server closes before an answer are counted in
``switchboard_connections_closed_total{reason}``; clients that go away before their
answer in ``switchboard_client_disconnects_total`` (service/api/conn_events.py). Idle
keep-alive connections are uvicorn's own ``timeout_keep_alive`` (5 s).
"""

from __future__ import annotations

import logging
import resource
from typing import Any

from mla_switchboard.service.api.body_deadline import BodyDeadline
from mla_switchboard.service.api.conn_events import ConnectionEvents
from mla_switchboard.service.api.conn_limits import Limits
from mla_switchboard.service.config import Settings
from starlette.types import ASGIApp

# descriptors kept free of connections: the database pool (PostgreSQL: 20; SQLite: a
# few files per connection), log and spill files, the listening socket, the event loop's
# own, and room for a burst that libuv accepts before any connection is counted
FD_RESERVE = 100

log = logging.getLogger("switchboard.server")


def descriptor_limit() -> int | None:
    """The process's soft limit on open descriptors (None: unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def effective_max_connections(configured: int, fd_limit: int | None) -> int:
    """``configured``, or less when the descriptor limit cannot hold that many
    connections beside the database pool and files (``FD_RESERVE``)."""
    if fd_limit is None:
        return configured
    return max(1, min(configured, fd_limit - FD_RESERVE))


def with_limits(app: ASGIApp, settings: Settings, events: ConnectionEvents) -> ASGIApp:
    """``app`` behind the limits that are plain ASGI (the body's read time)."""
    return BodyDeadline(app, settings.body_timeout_s, events)


def server_options(settings: Settings, events: ConnectionEvents) -> dict[str, Any]:
    """The ``uvicorn.run`` keyword arguments that bound what a client can hold."""
    fd_limit = descriptor_limit()
    max_connections = effective_max_connections(settings.max_connections, fd_limit)
    if max_connections < settings.max_connections:
        log.warning(
            "SWITCHBOARD_MAX_CONNECTIONS=%d does not fit the descriptor limit (ulimit -n %d, "
            "%d kept for the database and files): at most %d connections",
            settings.max_connections,
            fd_limit,
            FD_RESERVE,
            max_connections,
        )
    try:
        from mla_switchboard.service.api.uvicorn_guard import GuardedProtocol
    except ImportError:  # no httptools: h11 bounds the header buffer by itself
        return {
            "http": "h11",
            "h11_max_incomplete_event_size": settings.max_header_bytes,
            "limit_concurrency": max_connections,
        }
    limits = Limits(settings.max_header_bytes, settings.header_timeout_s, max_connections, events)
    return {"http": guard_protocol(GuardedProtocol, limits)}


def guard_protocol(base: type[Any], limits: Limits[Any]) -> type[Any]:
    """A subclass of the guarded protocol ``base`` whose connections share ``limits``
    (one class per server, for ``uvicorn.Config(http=)``)."""
    if limits.events.metrics is not None:
        limits.events.metrics.connections_open.set_function(lambda: len(limits.opened))
    return type(base.__name__, (base,), {"limits": limits})
