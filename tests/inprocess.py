"""A command's ``main()`` run in the test process, as its own process would run it.

A ``switchboard`` process start costs about a second of CPU, nearly all of it imports;
a test that checks what a command says and returns (its messages, its exit code, the
database it touches) needs none of it. ``run_main`` gives ``main`` what a fresh process
would have (the environment and working directory given, ``sys.argv``, empty stdout and
stderr, Python's own exception printers, no registered secrets, the log as configured
before) and puts back the test process's own afterwards, so that neither sees the
other's: a secret another test registered cannot mask a leak here, and a command's
``dictConfig`` cannot silence the test process's loggers.

What only a process shows (its start, its signals, what the interpreter prints on its
way out) is tested with a real one: each command family keeps such a test.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Main = Callable[[Sequence[str]], int | None]


@dataclass
class _LoggerState:
    handlers: list[logging.Handler]
    filters: list[Any]
    level: int
    propagate: bool
    disabled: bool


def _loggers() -> dict[str, logging.Logger]:
    named = {
        name: logger
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    return {**named, "": logging.getLogger()}


@contextlib.contextmanager
def _log_kept() -> Iterator[None]:
    """The log's configuration (every logger's handlers, level and disabled flag, the
    record factory) as it was before, whatever the command configured."""
    factory = logging.getLogRecordFactory()
    before = {
        name: _LoggerState(list(lg.handlers), list(lg.filters), lg.level, lg.propagate, lg.disabled)
        for name, lg in _loggers().items()
    }
    try:
        yield
    finally:
        logging.setLogRecordFactory(factory)
        for name, lg in _loggers().items():
            state = before.get(name)
            added = [h for h in lg.handlers if state is None or h not in state.handlers]
            for handler in added:
                with contextlib.suppress(Exception):
                    handler.close()
            if state is None:
                lg.handlers, lg.filters = [], []
                lg.setLevel(logging.NOTSET)
                lg.propagate, lg.disabled = True, False
            else:
                lg.handlers, lg.filters = state.handlers, state.filters
                lg.setLevel(state.level)
                lg.propagate, lg.disabled = state.propagate, state.disabled


@contextlib.contextmanager
def _secrets_kept() -> Iterator[None]:
    """No secret registered for the command but those it registers itself; the test
    process's own set back afterwards."""
    from mla_switchboard.service import messages

    kept = set(messages._secrets)
    messages._secrets.clear()
    try:
        yield
    finally:
        messages._secrets.clear()
        messages._secrets.update(kept)


@contextlib.contextmanager
def _process_state(env: dict[str, str], cwd: Path, argv0: str) -> Iterator[None]:
    environ = dict(os.environ)
    here = Path.cwd()
    hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)
    argv = sys.argv
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [argv0]
    try:
        with _log_kept(), _secrets_kept():
            yield
    finally:
        sys.excepthook, threading.excepthook, sys.unraisablehook = hooks
        sys.argv = argv
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)


def run_main(
    main: Main, args: Sequence[str], *, env: dict[str, str], cwd: Path, argv0: str = "switchboard"
) -> subprocess.CompletedProcess[str]:
    """``main(args)`` with ``env`` as the whole environment and ``cwd`` as the working
    directory; its exit status, stdout and stderr as ``subprocess.run`` would give them.
    ``sys.exit``'s code is the status; an uncaught exception is printed by
    ``sys.excepthook`` (the command's own, when it installed one) and is status 1, as
    the interpreter does."""
    out, err = io.StringIO(), io.StringIO()
    with (
        _process_state(env, cwd, argv0),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code: object = main(list(args))
        except SystemExit as exc:
            code = exc.code
        except Exception:
            sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
            code = 1
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    returncode = 0 if code is None else int(code)  # type: ignore[call-overload]
    return subprocess.CompletedProcess([argv0, *args], returncode, out.getvalue(), err.getvalue())
