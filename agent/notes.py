"""What the agent itself has to say about a selection, kept and logged at once.

The decision's own ``messages`` explain the choice; these notes say what happened
around it (the service was down, the cache was corrupt, a kernel did not build).
They go both into the result (JSON output, the Python API) and to the
``switchboard.agent`` logger, which the CLI sends to stderr and a serving process
sends wherever it sends its logs.
"""

from __future__ import annotations

import logging

__all__ = ["Notes", "log"]

log = logging.getLogger("switchboard.agent")


class Notes(list[str]):
    """A list of lines that also logs each line as it is added."""

    def info(self, message: str) -> None:
        self.append(message)
        log.info(message)

    def warn(self, message: str) -> None:
        self.append(message)
        log.warning(message)
