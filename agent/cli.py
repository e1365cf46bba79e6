"""``switchboard select`` and ``switchboard bench``: the agent's command line.

``select`` prints the decision for the serving process to use; ``bench`` measures
every backend valid on this pod and reports the numbers (``agent/bench.py`` says
how); ``select --measure`` does the second within a time budget before the first.

stdout carries only the machine-readable answer (``--format json|env|vllm-args``),
so that ``vllm serve ... $(switchboard select ... --format vllm-args)`` and
``eval "$(switchboard select ... --format env)"`` work; everything meant for a person
(fallbacks, warnings, why) goes to stderr. Exit codes: 0 a backend was chosen, 2 bad
input (not an MLA model, unreadable config, bad flag), 1 anything else.

The CLI does not build the kernel (the serving process will) unless ``--check`` asks
it to build it and run one tiny prefill against the reference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shlex
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from mla_switchboard.agent.api import SelectionResult, parse_packages, select_backend
from mla_switchboard.agent.client import parse_urls
from mla_switchboard.agent.errors import AgentError, BadInputError
from mla_switchboard.agent.notes import log
from mla_switchboard.core.specs import Backend

__all__ = [
    "VLLM_BACKENDS",
    "bench_main",
    "build_bench_parser",
    "build_parser",
    "format_result",
    "main",
    "select_main",
]

VLLM_BACKENDS = frozenset(
    {Backend.TRTLLM_RAGGED, Backend.FLASHINFER, Backend.CUDNN, Backend.FLASH_ATTN}
)
"""The backends vLLM's ``--attention-config.mla_prefill_backend`` accepts."""

VLLM_FLAG = "--attention-config.mla_prefill_backend"
DEFAULT_MEASURE_BUDGET_S = 60.0
DEFAULT_BENCH_BUDGET_S = 300.0
DEFAULT_REPORT_DEADLINE_S = 10.0


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """Raise instead of exiting, so that ``select_main`` returns its exit code."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgumentError(message)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="switchboard select",
        description="Choose this pod's MLA prefill backend (asks the Switchboard service; "
        "falls back to the cached answer, then to the local seed rules).",
    )
    what = p.add_argument_group("the model and the pod")
    what.add_argument("--model", metavar="PATH", help="config.json or model directory")
    what.add_argument("--cluster", help="cluster name (default: $SWITCHBOARD_CLUSTER)")
    what.add_argument("--dtype", help="bfloat16, float16 or float32 (default: the config's)")
    what.add_argument(
        "--requested",
        "--requested-backend",
        dest="requested",
        metavar="BACKEND",
        help="backend the pod asks for (like vLLM's mla_prefill_backend)",
    )
    what.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) instead of auto-selecting when --requested is not valid",
    )
    for flag in ("qk-nope-head-dim", "qk-rope-head-dim", "v-head-dim", "num-heads"):
        what.add_argument(f"--{flag}", type=int, metavar="N", help="override the config")
    what.add_argument("--model-name", help="model name sent to the service (overrides match it)")
    what.add_argument("--node", help="node name (default: $SWITCHBOARD_NODE)")
    what.add_argument("--pod", help="pod name (default: $SWITCHBOARD_POD, else the hostname)")

    dry = p.add_argument_group("dry runs (nothing is built)")
    dry.add_argument("--capability", help="pretend compute capability, e.g. 9.0, or 'none'")
    dry.add_argument("--device-name", help='pretend device name, e.g. "NVIDIA H200"')
    dry.add_argument(
        "--packages",
        metavar="SPEC",
        help="name=version,... ; 'any' (assume all present) or 'probe' "
        "(default: probe, or 'any' in a dry run)",
    )

    svc = p.add_argument_group("the service")
    svc.add_argument(
        "--url",
        action="append",
        metavar="URL",
        help="service URL, repeatable or comma-separated, tried in turn "
        "(default: $SWITCHBOARD_URL); the token comes from $SWITCHBOARD_TOKEN",
    )
    svc.add_argument(
        "--deadline",
        type=_positive_float,
        metavar="SECONDS",
        help="total time for the decision (default: $SWITCHBOARD_DEADLINE or 2)",
    )
    svc.add_argument("--cache-dir", help="answer cache (default: $XDG_CACHE_HOME/switchboard)")
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
    out.add_argument("--format", choices=("json", "env", "vllm-args"), default="json")
    out.add_argument(
        "--check",
        action="store_true",
        help="build the kernel and run one tiny prefill against the reference; "
        "a failure is reported and the next valid backend is tried",
    )
    return p


def format_result(result: SelectionResult, fmt: str) -> str:
    """The stdout text for ``fmt`` (empty for vllm-args with a backend vLLM lacks)."""
    if fmt == "json":
        return json.dumps(result.to_dict(), indent=2) + "\n"
    vllm_args = f"{VLLM_FLAG}={result.backend.value}" if result.backend in VLLM_BACKENDS else ""
    if fmt == "vllm-args":
        return vllm_args + "\n" if vllm_args else ""
    values = {
        "SWITCHBOARD_BACKEND": result.backend.value,
        "SWITCHBOARD_SOURCE": result.source,
        "SWITCHBOARD_DECISION_ID": result.decision_id or "",
        "SWITCHBOARD_RULES_REVISION": str(result.rules_revision or ""),
        "SWITCHBOARD_VLLM_ARGS": vllm_args,
    }
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items())


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
    """Parsed arguments, or the exit code: 2 for a bad flag (usage and the error on
    stderr), 0 after --help."""
    try:
        return parser.parse_args(list(argv))
    except _ArgumentError as exc:
        parser.print_usage(sys.stderr)
        print(f"switchboard {command}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)


def select_main(argv: Sequence[str]) -> int:
    """Run ``switchboard select`` with ``argv`` (the arguments after ``select``)."""
    args = _parse(build_parser(), argv, "select")
    if isinstance(args, int):
        return args

    with _stderr_logging():
        urls = None
        if args.url:
            urls = [u for item in args.url for u in parse_urls(item)]
        if args.measure:
            _measure_first(args, urls)
        try:
            result = select_backend(
                args.model,
                cluster=args.cluster,
                dtype=args.dtype,
                requested_backend=args.requested,
                strict=args.strict,
                qk_nope_head_dim=args.qk_nope_head_dim,
                qk_rope_head_dim=args.qk_rope_head_dim,
                v_head_dim=args.v_head_dim,
                num_heads=args.num_heads,
                model_name=args.model_name,
                capability=args.capability,
                device_name=args.device_name,
                packages=parse_packages(args.packages) if args.packages else None,
                node=args.node,
                pod=args.pod,
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
        except AgentError as exc:
            log.error("error: %s", exc)
            return 1
        log.info("%s (%s)", result.backend, result.source)
        for message in result.messages:  # e.g. why a requested backend was not taken
            log.info("  %s", message)
        if args.format == "vllm-args" and result.backend not in VLLM_BACKENDS:
            log.info(
                "vLLM has no MLA prefill backend named %s; printing no flag, so vLLM "
                "chooses on its own",
                result.backend,
            )
    sys.stdout.write(format_result(result, args.format))
    sys.stdout.flush()
    return 0


def _measure_first(args: argparse.Namespace, urls: list[str] | None) -> None:
    """``select --measure``: bench this pod in a child process, bounded by the budget.

    Never raises: a pod that cannot measure still boots on the decision.
    """
    from mla_switchboard.agent.bench import bench_args_from, measure_in_child
    from mla_switchboard.agent.model_config import read_model
    from mla_switchboard.agent.notes import Notes

    notes = Notes()
    if args.capability is not None or args.device_name is not None:
        notes.info("not measuring: --capability/--device-name pretend to be another GPU")
        return
    if not (urls or parse_urls()):
        notes.warn("not measuring: no service URL to report to (--url or SWITCHBOARD_URL)")
        return
    try:  # bad input fails the select right after; measuring it first would waste the budget
        read_model(
            args.model,
            qk_nope_head_dim=args.qk_nope_head_dim,
            qk_rope_head_dim=args.qk_rope_head_dim,
            v_head_dim=args.v_head_dim,
            num_heads=args.num_heads,
            dtype=args.dtype,
        )
    except BadInputError:
        return
    values = dict(vars(args))
    values["urls"] = urls
    try:
        measure_in_child(bench_args_from(values), args.measure_budget, notes)
    except Exception as exc:  # a boot never fails because measuring did
        notes.warn(f"measuring failed: {type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------- bench


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def build_bench_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="switchboard bench",
        description="Measure every MLA prefill backend valid on this pod (reference check "
        "first, then TFLOP/s on prefill shapes with the model's dims) and report it to the "
        "Switchboard service as evidence for measured selection.",
    )
    what = p.add_argument_group("the model and the pod")
    what.add_argument("--model", metavar="PATH", help="config.json or model directory")
    what.add_argument("--cluster", help="cluster name (default: $SWITCHBOARD_CLUSTER)")
    what.add_argument("--dtype", help="bfloat16, float16 or float32 (default: the config's)")
    for flag in ("qk-nope-head-dim", "qk-rope-head-dim", "v-head-dim", "num-heads"):
        what.add_argument(f"--{flag}", type=int, metavar="N", help="override the config")
    what.add_argument("--model-name", help="model name sent to the service")
    what.add_argument("--node", help="node name (default: $SWITCHBOARD_NODE)")
    what.add_argument("--pod", help="pod name (default: $SWITCHBOARD_POD, else the hostname)")

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
        help="timed calls per shape (at most)",
    )
    run.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda:0 when there is a GPU)")

    svc = p.add_argument_group("the service")
    svc.add_argument(
        "--url",
        action="append",
        metavar="URL",
        help="service URL, repeatable or comma-separated (default: $SWITCHBOARD_URL); "
        "the token comes from $SWITCHBOARD_TOKEN",
    )
    svc.add_argument(
        "--deadline",
        type=_positive_float,
        default=DEFAULT_REPORT_DEADLINE_S,
        metavar="SECONDS",
        help=f"total time for posting the report, retries included "
        f"(default {DEFAULT_REPORT_DEADLINE_S:g})",
    )
    svc.add_argument("--no-report", action="store_true", help="measure and print only")
    p.add_argument("--format", choices=("table", "json"), default="table")
    return p


def _post_report(report: Any, urls: list[str], deadline: float) -> dict[str, Any]:
    """POST the report; what became of it, for the output. Never raises."""
    from mla_switchboard.agent.client import (
        ServiceRefused,
        ServiceUnavailable,
        post_json,
        token_from_env,
    )

    try:
        posted = post_json(
            "/v1/measurements",
            report.model_dump(mode="json"),
            urls=urls,
            token=token_from_env(),
            deadline_s=deadline,
        )
    except (ServiceRefused, ServiceUnavailable) as exc:
        last = getattr(exc, "attempts", None)
        detail = f" (last: {last[-1]})" if last else ""
        return {"posted": False, "error": f"{exc}{detail}"}
    body = posted.body if isinstance(posted.body, dict) else {}
    return {
        "posted": True,
        "url": posted.url,
        "measurement_id": body.get("measurement_id"),
        "results": body.get("results"),
    }


NOTHING_MEASURED = "nothing was measured"


def _deliver(report: Any, no_report: bool, urls: list[str], deadline: float) -> dict[str, Any]:
    """Post ``report`` (None when nothing was measured) unless told not to; what became
    of it, for the output and the exit code."""
    if report is None:
        log.warning("bench: %s, so nothing is reported", NOTHING_MEASURED)
        return {"posted": False, "error": NOTHING_MEASURED}
    if no_report:
        return {"posted": False, "error": "--no-report"}
    status = _post_report(report, urls, deadline)
    if status["posted"]:
        log.info(
            "bench: reported %d results as measurement %s to %s",
            len(report.results),
            status.get("measurement_id"),
            status.get("url"),
        )
    else:
        log.error("bench: could not report the results: %s", status["error"])
    return status


def bench_main(argv: Sequence[str], *, kernel_classes: Any = None) -> int:
    """Run ``switchboard bench`` with ``argv`` (the arguments after ``bench``).

    ``kernel_classes`` ({Backend: class}) stands in for ``kernels.get`` for some
    backends: the hook tests use to push a deliberately wrong kernel through the real
    checks. Exit codes: 0 measured (and reported, unless --no-report), 2 bad input,
    1 anything else (the report could not be posted, a failure of the bench itself).
    """
    import time

    started = time.monotonic()
    args = _parse(build_bench_parser(), argv, "bench")
    if isinstance(args, int):
        return args

    from mla_switchboard.agent import bench

    with _stderr_logging():
        try:
            urls = [u for item in args.url for u in parse_urls(item)] if args.url else parse_urls()
            if not args.no_report and not urls:
                raise BadInputError(
                    "no service URL to report to (--url or SWITCHBOARD_URL); "
                    "give one, or --no-report to measure only"
                )
            plan = bench.plan_bench(
                args.model,
                cluster=args.cluster,
                dtype=args.dtype,
                backends=args.backends.split(",") if args.backends is not None else None,
                shapes=args.shapes,
                device=args.device,
                budget_s=args.budget,
                iters=args.iters,
                qk_nope_head_dim=args.qk_nope_head_dim,
                qk_rope_head_dim=args.qk_rope_head_dim,
                v_head_dim=args.v_head_dim,
                num_heads=args.num_heads,
                model_name=args.model_name,
                node=args.node,
                pod=args.pod,
            )
        except BadInputError as exc:
            log.error("error: %s", exc)
            return 2
        except AgentError as exc:
            log.error("error: %s", exc)
            return 1
        where = plan.device_name or "no GPU"
        if plan.capability is not None:
            where += f" ({plan.capability[0]}.{plan.capability[1]})"
        log.info(
            "bench on %s, %s: %s at H%d %s; shapes %s; budget %gs",
            where,
            plan.device,
            ", ".join(b.value for b in plan.backends) or "no backend",
            plan.num_heads,
            plan.pod.request.dtype,
            ", ".join(s.label for s in plan.shapes),
            plan.budget_s,
        )
        for backend, reasons in plan.unavailable.items():
            log.info("bench %s: not valid here, skipped: %s", backend, "; ".join(reasons))
        with bench.interruptible() as interrupts:
            outcome = bench.run_bench(
                plan, kernel_classes=kernel_classes, started=started, interrupts=interrupts
            )
            if outcome.skipped:
                log.warning(
                    "bench: %d steps skipped (%s)", len(outcome.skipped), outcome.skipped[0].reason
                )
            try:
                report = bench.build_report(plan, outcome)
            except ValueError as exc:  # pydantic's ValidationError: a bug; keep the table
                report = None
                log.error("bench: the results do not make a valid report: %s", exc)
                status: dict[str, Any] = {"posted": False, "error": f"invalid report: {exc}"}
            else:
                status = _deliver(report, args.no_report, urls, args.deadline)
    if args.format == "json":
        text = json.dumps(bench.to_document(plan, outcome, report=status), indent=2) + "\n"
    else:
        text = bench.format_table(plan, outcome)
    sys.stdout.write(text)
    sys.stdout.flush()
    failed = not status["posted"] and status["error"] not in ("--no-report", NOTHING_MEASURED)
    return 1 if failed else 0


SERVICE_COMMANDS = {"serve": "run the central service", "token": "manage API tokens"}
"""Subcommands that live in the service (``mla_switchboard.service.cli``). They are
looked up by name when invoked, so a GPU pod's plain install runs ``select`` and
``bench`` without FastAPI or SQLAlchemy, and says which extra ``serve`` needs."""

AGENT_COMMANDS = {
    "select": "choose this pod's MLA prefill backend (asks the service)",
    "bench": "measure every backend valid on this pod and report it",
}


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

        try:
            service_cli = importlib.import_module("mla_switchboard.service.cli")
        except ImportError as exc:
            print(
                f"switchboard {argv[0]}: the service is not installed here ({exc}); "
                "install it with: pip install 'mla-switchboard[server]'",
                file=sys.stderr,
            )
            return 2
        return int(service_cli.main(argv))
    _top_parser().parse_args(argv)  # --help, --version or a usage error: exits
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
