"""The agent's failure kinds, one per exit code of ``switchboard select``.

Kept apart from the modules that raise them so that the CLI can map them to exit
codes (:func:`exit_code`) without importing torch or httpx first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module before pydantic is needed
    from mla_switchboard.core.schemas import Candidate, SelectRequest

__all__ = [
    "AgentError",
    "BadInputError",
    "KernelBuildError",
    "MissingPackageError",
    "NoBackendError",
    "TokenRefused",
    "exit_code",
]


class AgentError(Exception):
    """Anything that stops the agent from handing the pod a backend (exit code 1)."""


class BadInputError(AgentError):
    """The pod description is wrong: not an MLA model, unreadable config, bad flag.

    Raised before any call to the service, because asking about a model we cannot
    describe truthfully would only record a wrong decision (exit code 2).
    """


class NoBackendError(AgentError):
    """The decision refused to name a backend: ``kind`` is ``requested_invalid`` (a
    strict request that is invalid) or ``no_valid_backend`` (nothing this pod, or its
    serving engine, accepts). ``candidates`` carry every backend's reasons, because
    "no backend" alone tells the operator nothing they can fix."""

    def __init__(
        self,
        message: str,
        candidates: Sequence[Candidate] = (),
        *,
        kind: str = "no_valid_backend",
    ) -> None:
        super().__init__(message)
        self.candidates = list(candidates)
        self.kind = kind
        # what was asked and what the agent observed on the way (set by select_backend)
        self.request: SelectRequest | None = None
        self.notes: list[str] = []
        self.pretend = False

    def explain(self) -> list[str]:
        """One line per candidate: its backend and why it cannot run (or that it could)."""
        lines = []
        for c in self.candidates:
            why = "; ".join(c.reasons) if c.reasons else ("valid" if c.valid else "no reason given")
            lines.append(f"{c.backend}: {why}")
        return lines


class KernelBuildError(AgentError):
    """Every candidate, TORCH_SDPA included, failed to build on this pod."""

    def __init__(self, message: str, failures: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.failures = failures


class MissingPackageError(AgentError):
    """A command needs a package this install lacks (``bench`` needs torch, which the
    plain install leaves out): said once, with how to install it, before any work
    (exit code 1)."""


class TokenRefused(AgentError):
    """The service refused the pod's token (401/403) and the caller asked to fail on it
    (``--fail-on-auth-error``) rather than boot on the seed rules (exit code 3)."""


def exit_code(error: AgentError) -> int:
    """The exit code a command ends with for ``error``: 2 bad input, 3 a refused token,
    1 the rest (a ``NoBackendError`` is the commands' own to answer first)."""
    if isinstance(error, BadInputError):
        return 2
    if isinstance(error, TokenRefused):
        return 3
    return 1
