"""The ``switchboard`` program: hands each command to the part of the package that has it.

``select`` and ``bench`` are the agent's (a GPU pod's plain install runs them);
``serve``, ``token`` and ``health`` are the service's, run only where the server extra
is installed, and otherwise answered with the extra to install instead of a traceback
from deep inside the service. This module sits above both parts so that neither knows
about the other: the agent never imports the service, by name or by string
(``tests/core/test_layout.py``). Each command's module is imported only when that
command runs, so a plain install never loads the service, and ``switchboard --help``
loads neither.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["COMMANDS", "SERVER_MODULES", "Command", "Runner", "main"]


Runner = Callable[[Sequence[str]], int]


def _select() -> Runner:
    from mla_switchboard.agent.commands.select import select_main

    return select_main


def _bench() -> Runner:
    from mla_switchboard.agent.commands.bench import bench_main

    return bench_main


def _service() -> Runner:
    """The service's own command line; it is given the whole argv (it parses the
    command name itself)."""
    from mla_switchboard.service.cli import main as service_main

    return lambda argv: int(service_main(list(argv)))


def _overrides() -> Runner:
    """``switchboard overrides``: the service's, but with httpx, pydantic and PyYAML only
    (a CI job plans without the server extra); given the whole argv."""
    from mla_switchboard.service.gitops.cli import main as overrides_main

    return overrides_main


@dataclass(frozen=True)
class Command:
    """One ``switchboard`` command: its help line, how to load it, and whether it is the
    service's (given the whole argv; needs the server extra's packages, except where
    ``needs_server_extra`` says otherwise)."""

    help: str
    load: Callable[[], Runner]
    service: bool = False
    needs_server_extra: bool = False


COMMANDS: dict[str, Command] = {
    "select": Command(
        "choose this pod's MLA prefill backend and print the engine flags for it", _select
    ),
    "bench": Command(
        "measure every backend valid on this pod and report it to the service", _bench
    ),
    "serve": Command("run the central service", _service, service=True, needs_server_extra=True),
    "token": Command("manage API tokens", _service, service=True, needs_server_extra=True),
    "session": Command(
        "list and revoke people's sign-in sessions", _service, service=True, needs_server_extra=True
    ),
    "overrides": Command(  # httpx, pydantic and PyYAML: a CI job needs no server extra
        "overrides as code: export, plan and apply a declarative file", _overrides, service=True
    ),
    "health": Command(  # httpx only: it runs in the service's container, extra or not
        "exit 0 if the local service answers /readyz (container healthcheck)",
        _service,
        service=True,
    ),
}

SERVER_MODULES = (
    "fastapi",
    "fastapi_offline",
    "pydantic_settings",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "prometheus_client",
)
"""What the ``server`` extra installs (import names; psycopg is needed for PostgreSQL
only). The plain install has the service's own modules but none of these, and a
missing one would otherwise surface as a traceback from deep inside ``serve``."""


def _missing_server_modules() -> list[str]:
    return [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]


def _top_parser() -> argparse.ArgumentParser:
    from mla_switchboard.core.version import PROGRAM, __version__

    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="MLA Switchboard: fleet-wide choice of the MLA prefill attention backend.",
        epilog="Run `switchboard COMMAND --help` for a command's flags and environment.",
    )
    parser.add_argument("--version", action="version", version=f"switchboard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help, add_help=False)
    return parser


def _run(name: str, command: Command, argv: list[str]) -> int:
    """Run one command; a service command that cannot load says which extra it needs
    (exit 2). Only loading is guarded: an import error while a command runs is its own."""
    if not command.service:
        return command.load()(argv[1:])
    missing = _missing_server_modules() if command.needs_server_extra else []
    try:
        if missing:
            raise ImportError(f"missing {', '.join(missing)}")
        runner = command.load()
    except ImportError as exc:
        print(
            f"switchboard {name}: the server extra is not installed here ({exc}); "
            "install it with: pip install 'mla-switchboard[server]'",
            file=sys.stderr,
        )
        return 2
    return runner(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``switchboard`` command: dispatch to the agent or, when installed, the service."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        return _run(args[0], COMMANDS[args[0]], args)
    _top_parser().parse_args(args)  # --help, --version or a usage error: exits
    return 2
