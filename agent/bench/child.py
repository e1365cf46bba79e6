"""``select --measure``: the bench in a child process that cannot outlast its budget.

A boot must never wait on a measurement: FlashInfer may JIT-compile for minutes, a
kernel may hang. The child measures for the budget less a reserve for its report; at
the soft limit it gets SIGTERM (it stops measuring and reports what it has), at the
budget its whole process group is killed. Whatever happens is a warning, never a
failed boot.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mla_switchboard.agent.notes import Notes

__all__ = ["measure_in_child"]


def _child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment, unbuffered, with ``extra`` (the token the parent was given as
    a flag: an environment variable, because a child's argv shows in ``ps``). The
    child is this interpreter (``sys.executable``), so it imports ``mla_switchboard``
    from where this process did."""
    return {**os.environ, **(extra or {}), "PYTHONUNBUFFERED": "1"}


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill what the child left in its process group (e.g. a JIT compiler)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def measure_in_child(
    bench_argv: Sequence[str],
    budget_s: float,
    notes: Notes,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
    """Run ``switchboard bench`` in a child process that cannot outlast ``budget_s``.

    The child measures for the budget less the time kept for its report; at the soft
    limit it gets SIGTERM (it stops measuring and reports what it has), at the budget
    SIGKILL for its whole process group. Returns its JSON document, or None (and a
    warning in ``notes``) when there is none: a failed measurement never fails a boot.
    """
    started = time.monotonic()
    post_s = min(3.0, max(0.5, budget_s * 0.1))
    measure_s = max(0.05, budget_s - post_s - 1.0)
    argv = [
        sys.executable, "-m", "mla_switchboard.agent.commands.bench", *bench_argv,
        "--budget", f"{measure_s:.3f}", "--deadline", f"{post_s:.3f}", "--format", "json",
    ]  # fmt: skip
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=_child_env(env),
            start_new_session=True,  # its own group: a stray compiler dies with it
        )
    except OSError as exc:
        notes.warn(f"could not start the measurement: {exc}")
        return None
    soft = started + budget_s - post_s - 0.5
    out = b""
    stopped = ""
    try:
        out, _ = proc.communicate(timeout=max(0.0, soft - time.monotonic()))
    except subprocess.TimeoutExpired:
        stopped = "stopped at its budget"
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=max(0.0, started + budget_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            stopped = "killed at its budget"
            _stop_group(proc)
            out, _ = proc.communicate()
        _stop_group(proc)
    finally:
        if proc.poll() is None:  # KeyboardInterrupt and the like
            _stop_group(proc)
            proc.wait()
    elapsed = time.monotonic() - started
    try:
        doc = json.loads(out.decode() or "null")
    except (UnicodeDecodeError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        why = stopped or f"it exited with code {proc.returncode}"
        notes.warn(f"measuring gave no result in {elapsed:.1f}s of a {budget_s:g}s budget ({why})")
        return None
    results = doc.get("results") or []
    correct = sum(1 for r in results if r.get("correct"))
    report = doc.get("report") or {}
    summary = (
        f"measured {len(results)} results ({correct} correct, {len(doc.get('skipped') or [])} "
        f"skipped) in {elapsed:.1f}s"
    )
    if stopped:
        summary += f"; {stopped}"
    if report.get("posted"):
        notes.info(f"{summary}; reported as measurement {report.get('measurement_id')}")
    elif results:
        notes.warn(f"{summary}; not reported: {report.get('error') or 'unknown reason'}")
    else:
        notes.info(f"{summary}; nothing to report")
    return doc
