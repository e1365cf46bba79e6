"""``switchboard serve`` processes forked from one that has already imported the service.

A test that needs the service as a process (signals, kill -9, replicas, descriptor and
memory limits) still gets a real process: its own pid, sockets, signal handlers and
exit status, running the CLI's own ``serve`` with the arguments, environment and
working directory it was given. What it skips is Python's start and the imports (about
1.3 s of CPU of the 1.6 s a start costs): it is forked from a fork server that imported
the service once per test worker (the standard library's ``forkserver`` start method,
with the service's modules preloaded). The fork server itself starts no thread and
opens no store, so nothing but imported code is shared.

A start that must be a fresh interpreter (another checkout's code, a command prefix
such as ``prlimit``, a ``preexec_fn``) uses ``subprocess`` as before
(``tests/conftest.py`` chooses).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

# Preloaded by the fork server (see ``_context``): the imports every start would repeat.
import mla_switchboard.service.api.app  # noqa: F401
import uvicorn  # noqa: F401
from mla_switchboard.service import cli

_CONTEXT: Any = None


def _context() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        _CONTEXT = context
    return _CONTEXT


def _serve(argv: list[str], env: dict[str, str], cwd: str, log_path: str) -> None:
    """The child: the environment, directory and output a ``subprocess`` start would
    give it, then the CLI's ``main``; its return is the process's exit status."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    # as PYTHONUNBUFFERED=1: every line is in the log when the process is killed
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["switchboard", *argv]
    sys.exit(cli.main(argv))


class ForkedProcess:
    """The part of ``subprocess.Popen`` the tests use, for a forked service process."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self.pid: int = process.pid
        self.args = process.name

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_serve(argv: list[str], *, env: dict[str, str], cwd: Path, log_path: Path) -> ForkedProcess:
    """Start ``switchboard <argv>`` as a process forked from the preloaded fork server."""
    log_path.touch()  # there even when the child fails before it opens it
    process = _context().Process(
        target=_serve,
        args=(argv, env, str(cwd), str(log_path)),
        name=f"switchboard {' '.join(argv)}",
        # a test that leaks one must not hold its worker's exit (multiprocessing joins
        # the others): daemonic ones are terminated then
        daemon=True,
    )
    process.start()
    return ForkedProcess(process)
