"""``switchboard bench``: measure every backend valid on this pod and report it.

``agent/bench/`` says how (plan, run, report); this module reads the command line,
runs it and prints a table for people or the whole run as JSON. ``select --measure``
runs this module as a child process (``python -m``) within its budget.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from mla_switchboard.agent.commands.parsing import (
    POD_ENVIRONMENT,
    add_pod_arguments,
    add_url_argument,
    command_parser,
    parse_args,
    pod_spec_from,
    positive_float,
    positive_int,
    settings_from,
    url_list,
)
from mla_switchboard.agent.errors import AgentError, BadInputError, exit_code
from mla_switchboard.agent.notes import log, to_stderr
from mla_switchboard.agent.settings import URL, AgentSettings

if TYPE_CHECKING:
    from mla_switchboard.core.specs import Backend
    from mla_switchboard.kernels.base import MLAPrefillKernel

__all__ = ["DEFAULT_BENCH_BUDGET_S", "DEFAULT_REPORT_DEADLINE_S", "bench_main", "build_parser"]

DEFAULT_BENCH_BUDGET_S = 300.0
DEFAULT_REPORT_DEADLINE_S = 10.0


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "switchboard bench",
        "Measure every MLA prefill backend valid on this pod (reference check "
        "first, then TFLOP/s on prefill shapes with the model's dims, called as the layers of "
        "a forward pass call it) and report it to the Switchboard service as evidence for "
        "measured selection.",
        POD_ENVIRONMENT,
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
        type=positive_int,
        metavar="N",
        help="calls per forward pass with the same offsets, as a model's layers make them "
        "(default: the config's num_hidden_layers, else 8; 2 on a CPU)",
    )
    run.add_argument(
        "--budget",
        type=positive_float,
        default=DEFAULT_BENCH_BUDGET_S,
        metavar="SECONDS",
        help=f"start no new measurement after this (default {DEFAULT_BENCH_BUDGET_S:g})",
    )
    run.add_argument(
        "--iters",
        type=positive_int,
        default=20,
        metavar="N",
        help="timed forward passes per shape, at most (default 20)",
    )
    run.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda:0 when there is a GPU)")

    svc = p.add_argument_group("the service")
    add_url_argument(svc)
    svc.add_argument(
        "--deadline",
        type=positive_float,
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


def _report_urls(args: argparse.Namespace, settings: AgentSettings) -> list[str]:
    """Where the report goes: ``--url``, else ``$SWITCHBOARD_URL``; BadInputError when
    there is none and the report was not waived with ``--no-report``."""
    urls = url_list(args)
    if urls is None:
        from mla_switchboard.agent.client import parse_urls

        try:
            urls = parse_urls(settings.url, URL)
        except ValueError as exc:
            raise BadInputError(str(exc)) from None
    if not args.no_report and not urls:
        raise BadInputError(
            f"no service URL to report to (--url or {URL}); "
            "give one, or --no-report to measure only"
        )
    return urls


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
    args = parse_args(build_parser(), argv)
    if isinstance(args, int):
        return args

    from mla_switchboard.agent import bench

    settings = settings_from(args)
    with to_stderr():
        try:
            urls = _report_urls(args, settings)
            plan = bench.plan_bench(
                pod_spec_from(args),
                backends=args.backends.split(",") if args.backends is not None else None,
                shapes=args.shapes,
                device=args.device,
                budget_s=args.budget,
                iters=args.iters,
                layers=args.layers,
                settings=settings,
            )
        except AgentError as exc:
            log.error("error: %s", exc)
            return exit_code(exc)
        bench.log_plan(plan)
        with bench.interruptible() as interrupts:
            outcome = bench.run_bench(
                plan, kernel_classes=kernel_classes, started=started, interrupts=interrupts
            )
            status = bench.deliver(
                plan,
                outcome,
                no_report=args.no_report,
                urls=urls,
                token=settings.bearer,
                deadline_s=args.deadline,
            )
    if args.format == "json":
        text = json.dumps(bench.to_document(plan, outcome, report=status), indent=2) + "\n"
    else:
        text = bench.format_table(plan, outcome)
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0 if status.ok else 1


if __name__ == "__main__":
    raise SystemExit(bench_main(sys.argv[1:]))
