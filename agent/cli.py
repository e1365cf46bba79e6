"""``switchboard select`` and ``switchboard bench``: the agent's command line.

``select`` prints the decision for the serving engine; ``bench`` measures every
backend valid on this pod and reports the numbers (``agent/bench/`` says how);
``select --measure`` does the second within a time budget before the first. Both
describe the pod with one shared group of flags (:func:`add_pod_arguments`) that
becomes one :class:`~mla_switchboard.agent.pod.PodSpec`.

stdout carries only the machine-readable answer, so that
``vllm serve ... $(switchboard select ... --format vllm-args)`` and
``eval "$(switchboard select ... --format env)"`` work; everything meant for a person
(fallbacks, warnings, why) goes to stderr. The engine flags printed are the answer's
``engine_args``, verbatim: the service is the one place that knows how each engine
spells a backend. Exit codes: 0 the pod may boot (a backend was chosen, or none is
valid for the engine and it keeps its own choice), 2 bad input, 1 anything else.

This module imports nothing from the service: a GPU pod's plain install runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import shlex
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from mla_switchboard.agent.errors import AgentError, BadInputError, NoBackendError
from mla_switchboard.agent.notes import log

if TYPE_CHECKING:  # imported when a command runs: --help stays free of pydantic
    from mla_switchboard.agent.api import SelectionResult
    from mla_switchboard.agent.pod import PackagesArg, PodSpec
    from mla_switchboard.core.schemas import EngineInfo, SelectRequest
    from mla_switchboard.core.specs import Backend
    from mla_switchboard.kernels.base import MLAPrefillKernel

__all__ = [
    "ENVIRONMENT",
    "add_pod_arguments",
    "bench_main",
    "build_bench_parser",
    "build_parser",
    "format_refusal",
    "format_result",
    "main",
    "pod_spec_from",
    "select_main",
]

DEFAULT_MEASURE_BUDGET_S = 60.0
DEFAULT_BENCH_BUDGET_S = 300.0
DEFAULT_REPORT_DEADLINE_S = 10.0
SELECT_FORMATS = ("json", "env", "vllm-args", "sglang-args")
FORMAT_ENGINE = {"vllm-args": "vllm", "sglang-args": "sglang"}
"""The engine whose command line an ``--format X-args`` output is for."""

ENVIRONMENT = {
    "SWITCHBOARD_URL": "service URL(s), comma-separated (default of --url)",
    "SWITCHBOARD_TOKEN": "bearer token with the agent role",
    "SWITCHBOARD_CLUSTER": "cluster name (default of --cluster)",
    "SWITCHBOARD_NODE": "node name (default of --node)",
    "SWITCHBOARD_POD": "pod name (default of --pod; else the hostname)",
    "SWITCHBOARD_ENGINE": "serving engine, as --engine (default: detected)",
    "SWITCHBOARD_DEADLINE": "seconds for the decision (select's default of --deadline: 2)",
    "SWITCHBOARD_CACHE_DIR": "answer cache (default of --cache-dir)",
    "XDG_CACHE_HOME": "answer cache under $XDG_CACHE_HOME/switchboard when no cache dir is set",
}


def _environment_epilog(names: Sequence[str]) -> str:
    width = max(len(n) for n in names)
    lines = [f"  {n.ljust(width)}  {ENVIRONMENT[n]}" for n in names]
    return "environment variables read:\n" + "\n".join(lines)


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """Raise instead of exiting, so that the commands return their exit code."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgumentError(message)


# ------------------------------------------------------------------ flag types


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _positive_int(text: str) -> int:
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


def _packages(text: str) -> PackagesArg:
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


# ------------------------------------------------------------- shared flags


def add_pod_arguments(parser: argparse.ArgumentParser) -> None:
    """The one group of flags that describes the pod, shared by ``select`` and ``bench``
    (and turned into a PodSpec by :func:`pod_spec_from`)."""
    what = parser.add_argument_group("the model and the pod")
    what.add_argument("--model", metavar="PATH", help="config.json or model directory")
    what.add_argument("--cluster", help="cluster name (default: $SWITCHBOARD_CLUSTER)")
    what.add_argument(
        "--dtype", help="bfloat16, float16 or float32 (default: the config's, else bfloat16)"
    )
    for flag in ("qk-nope-head-dim", "qk-rope-head-dim", "v-head-dim", "num-heads"):
        what.add_argument(f"--{flag}", type=int, metavar="N", help="override the config")
    what.add_argument("--model-name", help="model name sent to the service (overrides match it)")
    what.add_argument("--node", help="node name (default: $SWITCHBOARD_NODE)")
    what.add_argument("--pod", help="pod name (default: $SWITCHBOARD_POD, else the hostname)")
    what.add_argument(
        "--engine",
        type=_engine,
        metavar="NAME[==VERSION]",
        help="serving engine that runs the backend: vllm==0.33.0, sglang==X, or switchboard "
        "(our own kernels); default $SWITCHBOARD_ENGINE, else detected from the installed "
        "packages (vLLM first, then SGLang), else switchboard",
    )


def _add_url_argument(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--url",
        action="append",
        type=_urls,
        metavar="URL",
        help="service URL with its scheme (http://host:port), repeatable or comma-separated, "
        "tried in turn (default: $SWITCHBOARD_URL); the token comes from $SWITCHBOARD_TOKEN",
    )


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


def _url_list(args: argparse.Namespace) -> list[str] | None:
    """The ``--url`` values flattened; None when no flag was given (the env decides)."""
    return [u for urls in args.url for u in urls] if args.url else None


# ----------------------------------------------------------------------- select


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="switchboard select",
        description="Choose this pod's MLA prefill backend and print how to select it in the "
        "serving engine. Asks the Switchboard service; when it does not answer in time, uses "
        "the last answer it gave for this situation, else decides locally with the seed rules.",
        epilog=_environment_epilog(
            [
                "SWITCHBOARD_URL",
                "SWITCHBOARD_TOKEN",
                "SWITCHBOARD_CLUSTER",
                "SWITCHBOARD_NODE",
                "SWITCHBOARD_POD",
                "SWITCHBOARD_ENGINE",
                "SWITCHBOARD_DEADLINE",
                "SWITCHBOARD_CACHE_DIR",
                "XDG_CACHE_HOME",
            ]
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_pod_arguments(p)
    decision = p.add_argument_group("the pod's own wish")
    decision.add_argument(
        "--requested",
        "--requested-backend",
        dest="requested",
        metavar="BACKEND",
        help="backend the pod asks for (like vLLM's mla_prefill_backend)",
    )
    decision.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) instead of auto-selecting when --requested is not valid",
    )

    dry = p.add_argument_group("dry runs (nothing is built or measured)")
    dry.add_argument("--capability", help="pretend compute capability, e.g. 9.0, or 'none'")
    dry.add_argument("--device-name", help='pretend device name, e.g. "NVIDIA H200"')
    dry.add_argument(
        "--packages",
        type=_packages,
        metavar="SPEC",
        help="kernel packages as name=version or name==version, comma-separated "
        "(torch==2.11.0,flashinfer==0.7.2); 'any' (assume all present) or 'probe' "
        "(default: probe, or 'any' in a dry run)",
    )

    svc = p.add_argument_group("the service")
    _add_url_argument(svc)
    svc.add_argument(
        "--deadline",
        type=_positive_float,
        metavar="SECONDS",
        help="total time for the decision (default: $SWITCHBOARD_DEADLINE or 2)",
    )
    svc.add_argument(
        "--cache-dir",
        help="answer cache (default: $SWITCHBOARD_CACHE_DIR, else $XDG_CACHE_HOME/switchboard)",
    )
    svc.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")

    measure = p.add_argument_group("measured selection")
    measure.add_argument(
        "--measure",
        action="store_true",
        help="first run `switchboard bench` for this pod within --measure-budget and report "
        "it, so the fleet gathers evidence as pods boot (failures there are warnings)",
    )
    measure.add_argument(
        "--measure-budget",
        type=_positive_float,
        default=DEFAULT_MEASURE_BUDGET_S,
        metavar="SECONDS",
        help=f"the most the measurement may add to the boot (default {DEFAULT_MEASURE_BUDGET_S:g})",
    )

    out = p.add_argument_group("output")
    out.add_argument(
        "--format",
        choices=SELECT_FORMATS,
        default="json",
        help="json: the whole answer (default); env: export lines for a shell's eval, the "
        "engine's environment included; vllm-args / sglang-args: exactly the answer's "
        "engine_args for that engine's command line (nothing when there are none, with the "
        "reason on stderr); these two imply --engine vllm / sglang when no engine is given "
        "or installed",
    )
    out.add_argument(
        "--check",
        action="store_true",
        help="build the kernel and run one tiny prefill against the reference; "
        "a failure is reported and the next valid backend is tried",
    )
    out.add_argument(
        "--fail-if-unavailable",
        action="store_true",
        help="exit 1 when no backend is valid for the pod and its engine (default: print no "
        "engine flags, say why on stderr and exit 0, so the engine keeps its own choice)",
    )
    return p


def _engine_args_line(args: Sequence[str]) -> str:
    """``args`` as one line for ``$(...)``: words separated by spaces. The engine flags
    the service gives have no whitespace; quoting would not survive ``$(...)`` anyway."""
    return " ".join(args)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_lines(values: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items())


def format_result(result: SelectionResult, fmt: str) -> str:
    """The stdout text of a SelectionResult for ``fmt``; the engine flags are the
    answer's ``engine_args`` verbatim (empty when it has none)."""
    if fmt == "json":
        return json.dumps(result.to_dict(), indent=2) + "\n"
    engine_args = list(result.engine_args)
    if fmt in FORMAT_ENGINE:
        return _engine_args_line(engine_args) + "\n" if engine_args else ""
    values = {
        "SWITCHBOARD_BACKEND": result.backend.value,
        "SWITCHBOARD_SOURCE": result.source,
        "SWITCHBOARD_DECISION_ID": result.decision_id or "",
        "SWITCHBOARD_RULES_REVISION": str(result.rules_revision or ""),
        "SWITCHBOARD_ENGINE": result.engine.name,
        "SWITCHBOARD_ENGINE_ARGS": _engine_args_line(engine_args),
        "SWITCHBOARD_VLLM_ARGS": _engine_args_line(engine_args)
        if result.engine.name == "vllm"
        else "",
    }
    for name, value in result.engine_env.items():
        if _ENV_NAME.match(name):
            values[name] = value
        else:
            log.warning("engine_env names %r, which is not a shell variable; left out", name)
    return _env_lines(values)


def format_refusal(error: NoBackendError, request: SelectRequest | None, fmt: str) -> str:
    """The stdout text when no backend is valid: no engine flags, empty variables, or a
    JSON document whose ``refusal`` says why (every candidate with its reasons)."""
    if fmt in FORMAT_ENGINE:
        return ""
    if fmt == "env":
        return _env_lines(
            {
                "SWITCHBOARD_BACKEND": "",
                "SWITCHBOARD_SOURCE": "refused",
                "SWITCHBOARD_ENGINE": ""
                if request is None or request.engine is None
                else request.engine.name,
                "SWITCHBOARD_ENGINE_ARGS": "",
                "SWITCHBOARD_VLLM_ARGS": "",
                "SWITCHBOARD_REFUSAL": str(error),
            }
        )
    document: dict[str, object] = {
        "backend": None,
        "source": "refused",
        "engine": None
        if request is None or request.engine is None
        else request.engine.model_dump(mode="json"),
        "engine_args": [],
        "engine_env": {},
        "refusal": {
            "kind": error.kind,
            "message": str(error),
            "candidates": [c.model_dump(mode="json") for c in error.candidates],
        },
        "request": None if request is None else request.model_dump(mode="json"),
    }
    return json.dumps(document, indent=2) + "\n"


@contextlib.contextmanager
def _stderr_logging() -> Iterator[None]:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("switchboard: %(message)s"))
    previous = (log.level, log.propagate)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(previous[0])
        log.propagate = previous[1]


def _parse(
    parser: argparse.ArgumentParser, argv: Sequence[str], command: str
) -> argparse.Namespace | int:
    """Parsed arguments, or the exit code: 2 for a bad flag (usage and the error, which
    names the flag, on stderr), 0 after --help."""
    try:
        return parser.parse_args(list(argv))
    except _ArgumentError as exc:
        parser.print_usage(sys.stderr)
        print(f"switchboard {command}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)


def _format_engine(spec: PodSpec, fmt: str) -> PodSpec:
    """The PodSpec with the engine an ``--format X-args`` output needs.

    ``--format vllm-args`` is a promise to put the output on vLLM's command line, so
    the decision must be one vLLM accepts: with no engine given or installed (an init
    container without vLLM) the request names vLLM, version unknown (the service then
    applies its newest vLLM rules). A different engine, given or installed, is a
    contradiction the operator must resolve: bad input naming both flags.
    """
    import dataclasses

    from mla_switchboard.agent.engine import detect_engine
    from mla_switchboard.agent.pod import given_engine

    wanted = FORMAT_ENGINE.get(fmt)
    if wanted is None:
        return spec
    engine, origin = given_engine(spec.engine)
    if engine is None:
        engine, origin = detect_engine(), "the installed engine"
    if engine is None:
        log.info(
            "%s is not installed here; asking for %s of unknown version (give "
            "--engine %s==VERSION to be exact)",
            wanted,
            wanted,
            wanted,
        )
        from mla_switchboard.core.schemas import EngineInfo

        engine = EngineInfo(name=wanted)  # type: ignore[arg-type]
    if engine.name != wanted:
        raise BadInputError(
            f"--format {fmt} prints {wanted} flags, but {origin} is {engine.name}; "
            f"give --engine {wanted}==VERSION or another --format"
        )
    return dataclasses.replace(spec, engine=engine)


def _explain_refusal(error: NoBackendError) -> None:
    log.error("no MLA prefill backend: %s", error)
    for line in error.explain():
        log.error("  %s", line)


def select_main(argv: Sequence[str]) -> int:
    """Run ``switchboard select`` with ``argv`` (the arguments after ``select``)."""
    args = _parse(build_parser(), argv, "select")
    if isinstance(args, int):
        return args

    from mla_switchboard.agent.api import select_backend

    with _stderr_logging():
        try:
            spec = _format_engine(pod_spec_from(args), args.format)
        except BadInputError as exc:
            log.error("error: %s", exc)
            return 2
        urls = _url_list(args)
        if args.measure:
            _measure_first(spec, urls, args.measure_budget)
        try:
            result = select_backend(
                spec,
                urls=urls,
                deadline=args.deadline,
                cache_dir=args.cache_dir,
                use_cache=not args.no_cache,
                build=args.check,
                check=args.check,
            )
        except BadInputError as exc:
            log.error("error: %s", exc)
            return 2
        except NoBackendError as exc:
            _explain_refusal(exc)
            if exc.kind == "requested_invalid":
                return 1  # --strict asked for exactly this
            if args.format in FORMAT_ENGINE:
                log.warning("printing no engine flags: the engine keeps its own choice")
            sys.stdout.write(format_refusal(exc, exc.request, args.format))
            sys.stdout.flush()
            return 1 if args.fail_if_unavailable else 0
        except AgentError as exc:
            log.error("error: %s", exc)
            return 1
        log.info("%s (%s)", result.backend, result.source)
        for message in result.messages:  # e.g. why a requested backend was not taken
            log.info("  %s", message)
        if args.format in FORMAT_ENGINE and not result.engine_args:
            log.info(
                "the answer has no %s arguments (see above); printing none, so the engine "
                "keeps its own choice",
                result.engine.name,
            )
    sys.stdout.write(format_result(result, args.format))
    sys.stdout.flush()
    return 0


def _measure_first(spec: PodSpec, urls: list[str] | None, budget_s: float) -> None:
    """``select --measure``: bench this pod in a child process, bounded by the budget.

    Never raises: a pod that cannot measure still boots on the decision.
    """
    from mla_switchboard.agent.bench import measure_in_child
    from mla_switchboard.agent.client import parse_urls
    from mla_switchboard.agent.notes import Notes

    notes = Notes()
    if spec.pretend:
        notes.info("not measuring: --capability/--device-name pretend to be another GPU")
        return
    try:
        report_to = urls if urls is not None else parse_urls()
    except ValueError:
        return  # the select right after says what is wrong with SWITCHBOARD_URL
    if not report_to:
        notes.warn("not measuring: no service URL to report to (--url or SWITCHBOARD_URL)")
        return
    try:  # bad input fails the select right after; measuring it first would waste the budget
        spec.read_model()
        argv = spec.bench_argv()
    except BadInputError:
        return
    for url in report_to:
        argv += ["--url", url]
    try:
        measure_in_child(argv, budget_s, notes)
    except Exception as exc:  # a boot never fails because measuring did
        notes.warn(f"measuring failed: {type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------- bench


def build_bench_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="switchboard bench",
        description="Measure every MLA prefill backend valid on this pod (reference check "
        "first, then TFLOP/s on prefill shapes with the model's dims, called as the layers of "
        "a forward pass call it) and report it to the Switchboard service as evidence for "
        "measured selection.",
        epilog=_environment_epilog(
            [
                "SWITCHBOARD_URL",
                "SWITCHBOARD_TOKEN",
                "SWITCHBOARD_CLUSTER",
                "SWITCHBOARD_NODE",
                "SWITCHBOARD_POD",
                "SWITCHBOARD_ENGINE",
            ]
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_pod_arguments(p)
    run = p.add_argument_group("what to run")
    run.add_argument(
        "--backends", metavar="A,B", help="only these backends (default: every valid one)"
    )
    run.add_argument(
        "--shapes",
        metavar="SPEC",
        help="BATCHxTOKENS,... with the model's head count (default 8x512,1x8192; "
        "2x64,1x256 without a GPU)",
    )
    run.add_argument(
        "--layers",
        type=_positive_int,
        metavar="N",
        help="calls per forward pass with the same offsets, as a model's layers make them "
        "(default: the config's num_hidden_layers, else 8; 2 on a CPU)",
    )
    run.add_argument(
        "--budget",
        type=_positive_float,
        default=DEFAULT_BENCH_BUDGET_S,
        metavar="SECONDS",
        help=f"start no new measurement after this (default {DEFAULT_BENCH_BUDGET_S:g})",
    )
    run.add_argument(
        "--iters",
        type=_positive_int,
        default=20,
        metavar="N",
        help="timed forward passes per shape, at most (default 20)",
    )
    run.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda:0 when there is a GPU)")

    svc = p.add_argument_group("the service")
    _add_url_argument(svc)
    svc.add_argument(
        "--deadline",
        type=_positive_float,
        default=DEFAULT_REPORT_DEADLINE_S,
        metavar="SECONDS",
        help=f"total time for posting the report, retries included "
        f"(default {DEFAULT_REPORT_DEADLINE_S:g})",
    )
    svc.add_argument("--no-report", action="store_true", help="measure and print only")
    p.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table: one row per backend and shape, for people (default); json: the whole "
        "run, what was skipped and what became of the report",
    )
    return p


def bench_main(
    argv: Sequence[str], *, kernel_classes: Mapping[Backend, type[MLAPrefillKernel]] | None = None
) -> int:
    """Run ``switchboard bench`` with ``argv`` (the arguments after ``bench``).

    ``kernel_classes`` ({Backend: class}) stands in for ``kernels.get`` for some
    backends: the hook tests use to push a deliberately wrong kernel through the real
    checks. Exit codes: 0 measured (and reported, unless --no-report), 2 bad input,
    1 anything else (the report could not be posted, a failure of the bench itself).
    """
    started = time.monotonic()
    args = _parse(build_bench_parser(), argv, "bench")
    if isinstance(args, int):
        return args

    from mla_switchboard.agent import bench

    with _stderr_logging():
        try:
            urls = _url_list(args)
            if urls is None:
                from mla_switchboard.agent.client import parse_urls

                try:
                    urls = parse_urls()
                except ValueError as exc:
                    raise BadInputError(str(exc)) from None
            if not args.no_report and not urls:
                raise BadInputError(
                    "no service URL to report to (--url or SWITCHBOARD_URL); "
                    "give one, or --no-report to measure only"
                )
            plan = bench.plan_bench(
                pod_spec_from(args),
                backends=args.backends.split(",") if args.backends is not None else None,
                shapes=args.shapes,
                device=args.device,
                budget_s=args.budget,
                iters=args.iters,
                layers=args.layers,
            )
        except BadInputError as exc:
            log.error("error: %s", exc)
            return 2
        except AgentError as exc:
            log.error("error: %s", exc)
            return 1
        bench.log_plan(plan)
        with bench.interruptible() as interrupts:
            outcome = bench.run_bench(
                plan, kernel_classes=kernel_classes, started=started, interrupts=interrupts
            )
            status = bench.deliver(plan, outcome, no_report=args.no_report, urls=urls,
                                   deadline_s=args.deadline)  # fmt: skip
    if args.format == "json":
        text = json.dumps(bench.to_document(plan, outcome, report=status), indent=2) + "\n"
    else:
        text = bench.format_table(plan, outcome)
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0 if status.ok else 1


# ------------------------------------------------------------------ dispatch

SERVICE_COMMANDS = {
    "serve": "run the central service",
    "token": "manage API tokens",
    "health": "exit 0 if the local service answers /readyz (container healthcheck)",
}
"""Subcommands that live in the service (``mla_switchboard.service.cli``). They are
looked up by name when invoked, so a GPU pod's plain install runs ``select`` and
``bench`` without FastAPI or SQLAlchemy, and says which extra ``serve`` needs."""

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

AGENT_COMMANDS = {
    "select": "choose this pod's MLA prefill backend and print the engine flags for it",
    "bench": "measure every backend valid on this pod and report it to the service",
}


def _missing_server_modules() -> list[str]:
    import importlib.util

    return [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]


def _top_parser() -> argparse.ArgumentParser:
    from mla_switchboard.core.version import __version__

    parser = argparse.ArgumentParser(
        prog="switchboard",
        description="MLA Switchboard: fleet-wide choice of the MLA prefill attention backend.",
        epilog="Run `switchboard COMMAND --help` for a command's flags and environment.",
    )
    parser.add_argument("--version", action="version", version=f"switchboard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in {**AGENT_COMMANDS, **SERVICE_COMMANDS}.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``switchboard`` command: dispatch to the agent or, when installed, the service."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "select":
        return select_main(argv[1:])
    if argv and argv[0] == "bench":
        return bench_main(argv[1:])
    if argv and argv[0] in SERVICE_COMMANDS:
        import importlib

        missing = _missing_server_modules() if argv[0] != "health" else []  # httpx only
        try:
            if missing:
                raise ImportError(f"missing {', '.join(missing)}")
            service_cli = importlib.import_module("mla_switchboard.service.cli")
        except ImportError as exc:
            print(
                f"switchboard {argv[0]}: the server extra is not installed here ({exc}); "
                "install it with: pip install 'mla-switchboard[server]'",
                file=sys.stderr,
            )
            return 2
        return int(service_cli.main(argv))
    _top_parser().parse_args(argv)  # --help, --version or a usage error: exits
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
