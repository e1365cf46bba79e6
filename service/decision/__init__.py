"""The decision engine, shared by the service and the agent's local fallback."""

from service.decision.engine import (
    Decision,
    Refusal,
    applicable_overrides,
    context_of,
    decide,
    priority_list,
)
from service.schemas import SEED_RULES

__all__ = [
    "SEED_RULES",
    "Decision",
    "Refusal",
    "applicable_overrides",
    "context_of",
    "decide",
    "decide_locally",
    "priority_list",
]


def decide_locally(request: "SelectRequest") -> "Decision | Refusal":  # noqa: F821
    """The agent's fail-static answer: the seed rules, no overrides, no evidence."""
    from datetime import UTC, datetime

    return decide(request, SEED_RULES, (), now=datetime.now(UTC))
