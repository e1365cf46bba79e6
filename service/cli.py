"""The service's subcommands of ``switchboard``: ``serve`` and ``token``.

The ``switchboard`` entry point itself is :func:`mla_switchboard.agent.cli.main`, which a
GPU pod's plain install (no server extra) can run; it hands ``serve`` and ``token`` to
:func:`main` here. ``python -m mla_switchboard.service.cli serve`` works as well.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mla_switchboard.service.runtime import Runtime

# Imports stay inside the subcommands: `switchboard token list` need not load FastAPI.


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from mla_switchboard.service.api.app import create_app
    from mla_switchboard.service.config import Settings
    from mla_switchboard.service.runtime import Runtime
    from mla_switchboard.service.store.db import StoreConfigError

    settings = Settings()
    try:
        runtime = Runtime(settings)
        runtime.prepare_store()
    except StoreConfigError as exc:
        print(f"switchboard: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(
            f"switchboard: cannot open the store at {settings.database_url}: "
            f"{type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return 1
    if runtime.bootstrap_token is None and runtime.store.count_tokens() == 0:
        token = _create_token(runtime, name="initial-admin", role="admin", clusters=None)
        print(
            "switchboard: first start, no token configured. Created an admin token; it is "
            "shown once, keep it:\n\n    " + token + "\n",
            file=sys.stderr,
            flush=True,
        )
    uvicorn.run(
        create_app(runtime=runtime),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        timeout_graceful_shutdown=10,
    )
    return 0


def _create_token(runtime: Runtime, *, name: str, role: str, clusters: list[str] | None) -> str:
    from mla_switchboard.service.auth import new_token

    token_id, token, secret_hash = new_token()
    runtime.store.create_token(
        token_id=token_id,
        name=name,
        role=role,
        clusters=clusters,
        secret_hash=secret_hash,
        actor="cli",
    )
    return token


def _token(args: argparse.Namespace) -> int:
    from mla_switchboard.service.config import Settings
    from mla_switchboard.service.runtime import Runtime

    runtime = Runtime(Settings())
    runtime.prepare_store()
    if args.token_command == "create":
        token = _create_token(
            runtime, name=args.name, role=args.role, clusters=args.clusters or None
        )
        print(token)
        return 0
    if args.token_command == "revoke":
        ok = runtime.store.revoke_token(args.id, actor="cli")
        if not ok:
            print(f"switchboard: no active token with id {args.id!r}", file=sys.stderr)
            return 1
        return 0
    for t in runtime.store.load_config().tokens.values():
        state = "revoked" if t.revoked else "active"
        scope = ",".join(t.clusters) if t.clusters else "*"
        print(f"{t.id}\t{t.name}\t{t.role}\t{scope}\t{state}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard", description="MLA Switchboard: fleet-wide MLA prefill backend choice"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the service (uvicorn)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    serve.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=False)
    serve.set_defaults(func=_serve)

    token = sub.add_parser("token", help="manage API tokens directly in the database")
    tsub = token.add_subparsers(dest="token_command", required=True)
    create = tsub.add_parser("create", help="create a token and print it once")
    create.add_argument("--role", required=True, choices=["agent", "viewer", "admin"])
    create.add_argument("--name", default=None, help="who holds it (default: <role>-token)")
    create.add_argument(
        "--clusters", nargs="*", default=None, metavar="GLOB", help="limit to these cluster globs"
    )
    revoke = tsub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id")
    tsub.add_parser("list", help="list tokens (never their secrets)")
    token.set_defaults(func=_token)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if getattr(args, "name", "") is None:
        args.name = f"{args.role}-token"
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
