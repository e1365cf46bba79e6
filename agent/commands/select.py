"""``switchboard select``: print this pod's decision for its serving engine.

stdout carries only the machine-readable answer, so that
``vllm serve ... $(switchboard select ... --format vllm-args)`` and
``eval "$(switchboard select ... --format env)"`` work; everything meant for a person
(fallbacks, warnings, why) goes to stderr. Exit codes: 0 the pod may boot (a backend
was chosen, or none is valid for the engine and it keeps its own choice), 2 bad input,
3 the service refused the token and ``--fail-on-auth-error`` was given, 1 anything
else. Without that flag a refused token is a configuration error said on stderr, and
the pod boots on its cached answer or a local decision (source ``auth-fallback``).
``--measure`` first runs ``switchboard bench`` within a time budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mla_switchboard.agent.commands.formats import (
    SELECT_FORMATS,
    args_format_engine,
    format_document,
)
from mla_switchboard.agent.commands.parsing import (
    POD_ENVIRONMENT,
    add_pod_arguments,
    add_url_argument,
    command_parser,
    packages_flag,
    parse_args,
    pod_spec_from,
    positive_float,
    settings_from,
    url_list,
)
from mla_switchboard.agent.errors import AgentError, BadInputError, NoBackendError, exit_code
from mla_switchboard.agent.notes import Notes, log, to_stderr
from mla_switchboard.agent.settings import (
    CACHE_DIR,
    DEADLINE,
    DEFAULT_DEADLINE_S,
    TOKEN,
    TOKEN_FILE,
    URL,
    XDG_CACHE_HOME,
    AgentSettings,
)
from mla_switchboard.core.version import PROGRAM

if TYPE_CHECKING:
    from mla_switchboard.agent.pod import PodSpec

__all__ = ["DEFAULT_MEASURE_BUDGET_S", "build_parser", "select_main"]

DEFAULT_MEASURE_BUDGET_S = 60.0


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "switchboard select",
        "Choose this pod's MLA prefill backend and print how to select it in the "
        "serving engine. Asks the Switchboard service; when it does not answer in time, uses "
        "the last answer it gave for this situation, else decides locally with the seed rules.",
        [*POD_ENVIRONMENT, DEADLINE, CACHE_DIR, XDG_CACHE_HOME],
    )
    add_pod_arguments(p)
    _add_wish_arguments(p)
    _add_dry_run_arguments(p)
    _add_service_arguments(p)
    _add_measure_arguments(p)
    _add_output_arguments(p)
    return p


def _add_wish_arguments(p: argparse.ArgumentParser) -> None:
    decision = p.add_argument_group("the pod's own wish")
    decision.add_argument(
        "--requested",
        "--requested-backend",
        dest="requested",
        metavar="BACKEND",
        help="backend the pod asks for (the MLA prefill backend its engine config names)",
    )
    decision.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) instead of auto-selecting when --requested is not valid",
    )


def _add_dry_run_arguments(p: argparse.ArgumentParser) -> None:
    dry = p.add_argument_group(
        "dry runs (--capability or --device-name: pretend to be another GPU; nothing is "
        "built or measured, the answer cache is neither read nor written, and the service "
        "records nothing)"
    )
    dry.add_argument("--capability", help="pretend compute capability, e.g. 9.0, or 'none'")
    dry.add_argument("--device-name", help='pretend device name, e.g. "NVIDIA H200"')
    dry.add_argument(
        "--packages",
        type=packages_flag,
        metavar="SPEC",
        help="kernel packages as name=version or name==version, comma-separated "
        "(torch==2.11.0,flashinfer==0.7.2); 'any' (assume all present) or 'probe' "
        "(default: probe, or 'any' in a dry run)",
    )


def _add_service_arguments(p: argparse.ArgumentParser) -> None:
    svc = p.add_argument_group("the service")
    add_url_argument(svc)
    svc.add_argument(
        "--deadline",
        type=positive_float,
        metavar="SECONDS",
        help=f"total time for the decision (default: ${DEADLINE} or {DEFAULT_DEADLINE_S:g})",
    )
    svc.add_argument(
        "--cache-dir",
        help=f"answer cache (default: ${CACHE_DIR}, else ${XDG_CACHE_HOME}/{PROGRAM})",
    )
    svc.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    svc.add_argument(
        "--fail-on-auth-error",
        action="store_true",
        help="exit 3 when the service refuses the token (401/403) instead of booting on a "
        "local decision (for teams that prefer a crash loop to a misconfigured pod)",
    )


def _add_measure_arguments(p: argparse.ArgumentParser) -> None:
    measure = p.add_argument_group("measured selection")
    measure.add_argument(
        "--measure",
        action="store_true",
        help="first run `switchboard bench` for this pod within --measure-budget and report "
        "it, so the fleet gathers evidence as pods boot (failures there are warnings)",
    )
    measure.add_argument(
        "--measure-budget",
        type=positive_float,
        default=DEFAULT_MEASURE_BUDGET_S,
        metavar="SECONDS",
        help=f"the most the measurement may add to the boot (default {DEFAULT_MEASURE_BUDGET_S:g})",
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("output")
    engine_formats = " / ".join(f for f in SELECT_FORMATS if args_format_engine(f))
    out.add_argument(
        "--format",
        choices=SELECT_FORMATS,
        default="json",
        help="json: the whole answer (default); env: export lines for a shell's eval, the "
        f"engine's environment included; {engine_formats}: exactly the answer's "
        "engine_args for that engine's command line (nothing when there are none, with the "
        "reason on stderr); these imply --engine NAME when no engine is given or installed",
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


def _with_format_engine(spec: PodSpec, fmt: str, settings: AgentSettings) -> PodSpec:
    """The PodSpec with the engine an engine's args format needs (see
    :func:`~mla_switchboard.agent.engine.resolve_engine`); unchanged for json and env,
    where the pod's description resolves it."""
    if args_format_engine(fmt) is None:
        return spec
    from mla_switchboard.agent.engine import resolve_engine

    engine = resolve_engine(spec.engine, Notes(), settings, output_format=fmt)
    return dataclasses.replace(spec, engine=engine)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _refused(error: NoBackendError, args: argparse.Namespace) -> int:
    """A refusal: every candidate's reasons on stderr, the refusal document (no engine
    flags) on stdout, and exit 0 so the engine keeps its own choice, unless the pod
    asked for exactly this backend (``--strict``) or ``--fail-if-unavailable``."""
    from mla_switchboard.agent.api import refusal_document

    log.error("no MLA prefill backend: %s", error)
    for line in error.explain():
        log.error("  %s", line)
    if error.kind == "requested_invalid":
        return 1  # --strict asked for exactly this
    if args_format_engine(args.format) is not None:
        log.warning("printing no engine flags: the engine keeps its own choice")
    _write(format_document(refusal_document(error), args.format))
    return 1 if args.fail_if_unavailable else 0


def select_main(argv: Sequence[str]) -> int:
    """Run ``switchboard select`` with ``argv`` (the arguments after ``select``)."""
    args = parse_args(build_parser(), argv)
    if isinstance(args, int):
        return args

    from mla_switchboard.agent.api import select_backend

    settings = settings_from(args)
    with to_stderr():
        try:
            spec = _with_format_engine(pod_spec_from(args), args.format, settings)
        except BadInputError as exc:
            log.error("error: %s", exc)
            return 2
        urls = url_list(args)
        if args.measure:
            _measure_first(spec, urls, args.measure_budget, settings)
        try:
            result = select_backend(
                spec,
                urls=urls,
                deadline=args.deadline,
                cache_dir=args.cache_dir,
                use_cache=not args.no_cache,
                build=args.check,
                check=args.check,
                fail_on_auth_error=args.fail_on_auth_error,
                settings=settings,
            )
        except NoBackendError as exc:
            return _refused(exc, args)
        except AgentError as exc:
            log.error("error: %s", exc)
            return exit_code(exc)
        log.info("%s (%s)", result.backend, result.source)
        for message in result.messages:  # e.g. why a requested backend was not taken
            log.info("  %s", message)
        if args_format_engine(args.format) is not None and not result.engine_args:
            log.info(
                "the answer has no %s arguments (see above); printing none, so the engine "
                "keeps its own choice",
                result.engine.name,
            )
    _write(format_document(result.to_dict(), args.format))
    return 0


def _measure_first(
    spec: PodSpec, urls: list[str] | None, budget_s: float, settings: AgentSettings
) -> None:
    """``select --measure``: bench this pod in a child process, bounded by the budget.

    Never raises: a pod that cannot measure still boots on the decision.
    """
    from mla_switchboard.agent.bench import measure_in_child
    from mla_switchboard.agent.client import parse_urls

    notes = Notes()
    if spec.pretend:
        notes.info("not measuring: --capability/--device-name pretend to be another GPU")
        return
    try:
        report_to = urls if urls is not None else parse_urls(settings.url, URL)
    except ValueError:
        return  # the select right after says what is wrong with SWITCHBOARD_URL
    if not report_to:
        notes.warn(f"not measuring: no service URL to report to (--url or {URL})")
        return
    try:  # bad input fails the select right after; measuring it first would waste the budget
        spec.read_model()
        argv = spec.bench_argv()
    except BadInputError:
        return
    for url in report_to:
        argv += ["--url", url]
    given = {TOKEN: settings.token or "", TOKEN_FILE: settings.token_file or ""}
    try:  # --token/--token-file reach the child by its environment, never its argv
        measure_in_child(argv, budget_s, notes, env={k: v for k, v in given.items() if v})
    except Exception as exc:  # a boot never fails because measuring did
        notes.warn(f"measuring failed: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    raise SystemExit(select_main(sys.argv[1:]))
