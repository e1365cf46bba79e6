"""What the agent itself has to say about a selection, kept and logged at once.

The decision's own ``messages`` explain the choice; these notes say what happened
around it (the service was down, the cache was corrupt, a kernel did not build).
They go both into the result (JSON output, the Python API) and to the
``switchboard.agent`` logger, which the CLI sends to stderr and a serving process
sends wherever it sends its logs.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

__all__ = ["Notes", "log", "to_stderr"]

log = logging.getLogger("switchboard.agent")


class Notes(list[str]):
    """A list of lines that also logs each line as it is added."""

    def info(self, message: str) -> None:
        self.append(message)
        log.info(message)

    def warn(self, message: str) -> None:
        self.append(message)
        log.warning(message)

    def error(self, message: str) -> None:
        """A configuration error the pod survives but someone must fix."""
        self.append(message)
        log.error(message)


@contextlib.contextmanager
def to_stderr() -> Iterator[None]:
    """Send the agent's log to stderr, prefixed ``switchboard:``, while a command runs.

    stdout carries only the answer (it is expanded into the engine's command line);
    everything for a person goes here. The logger's own settings come back afterwards,
    so a process that calls a command in-process keeps its logging as it was.
    """
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
