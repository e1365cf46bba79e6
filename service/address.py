"""Whether ``serve`` can listen where it was asked to, checked before anything else.

``serve`` creates its database and may print a first admin token before uvicorn
binds the port. Were the port taken (a service already running there), the user would
be left with a new database and a token the running service does not know, and only
then told the address is in use. So the address is tried first, the way asyncio's
``create_server`` will bind it (every address the host resolves to, ``SO_REUSEADDR``,
IPv6 sockets IPv6-only), and released at once for uvicorn to bind.
"""

from __future__ import annotations

import errno
import socket

__all__ = ["listen_problem"]


def listen_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, with what to do instead; None when it can."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        return (
            f"cannot listen on {shown}: the host is not known here ({exc.strerror}); "
            "check --host or SWITCHBOARD_HOST"
        )
    held: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in addresses:
            sock = socket.socket(family, kind, proto)
            held.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        return _bind_problem(exc, host, port, shown)
    finally:
        for sock in held:
            sock.close()
    return None


def _bind_problem(exc: OSError, host: str, port: int, shown: str) -> str:
    """What a failed bind means for someone starting the service, and what to do."""
    if exc.errno == errno.EADDRINUSE:
        url_host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        url_host = f"[{url_host}]" if ":" in url_host else url_host
        return (
            f"cannot listen on {shown}: the address is already in use (another "
            "`switchboard serve`, or another program, listens there). Nothing was created. "
            "Start this one on another port (--port or SWITCHBOARD_PORT), or use the "
            f"service already running at http://{url_host}:{port}/ "
            f"(`switchboard health --port {port}` says whether it answers)"
        )
    if exc.errno == errno.EACCES:
        return (
            f"cannot listen on {shown}: permission denied (ports below 1024 need "
            "privileges); choose another port (--port or SWITCHBOARD_PORT)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {shown}: no network interface of this machine has that "
            "address; check --host or SWITCHBOARD_HOST (0.0.0.0 listens on all of them)"
        )
    return f"cannot listen on {shown}: {exc.strerror or exc}"
