"""``switchboard overrides``: the declarative file from the command line.

``schema`` prints the file's JSON Schema; ``validate`` checks a file locally (with the
line of each mistake); ``export`` writes the live state as a file; ``plan`` asks the
service what the file changes and does to the fleet (exit 0: nothing, 2: changes,
1: error); ``apply`` applies it, all or nothing. Only httpx, pydantic and PyYAML are
needed: a CI job runs it without the server's packages."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from mla_switchboard.core.schemas import OverrideSpec
from mla_switchboard.core.version import PROGRAM
from mla_switchboard.service.gitops.document import (
    API_VERSION,
    KIND,
    FileRules,
    OverridesFile,
    content_revision,
    file_form,
    schema_text,
    spec_fields,
)
from mla_switchboard.service.gitops.report import FORMATS, render

URL, TOKEN, TOKEN_FILE = "SWITCHBOARD_URL", "SWITCHBOARD_TOKEN", "SWITCHBOARD_TOKEN_FILE"
EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2


class Failed(Exception):
    """What the command says on stderr before exiting 1."""


def add_overrides(sub: Any) -> None:
    """``overrides schema|validate|export|plan|apply`` on the service's parser."""
    parser = sub.add_parser(
        "overrides",
        help="overrides as code: export, plan and apply a declarative file",
        description="The fleet's rules and overrides in one reviewed file: export the live "
        "state, plan a file's changes against the recorded fleet, apply it atomically "
        "(docs/gitops.md).",
    )
    osub = parser.add_subparsers(dest="overrides_command", required=True)
    osub.add_parser("schema", help="print the file's JSON Schema")
    validate = osub.add_parser("validate", help="check a file locally (no service)")
    validate.add_argument("-f", "--file", required=True, help="the file (YAML or JSON)")
    export = osub.add_parser("export", help="write the live state as a file")
    _connection(export)
    export.add_argument("-o", "--output", default="-", help="where to write (default stdout)")
    export.add_argument(
        "--no-rules", action="store_true", help="leave the rules out (the file won't manage them)"
    )
    plan = osub.add_parser("plan", help="what the file changes (exit 0: none, 2: some, 1: error)")
    _connection(plan)
    _file_flags(plan)
    plan.add_argument("--format", choices=FORMATS, default="text", help="default text")
    apply = osub.add_parser("apply", help="apply the file, all or nothing")
    _connection(apply)
    _file_flags(apply)
    apply.add_argument(
        "--revision", default=None, help="named in the audit (default: the file's sha256 prefix)"
    )
    apply.add_argument(
        "--plan",
        default=None,
        metavar="PLAN_JSON",
        help="a saved `plan --format json`: apply only if nothing moved since it",
    )
    parser.set_defaults(func=run)


def main(argv: Sequence[str]) -> int:
    """``switchboard overrides ...`` (``argv`` from ``overrides`` on), without the rest of
    the service's parser: its ``serve`` help reads the server's settings, which a CI job
    that only plans has not installed."""
    parser = argparse.ArgumentParser(prog=PROGRAM)
    add_overrides(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(list(argv)))


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get(URL) or "http://127.0.0.1:8000")
    p.add_argument("--token", default=None, help=f"prefer ${TOKEN} or --token-file")
    p.add_argument("--token-file", default=os.environ.get(TOKEN_FILE) or None)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")


def _file_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--file", required=True, help="the file (YAML or JSON)")
    p.add_argument("--prune", action="store_true", help="remove overrides the file omits")


def run(args: argparse.Namespace) -> int:
    try:
        return _COMMANDS[args.overrides_command](args)
    except Failed as exc:
        print(f"switchboard overrides: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _schema(args: argparse.Namespace) -> int:
    sys.stdout.write(schema_text())
    return EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    document = read(args.file)
    print(f"{args.file}: valid ({len(document.overrides)} overrides)")
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    with _client(args) as c:
        overrides = _get(c, "/v1/overrides")["items"]
        rules = None if args.no_rules else _get(c, "/v1/rules")
    text = export_text(overrides, rules)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    document = read(args.file)
    with _client(args) as c:
        plan = _post(c, "/v1/plan", {"file": document.sent(), "prune": args.prune})
    sys.stdout.write(render(plan, args.format, args.file))
    return EXIT_CHANGES if plan["changed"] else EXIT_OK


def _apply(args: argparse.Namespace) -> int:
    document = read(args.file)
    body: dict[str, Any] = {"file": document.sent(), "prune": args.prune}
    with _client(args) as c:
        if args.plan is not None:
            plan = _saved_plan(args.plan)
        else:
            plan = _post(c, "/v1/plan", body)
            sys.stdout.write(render(plan, "text", args.file))
        if plan["revision"] != content_revision(document):
            raise Failed(f"{args.plan} is the plan of another file (revision {plan['revision']})")
        if not plan["changed"]:
            print("Nothing to apply: the service runs what the file says.")
            return EXIT_OK
        body |= {"etags": plan["etags"], "revision": args.revision}
        done = _post(c, "/v1/apply", body)
    counts = done["summary"]
    print(
        f"Applied revision {done['revision']}: {counts['create']} created, "
        f"{counts['update']} changed, {counts['delete']} removed."
    )
    return EXIT_OK


def _saved_plan(path: str) -> dict[str, Any]:
    try:
        plan = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise Failed(f"cannot read the plan {path}: {exc}") from None
    if not isinstance(plan, dict) or not {"etags", "revision", "changed"} <= plan.keys():
        raise Failed(f"{path} is not the output of `switchboard overrides plan --format json`")
    return plan


_COMMANDS = {
    "schema": _schema,
    "validate": _validate,
    "export": _export,
    "plan": _plan,
    "apply": _apply,
}


def read(path: str) -> OverridesFile:
    """The file, or ``Failed`` with every mistake on its own line (``path:line:col:``)."""
    _need_yaml()
    from mla_switchboard.service.gitops.lines import read_file

    try:
        text = Path(path).read_text() if path != "-" else sys.stdin.read()
    except OSError as exc:
        raise Failed(f"cannot read {path}: {exc.strerror}") from None
    found = read_file(text, path)
    if isinstance(found, OverridesFile):
        return found
    raise Failed("the file has mistakes:\n" + "\n".join(str(p) for p in found))


def export_text(overrides: Sequence[dict[str, Any]], rules: dict[str, Any] | None) -> str:
    """The live state as the file, in a stable order (a diff between two exports shows
    what changed): rules first, then overrides by scope, each field in the models'
    order and only where it is set."""
    _need_yaml()
    import yaml

    document: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
    if rules is not None:
        declared = FileRules.model_validate(
            {k: v for k, v in rules.items() if k not in ("revision", "updated_at")}
        ).model_dump(mode="json")
        declared["by_capability"] = dict(sorted(declared["by_capability"].items()))
        declared["clusters"] = dict(sorted(declared["clusters"].items()))
        document["rules"] = declared
    specs = {o["cluster"]: OverrideSpec.model_validate(spec_fields(o)) for o in overrides}
    document["overrides"] = {scope: file_form(spec) for scope, spec in sorted(specs.items())}
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)


def _need_yaml() -> None:
    """PyYAML is the one package of these commands the plain install lacks."""
    if importlib.util.find_spec("yaml") is None:
        raise Failed("reading and writing the file needs PyYAML: pip install pyyaml")


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            return Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise Failed(f"cannot read --token-file {args.token_file}: {exc.strerror}") from None
    return args.token or os.environ.get(TOKEN) or None


def _client(args: argparse.Namespace) -> httpx.Client:
    token = _token(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=args.url, headers=headers, timeout=args.timeout)


def _get(c: httpx.Client, path: str) -> dict[str, Any]:
    return _answer(_call(lambda: c.get(path)), path)


def _post(c: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    return _answer(_call(lambda: c.post(path, json=body)), path)


def _call(send: Any) -> httpx.Response:
    try:
        return send()  # type: ignore[no-any-return]
    except httpx.HTTPError as exc:
        raise Failed(f"the service did not answer: {exc}") from None


def _answer(r: httpx.Response, path: str) -> dict[str, Any]:
    if r.status_code == 200:
        return r.json()  # type: ignore[no-any-return]
    raise Failed(f"{path}: {r.status_code} {_problem(r)}")


def _problem(r: httpx.Response) -> str:
    """The service's message (``{"detail": {"message": ...}}``, or a 422's fields)."""
    try:
        detail = r.json().get("detail")
    except ValueError:
        return r.text[:500]
    if isinstance(detail, dict):
        extra = {k: v for k, v in detail.items() if k != "message"}
        return str(detail.get("message")) + (f" {json.dumps(extra)}" if extra else "")
    if isinstance(detail, list):
        return "; ".join(
            ".".join(str(p) for p in d.get("loc", ())) + f": {d.get('msg')}" for d in detail
        )
    return str(detail)
