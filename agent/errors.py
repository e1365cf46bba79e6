"""The agent's failure kinds, one per exit code of ``switchboard select``.

Kept apart from the modules that raise them so that the CLI can map them to exit
codes (2 for bad input, 1 for the rest) without importing torch or httpx first.
"""

from __future__ import annotations

__all__ = ["AgentError", "BadInputError", "KernelBuildError", "NoBackendError"]


class AgentError(Exception):
    """Anything that stops the agent from handing the pod a backend (exit code 1)."""


class BadInputError(AgentError):
    """The pod description is wrong: not an MLA model, unreadable config, bad flag.

    Raised before any call to the service, because asking about a model we cannot
    describe truthfully would only record a wrong decision (exit code 2).
    """


class NoBackendError(AgentError):
    """The decision refused to name a backend (a strict request that is invalid)."""

    def __init__(self, message: str, candidates: list | None = None) -> None:
        super().__init__(message)
        self.candidates = candidates or []


class KernelBuildError(AgentError):
    """Every candidate, TORCH_SDPA included, failed to build on this pod."""

    def __init__(self, message: str, failures: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.failures = failures
