"""What the declarative mode's file owns, as the console's writes ask it: a write to a
managed scope is refused with the reason (``managed by overrides.yaml rev X``), so a
hand change cannot be silently reverted at the file's next sync."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

SYNC_ID = "file-sync"
"""The principal id of the declarative mode's file sync (the one writer it lets in)."""


@dataclass(frozen=True)
class Owned:
    name: str
    revision: str
    scopes: frozenset[str]
    every_scope: bool  # the file is synced with prune: it owns every override
    rules: bool


@dataclass(eq=False)
class ManagedScopes:
    """Set by the file sync when it reads a file (``service/gitops/sync.py``); empty
    when the service runs without one. Kept with the writes it refuses, so the writes
    never depend on the declarative mode's package."""

    _owned: Owned | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def own(
        self, name: str, revision: str, scopes: Iterable[str], *, rules: bool, prune: bool
    ) -> None:
        """The file ``name`` at ``revision`` now owns ``scopes`` (every scope with
        ``prune``) and, with ``rules``, the rule set."""
        owned = Owned(name, revision, frozenset(scopes), prune, rules)
        with self._lock:
            self._owned = owned

    def override(self, scope: str) -> str | None:
        """Why a console write to ``scope``'s override is refused (None: it is not)."""
        owned = self._owned
        if owned is None or not (owned.every_scope or scope in owned.scopes):
            return None
        return self._reason(owned, f"override {scope!r}")

    def rules(self) -> str | None:
        owned = self._owned
        return None if owned is None or not owned.rules else self._reason(owned, "the rules")

    @staticmethod
    def _reason(owned: Owned, what: str) -> str:
        return (
            f"{what} is managed by {owned.name} rev {owned.revision} (declarative mode): "
            "change the file instead"
        )

    @property
    def active(self) -> bool:
        return self._owned is not None
