"""The service's subcommands of ``switchboard``: ``serve``, ``token``, ``health`` and
``overrides`` (``service/gitops/cli.py``).

The ``switchboard`` entry point itself is :func:`mla_switchboard.cli.main`, which a
GPU pod's plain install (no server extra) can run; it hands ``serve`` and ``token`` to
:func:`main` here. ``python -m mla_switchboard.service.cli serve`` works as well.
"""

from __future__ import annotations

import argparse
import copy
import logging.config
import os
import re
import socket
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mla_switchboard.core.version import PROGRAM
from mla_switchboard.service.gitops.cli import add_overrides
from mla_switchboard.service.messages import (
    first_line,
    install_exception_redaction,
    protect,
    redact,
    shown_url,
)
from mla_switchboard.service.session_cli import add_session

if TYPE_CHECKING:
    from mla_switchboard.service.config import Settings
    from mla_switchboard.service.store import Store

# Imports stay inside the subcommands: `switchboard token list` need not load FastAPI.


def _settings() -> Settings | None:
    """The settings of the environment, or None once what is wrong with them is said on
    stderr, one line per field (``workload_issuers.0.audience: ...``), and without the
    values given: a bad entry may sit beside a secret."""
    from mla_switchboard.service.config import Settings
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        return Settings()
    except ValidationError as exc:
        for error in exc.errors(include_url=False, include_input=False):
            where = ".".join(str(part) for part in error["loc"])
            print(f"switchboard: bad setting {where}: {error['msg']}", file=sys.stderr)
    except SettingsError as exc:
        print(f"switchboard: bad setting: {exc}", file=sys.stderr)
    return None


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from mla_switchboard.service.address import listen_problem
    from mla_switchboard.service.api.app import create_app
    from mla_switchboard.service.api.conn_events import ConnectionEvents
    from mla_switchboard.service.api.server import server_options, with_limits
    from mla_switchboard.service.runtime import Runtime
    from mla_switchboard.service.store.db import StoreConfigError

    settings = _settings()
    if settings is None:
        return 2
    # before the database is created or a first token printed: neither is any use if
    # this service cannot listen (one already runs there)
    problem = listen_problem(args.host, args.port)
    if problem is not None:
        print(f"switchboard: {problem}", file=sys.stderr)
        return 1
    _protect(settings)
    log_config = _log_config()
    logging.config.dictConfig(log_config)
    try:
        runtime = Runtime(settings, serving=True)
        runtime.prepare_store()
    except StoreConfigError as exc:
        print(f"switchboard: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        # The driver's first line says what failed (refused, unknown host, bad
        # password); the rest is SQLAlchemy's link to its docs. No password: this is
        # printed at every restart of a crash loop, into whatever collects stderr.
        print(
            f"switchboard: cannot open the store at {shown_url(settings.database_url)}: "
            f"{type(exc).__name__}: {first_line(exc, 500)}",
            file=sys.stderr,
        )
        return 1
    if runtime.bootstrap_token is None and runtime.store.tokens.count_tokens() == 0:
        token = _create_token(
            runtime.store, name="initial-admin", role="admin", clusters=None, actor="serve"
        )
        url = f"http://{args.host}:{args.port}/"
        print(
            "switchboard: first start, no token configured. Created an admin token; it is "
            "shown once, keep it:\n\n    " + token + "\n\n"
            f"Sign in to the dashboard at {url} with it, and give it to the command line "
            "and scripts as SWITCHBOARD_TOKEN\n(export SWITCHBOARD_TOKEN=...). For pods, "
            "create agent tokens: switchboard token create --role agent --name <fleet>\n",
            file=sys.stderr,
            flush=True,
        )
    events = ConnectionEvents(runtime.metrics)
    uvicorn.run(
        with_limits(create_app(runtime=runtime), settings, events),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        timeout_graceful_shutdown=10,
        log_config=log_config,
        **proxy_options(settings),
        **server_options(settings, events),
    )
    return 0


def proxy_options(settings: Settings) -> dict[str, Any]:
    """Whose ``X-Forwarded-For`` is believed, as the service's own setting: uvicorn
    would otherwise take its ``FORWARDED_ALLOW_IPS`` variable or its default, which
    differs between releases (``127.0.0.1`` alone, later also ``::1``)."""
    ips = [part.strip() for part in settings.forwarded_allow_ips.split(",") if part.strip()]
    return {"proxy_headers": True, "forwarded_allow_ips": ips}


def _create_token(
    store: Store, *, name: str, role: str, clusters: list[str] | None, actor: str = "cli"
) -> str:
    """A new token, its creator recorded as ``actor``: the command that made it (the
    token list and the audit say "by serve" for the first admin token, "by cli" for
    ``token create``)."""
    from mla_switchboard.service.identity.auth import new_token

    token_id, token, secret_hash = new_token()
    store.tokens.create_token(
        token_id=token_id,
        name=name,
        role=role,
        clusters=clusters,
        secret_hash=secret_hash,
        actor=actor,
    )
    return token


def _open_store(settings: Settings) -> Store:
    """The store alone, migrated and seeded: a token command reads and writes rows and
    needs none of the running service (its recorder, evidence or background loops),
    so it starts in a fraction of the time ``Runtime`` takes."""
    from mla_switchboard.service.store import Store
    from mla_switchboard.service.store.db import make_engine, migrate

    engine = make_engine(settings.database_url)
    migrate(engine)
    store = Store(engine)
    store.config.ensure_seeded()
    return store


def _local_store(command: str, subcommand: str, *, create: bool) -> tuple[Settings, Store] | None:
    """The service's own database, for the commands that work on it directly (``token``,
    ``session``): says which one it uses; None, with why on stderr, when it must not be
    opened (``_store_problem``) or cannot be."""
    from mla_switchboard.service.config import Settings
    from mla_switchboard.service.store.db import StoreConfigError

    settings = Settings()
    _protect(settings)
    url = settings.database_url
    # stderr, so that `TOKEN=$(switchboard token create ...)` still captures the token only
    print(f"switchboard: using database {shown_url(url)}", file=sys.stderr)
    problem = _store_problem(url, create=create, command=subcommand)
    if problem is not None:
        print(f"switchboard {command}: {problem}", file=sys.stderr)
        return None
    try:
        return settings, _open_store(settings)
    except StoreConfigError as exc:
        print(f"switchboard {command}: {exc}", file=sys.stderr)
        return None


def _people() -> Any:
    """The service's ``People`` on its database, for ``switchboard session``; None (and
    why, on stderr) when there is no such database."""
    from datetime import timedelta

    from mla_switchboard.service.identity.people import People

    opened = _local_store("session", "session", create=False)
    if opened is None:
        return None
    settings, store = opened
    return People(
        store.sessions, settings.oidc_role_mapping, timedelta(hours=settings.session_hours)
    )


def _token(args: argparse.Namespace) -> int:
    opened = _local_store("token", args.token_command, create=getattr(args, "create", False))
    if opened is None:
        return 2
    _, store = opened
    if args.token_command == "create":
        token = _create_token(store, name=args.name, role=args.role, clusters=args.clusters)
        print(token)
        return 0
    if args.token_command == "revoke":
        token_id = _token_id(args.id)
        if token_id is None:
            print(
                f"switchboard: {_masked(args.id)!r} is not a token id (12 hex digits, the "
                "part after sb_ that `token list` shows)",
                file=sys.stderr,
            )
            return 2
        if not store.tokens.revoke_token(token_id, actor="cli"):
            print(f"switchboard: no active token with id {token_id}", file=sys.stderr)
            return 1
        print(f"switchboard: revoked token {token_id}", file=sys.stderr)
        return 0
    for t in store.config.load_config().tokens.values():
        state = "revoked" if t.revoked else "active"
        scope = ",".join(t.clusters) if t.clusters else "*"
        print(f"{t.id}\t{t.name}\t{t.role}\t{scope}\t{state}")
    return 0


def _token_id(given: str) -> str | None:
    """The token id ``token revoke`` was given: an id, or a whole ``sb_<id>_<secret>``
    token pasted instead (its id; the secret is never printed back). None: neither."""
    parts = given.strip().split("_", 2)
    candidate = parts[1] if len(parts) == 3 and parts[0] == "sb" else given.strip()
    return candidate if re.fullmatch(r"[0-9a-f]{12}", candidate) else None


def _masked(given: str) -> str:
    """``given`` as an error may echo it: a token id is short, anything longer may be a
    whole token pasted with a typo, whose secret must not reach a terminal or a log."""
    text = redact(given.strip())
    if len(text) <= 16 and "_" not in text.strip("_"):
        return text
    return text[:6] + "..." if len(text) > 6 else "..."


def _store_problem(url: str, *, create: bool, command: str = "create") -> str | None:
    """Why ``switchboard token COMMAND`` must not open the database at ``url``, or None.

    The token commands work on the service's own database. Run from another directory
    (or with the variable unset) they used to create a fresh ``./switchboard.db``
    silently, print a token, and that token then got 401 from the running service,
    which reads a different file. Only ``serve`` creates a database; here ``token
    create --create`` says the operator means it. Listing or revoking in a database
    that does not exist yet has nothing to act on, so only ``create`` offers it.
    """
    from mla_switchboard.service.store.db import StoreConfigError, make_engine
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url

    or_create = ", or pass --create to create it here" if command == "create" else ""

    try:
        parsed = make_url(url)
    except Exception:
        return f"SWITCHBOARD_DATABASE_URL {shown_url(url)!r} is not a database URL"
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database or ":memory:"
        if db == ":memory:":
            return (
                "SWITCHBOARD_DATABASE_URL names an in-memory SQLite database: a token "
                "stored there is gone when this command exits"
            )
        path = Path(db).expanduser().resolve()
        if create or (path.is_file() and path.stat().st_size > 0):
            return None
        return (
            f"no database at {path}{_what_is_lost(command)}. Point "
            "SWITCHBOARD_DATABASE_URL at the service's database (`switchboard serve` "
            f"creates it on its first start){or_create}"
        )
    if create:
        return None
    try:
        engine = make_engine(url)
    except StoreConfigError as exc:
        return str(exc)
    try:
        with engine.connect() as conn:
            migrated = inspect(conn).has_table("alembic_version")
    except Exception as exc:
        first = first_line(exc, 300)
        return f"cannot connect to {shown_url(url)}: {type(exc).__name__}: {first}"
    finally:
        engine.dispose()
    if not migrated:
        return (
            f"{shown_url(url)} holds no Switchboard tables: point SWITCHBOARD_DATABASE_URL at "
            "the service's database (`switchboard serve` creates the tables on its first "
            f"start){or_create}"
        )
    return None


def _what_is_lost(command: str) -> str:
    """Why a missing database matters to ``token COMMAND``."""
    if command == "create":
        return ": the token would go into a new empty database that no running service reads"
    return ": there are no tokens to " + ("revoke" if command == "revoke" else "list")


def _log_config() -> dict[str, Any]:
    """uvicorn's logging, with the service's own loggers (``switchboard.*``, the
    database driver's) on the same stderr handler and format, levels shown
    (``WARNING:  ...``); they went to Python's last-resort handler before, which
    prints the message alone, so an error could not be told from a warning."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["root"] = {"handlers": ["default"], "level": "WARNING"}
    return config


def _protect(settings: Settings) -> None:
    """Keep the database password and the admin token out of everything printed or
    logged from here on (service/messages.py)."""
    token = settings.admin_token.get_secret_value() if settings.admin_token else None
    protect(settings.database_url, token)


def _port(text: str) -> int:
    """A TCP port, from --port or SWITCHBOARD_PORT (argparse applies it to both)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a port (1-65535; from --port or SWITCHBOARD_PORT)"
        )
    return port


def _health(args: argparse.Namespace) -> int:
    """Standard library only: it runs every few seconds inside the container."""
    import urllib.error
    import urllib.request

    url = f"http://{args.host}:{args.port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        print(f"switchboard health: {_unanswered(url, reason, args)}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"switchboard health: {url} answered {status}", file=sys.stderr)
        return 1
    return 0


def _unanswered(url: str, reason: object, args: argparse.Namespace) -> str:
    """Why nothing answered at ``url``, in words, and where to look next (urllib's own
    text is ``<urlopen error [Errno 111] Connection refused>``)."""
    if isinstance(reason, ConnectionRefusedError):
        return (
            f"connection refused at {url}: is the service running, and on port {args.port}? "
            "(`switchboard serve` starts it; --port or SWITCHBOARD_PORT names the port)"
        )
    if isinstance(reason, TimeoutError):
        return (
            f"no answer from {url} within {args.timeout:g} s (--timeout): the service is "
            "running but busy or stuck, or something else listens on the port"
        )
    if isinstance(reason, socket.gaierror):
        return f"cannot find the host {args.host!r} of {url}: {reason.strerror} (--host)"
    text = getattr(reason, "strerror", None) or str(reason)
    return f"cannot reach {url}: {text}"


def _environment_help(names: Sequence[str] | None = None) -> str:
    """The ``SWITCHBOARD_*`` variables a subcommand reads, from ``Settings`` itself, so
    that the help text cannot drift from what the service really reads."""
    from mla_switchboard.service.config import Settings

    entries: list[tuple[str, str]] = []
    for name, field in Settings.model_fields.items():
        if names is not None and name not in names:
            continue
        if field.default_factory is not None:
            default = "empty"
        else:
            default = "unset" if field.default is None else repr(field.default)
        entries.append((f"SWITCHBOARD_{name.upper()}", f"{field.description} (default {default})"))
    if names is None:  # serve's own two
        entries.append(("SWITCHBOARD_HOST", "default for --host"))
        entries.append(("SWITCHBOARD_PORT", "default for --port"))
    width = max(len(variable) for variable, _ in entries)
    lines = ["environment variables read:"]
    for variable, text in entries:
        lines += textwrap.wrap(
            text,
            width=max(100, width + 60),
            initial_indent=f"  {variable:<{width}}  ",
            subsequent_indent=" " * (width + 4),
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def _clusters(parser: argparse.ArgumentParser, clusters: list[str] | None) -> list[str] | None:
    """``--clusters`` checked by the same rules as ``POST /v1/tokens``."""
    from mla_switchboard.core.names import validate_cluster_globs

    if clusters is None:
        return None
    try:
        return validate_cluster_globs(clusters)
    except ValueError as exc:
        parser.error(f"argument --{exc}")
    return None  # unreachable: error() exits


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM, description="MLA Switchboard: fleet-wide MLA prefill backend choice"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    _add_health(sub)
    add_overrides(sub)
    create = _add_token(sub)
    add_session(sub, _environment_help(["database_url", "oidc_role_mapping"]), _RAW, _people)
    parser.set_defaults(create_parser=create)
    return parser


_Subparsers = Any  # argparse's _SubParsersAction, private to argparse
_RAW = argparse.RawDescriptionHelpFormatter


def _add_serve(sub: _Subparsers) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the service (uvicorn)",
        description="Run the Switchboard service: the API, the dashboard at / and the API "
        "docs at /docs. Creates and migrates the database on its first start; with no "
        "token configured it creates an admin token and prints it once on stderr.",
        epilog=_environment_help(),
        formatter_class=_RAW,
    )
    serve.add_argument(
        "--host",
        default=os.environ.get("SWITCHBOARD_HOST") or "127.0.0.1",
        help="bind address (default $SWITCHBOARD_HOST, else 127.0.0.1)",
    )
    serve.add_argument(
        "--port",
        type=_port,
        default=os.environ.get("SWITCHBOARD_PORT") or "8000",
        help="port (default $SWITCHBOARD_PORT, else 8000)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default info)",
    )
    serve.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="log every request (default off: the hot path is /v1/select)",
    )
    serve.set_defaults(func=_serve)


def _add_health(sub: _Subparsers) -> None:
    health = sub.add_parser(
        "health",
        help="exit 0 if the local service answers /readyz with 200 (container healthcheck)",
        description="Ask http://HOST:PORT/readyz once; exit 0 on 200, 1 otherwise. The "
        "container image's HEALTHCHECK runs it, so that it follows SWITCHBOARD_PORT.",
        epilog="environment variables read:\n"
        "  SWITCHBOARD_PORT        the port to ask (default 8000)",
        formatter_class=_RAW,
    )
    health.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    health.add_argument(
        "--port",
        type=_port,
        default=os.environ.get("SWITCHBOARD_PORT") or "8000",
        help="default $SWITCHBOARD_PORT, else 8000",
    )
    health.add_argument("--timeout", type=float, default=2.0, help="seconds (default 2)")
    health.set_defaults(func=_health)


def _glob_rule() -> str:
    from mla_switchboard.core.names import cluster_rule

    return cluster_rule(wildcards=True)


def _add_token(sub: _Subparsers) -> argparse.ArgumentParser:
    """``token create|revoke|list``; returns ``create``'s parser (``--clusters`` errors)."""
    token = sub.add_parser(
        "token",
        help="manage API tokens directly in the database",
        description="Create, list and revoke API tokens in the service's database, without "
        "the API (for the first tokens, or when no admin token is at hand). Says which "
        "database it uses and refuses to create a new one unless `token create --create` "
        "is given.",
        epilog=_environment_help(["database_url"]),
        formatter_class=_RAW,
    )
    tsub = token.add_subparsers(dest="token_command", required=True)
    create = _token_command(
        tsub,
        "create",
        "create a token and print it once",
        "Create a token and print it once on stdout.",
    )
    create.add_argument("--role", required=True, choices=["agent", "viewer", "admin"])
    create.add_argument("--name", default=None, help="who holds it (default: <role>-token)")
    create.add_argument(
        "--clusters",
        nargs="*",
        default=None,
        metavar="GLOB",
        help="limit the token to these cluster globs, e.g. 'prod-*' (each "
        f"{_glob_rule()}): any role: an agent token then selects and reports only "
        "for pods of those clusters, a viewer token sees only them, an admin token "
        "changes only theirs; default: every cluster",
    )
    create.add_argument(
        "--create",
        action="store_true",
        help="create the database if it does not exist yet (otherwise refused: only "
        "`switchboard serve` creates one)",
    )
    revoke = _token_command(
        tsub,
        "revoke",
        "revoke a token by id",
        "Revoke a token by its id (the part after sb_, as `token list` shows).",
    )
    revoke.add_argument("id")
    _token_command(
        tsub,
        "list",
        "list tokens (never their secrets)",
        "List tokens: id, name, role, cluster limit, state. Never the secrets.",
    )
    token.set_defaults(func=_token)
    return create


def _token_command(
    tsub: _Subparsers, name: str, help_text: str, description: str
) -> argparse.ArgumentParser:
    """A ``token`` subcommand, whose help ends with the variable naming the database
    it opens. Each adds only its own options: ``--create`` is ``create``'s alone."""
    command: argparse.ArgumentParser = tsub.add_parser(
        name,
        help=help_text,
        description=description,
        epilog=_environment_help(["database_url"]),
        formatter_class=_RAW,
    )
    return command


def main(argv: Sequence[str] | None = None) -> int:
    # an uncaught exception (the main thread's, a server thread's) is printed by Python
    # itself, not logged: redacted from the start, like every log line
    install_exception_redaction()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "name", "") is None:
        args.name = f"{args.role}-token"
    if getattr(args, "token_command", None) == "create":
        args.clusters = _clusters(args.create_parser, args.clusters)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
