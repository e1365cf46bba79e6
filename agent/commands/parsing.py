"""Reading the agent's command line: the flag types, the flags both commands share,
and the PodSpec they describe.

``select`` and ``bench`` describe the same pod with one group of flags
(:func:`add_pod_arguments`) that becomes one :class:`~mla_switchboard.agent.pod.PodSpec`
(:func:`pod_spec_from`). A bad flag is exit code 2 with the flag named, never a
traceback and never a call to the service.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mla_switchboard.agent.settings import (
    CLUSTER,
    ENGINE,
    ENVIRONMENT,
    NODE,
    POD,
    TOKEN,
    TOKEN_FILE,
    URL,
    AgentSettings,
)

if TYPE_CHECKING:  # imported when a flag is parsed
    from mla_switchboard.agent.pod import PackagesArg, PodSpec
    from mla_switchboard.core.schemas import EngineInfo

__all__ = [
    "ENVIRONMENT",
    "POD_ENVIRONMENT",
    "Parser",
    "add_pod_arguments",
    "add_url_argument",
    "command_parser",
    "environment_epilog",
    "parse_args",
    "pod_spec_from",
    "positive_float",
    "positive_int",
    "url_list",
]

POD_ENVIRONMENT = (URL, TOKEN, CLUSTER, NODE, POD, ENGINE)
"""What every pod command reads: the service, and the pod's own description."""


def environment_epilog(names: Sequence[str]) -> str:
    """The ``--help`` epilog listing the variables ``names`` a command reads."""
    width = max(len(n) for n in names)
    lines = [f"  {n.ljust(width)}  {ENVIRONMENT[n]}" for n in names]
    return "environment variables read:\n" + "\n".join(lines)


def command_parser(prog: str, description: str, environment: Sequence[str]) -> Parser:
    """A command's parser, whose ``--help`` ends with the variables it reads."""
    return Parser(
        prog=prog,
        description=description,
        epilog=environment_epilog(environment),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


class _ArgumentError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """Raise instead of exiting, so that the commands return their exit code."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgumentError(message)


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace | int:
    """Parsed arguments, or the exit code: 2 for a bad flag (usage and the error, which
    names the flag, on stderr), 0 after --help."""
    try:
        return parser.parse_args(list(argv))
    except _ArgumentError as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)


# ------------------------------------------------------------------ flag types


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _urls(text: str) -> list[str]:
    """``--url``: checked when parsed, so a URL without a scheme is refused at once
    (exit 2) rather than retried for the whole deadline."""
    from mla_switchboard.agent.client import parse_urls

    try:
        return parse_urls(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--url: ")) from None


def packages_flag(text: str) -> PackagesArg:
    from mla_switchboard.agent.pod import parse_packages

    try:
        return parse_packages(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _engine(text: str) -> EngineInfo:
    from mla_switchboard.agent.engine import parse_engine

    try:
        return parse_engine(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _engine_help() -> str:
    from mla_switchboard.core.engine_names import OWN_ENGINE, detection_order

    engines = detection_order()
    named = ", ".join(f"{e.name}==X" for e in engines)
    order = ", then ".join(e.display for e in engines)
    return (
        f"serving engine that runs the backend: {named}, or {OWN_ENGINE} (our own kernels); "
        f"default ${ENGINE}, else detected from the installed packages ({order} "
        f"first), else {OWN_ENGINE}"
    )


# ------------------------------------------------------------- shared flags


def add_pod_arguments(parser: argparse.ArgumentParser) -> None:
    """The one group of flags that describes the pod, shared by ``select`` and ``bench``
    (and turned into a PodSpec by :func:`pod_spec_from`)."""
    what = parser.add_argument_group("the model and the pod")
    what.add_argument("--model", metavar="PATH", help="config.json or model directory")
    what.add_argument("--cluster", help=f"cluster name (default: ${CLUSTER})")
    what.add_argument(
        "--dtype", help="bfloat16, float16 or float32 (default: the config's, else bfloat16)"
    )
    for flag in ("qk-nope-head-dim", "qk-rope-head-dim", "v-head-dim", "num-heads"):
        what.add_argument(f"--{flag}", type=int, metavar="N", help="override the config")
    what.add_argument("--model-name", help="model name sent to the service (overrides match it)")
    what.add_argument("--node", help=f"node name (default: ${NODE})")
    what.add_argument(
        "--pod",
        help=f"pod name (default: ${POD}, else the pod the --token-file's service-account "
        "token names, else the hostname)",
    )
    what.add_argument("--engine", type=_engine, metavar="NAME[==VERSION]", help=_engine_help())


def add_url_argument(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--url",
        action="append",
        type=_urls,
        metavar="URL",
        help="service URL with its scheme (http://host:port), repeatable or comma-separated, "
        f"tried in turn (default: ${URL})",
    )
    group.add_argument(
        "--token",
        metavar="TOKEN",
        help=f"bearer token with the agent role (default: ${TOKEN}). A flag's value is "
        "visible to every user of the machine (ps, /proc) and stays in shell history: "
        f"prefer ${TOKEN} or --token-file",
    )
    group.add_argument(
        "--token-file",
        metavar="PATH",
        help=f"read the bearer token from PATH at each request (default: ${TOKEN_FILE}), "
        "e.g. the pod's projected service-account token; when the file cannot be read, "
        f"--token or ${TOKEN} is sent instead",
    )


def settings_from(args: argparse.Namespace) -> AgentSettings:
    """The environment's settings, with ``--token`` and ``--token-file`` in place of
    ``SWITCHBOARD_TOKEN`` and ``SWITCHBOARD_TOKEN_FILE`` when given."""
    settings = AgentSettings.from_environ()
    given = {
        field: value
        for field, value in (
            ("token", getattr(args, "token", None)),
            ("token_file", getattr(args, "token_file", None)),
        )
        if value
    }
    return dataclasses.replace(settings, **given) if given else settings


def pod_spec_from(args: argparse.Namespace) -> PodSpec:
    """The PodSpec the parsed flags describe (flags ``bench`` lacks stay None)."""
    from mla_switchboard.agent.pod import PodSpec

    return PodSpec(
        model=args.model,
        cluster=args.cluster,
        dtype=args.dtype,
        qk_nope_head_dim=args.qk_nope_head_dim,
        qk_rope_head_dim=args.qk_rope_head_dim,
        v_head_dim=args.v_head_dim,
        num_heads=args.num_heads,
        model_name=args.model_name,
        node=args.node,
        pod=args.pod,
        engine=args.engine,
        requested_backend=getattr(args, "requested", None),
        strict=getattr(args, "strict", False),
        capability=getattr(args, "capability", None),
        device_name=getattr(args, "device_name", None),
        packages=getattr(args, "packages", None),
    )


def url_list(args: argparse.Namespace) -> list[str] | None:
    """The ``--url`` values flattened; None when no flag was given (the env decides)."""
    return [u for urls in args.url for u in urls] if args.url else None
