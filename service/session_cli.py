"""``switchboard session list|revoke``: the signed-in people's sessions, for an admin
at the service's database (as ``switchboard token`` works on tokens): who is signed
in with which groups and rights, and ending a session or every session of a person.
A revoked session is refused by every replica at its next request, and its open
change streams close within seconds."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def add_session(
    sub: Any,
    epilog: str,
    formatter: type[argparse.HelpFormatter],
    open_people: Callable[[], Any],
) -> None:
    """The ``session`` command and its subcommands on ``sub`` (``build_parser``'s);
    ``open_people``: the service's ``People`` on its database (None: it said why)."""
    session = sub.add_parser(
        "session",
        help="list and revoke people's sign-in sessions",
        description="List the sessions of people signed in through the identity provider, "
        "or end them (the person is signed out on every replica; their open change streams "
        "close within seconds). Works on the service's database, like `switchboard token`.",
        epilog=epilog,
        formatter_class=formatter,
    )
    ssub = session.add_subparsers(dest="session_command", required=True)
    ssub.add_parser("list", help="list live sessions: id, subject, e-mail, role, groups")
    revoke = ssub.add_parser("revoke", help="end a session by id, or every session of a subject")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("id", nargs="?", help="the session's id as `session list` shows it")
    which.add_argument("--subject", help="end every session of this subject")
    session.set_defaults(func=lambda args: run_session(args, open_people))


def run_session(args: argparse.Namespace, open_people: Callable[[], Any]) -> int:
    """List or revoke; exit 0, 1 when nothing matched, 2 on a usage or store error."""
    import re

    people = open_people()
    if people is None:
        return 2
    if args.session_command == "list":
        for s in people.list_sessions():
            groups = ",".join(s["groups"] or []) or "-"
            scope = ",".join(s["clusters"] or []) or "*"
            role = s["role"] or "none (no group mapped)"
            print(
                f"{s['id']}\t{s['subject']}\t{s['email'] or '-'}\t{role}\t{scope}\t"
                f"{groups}\tuntil {s['expires_at']}"
            )
        return 0
    if args.id is not None and not re.fullmatch(r"[0-9a-f]{12,64}", args.id):
        print(
            f"switchboard session: {args.id!r} is not a session id (12 hex digits or more, "
            "as `switchboard session list` shows)",
            file=sys.stderr,
        )
        return 2
    ended = people.revoke(session=args.id) if args.id else people.revoke(subject=args.subject)
    what = f"session {args.id}" if args.id else f"sessions of {args.subject}"
    if ended == 0:
        print(f"switchboard session: no live {what}", file=sys.stderr)
        return 1
    print(f"switchboard session: ended {ended} {what}", file=sys.stderr)
    return 0
