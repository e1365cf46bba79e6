"""``switchboard select``: print the decision for the serving process to use.

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

from agent.api import SelectionResult, parse_packages, select_backend
from agent.client import parse_urls
from agent.errors import AgentError, BadInputError
from agent.notes import log
from kernels.specs import Backend

__all__ = ["VLLM_BACKENDS", "build_parser", "format_result", "select_main"]

VLLM_BACKENDS = frozenset(
    {Backend.TRTLLM_RAGGED, Backend.FLASHINFER, Backend.CUDNN, Backend.FLASH_ATTN}
)
"""The backends vLLM's ``--attention-config.mla_prefill_backend`` accepts."""

VLLM_FLAG = "--attention-config.mla_prefill_backend"


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


def select_main(argv: Sequence[str]) -> int:
    """Run ``switchboard select`` with ``argv`` (the arguments after ``select``)."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except _ArgumentError as exc:
        parser.print_usage(sys.stderr)
        print(f"switchboard select: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)

    with _stderr_logging():
        try:
            urls = None
            if args.url:
                urls = [u for item in args.url for u in parse_urls(item)]
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


if __name__ == "__main__":  # pragma: no cover - python -m agent.cli
    raise SystemExit(select_main(sys.argv[1:]))
