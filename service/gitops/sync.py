"""The declarative mode, for GitOps controllers: the service reads the overrides file
from a mounted path (a ConfigMap, as flagd's file sync does), and when its content
changes plans it (the plan goes to the log) and applies it (one audit entry per
change, the file sync as actor). Console writes to what the file owns are refused
meanwhile (``managed.py``).

Every replica watches the same file; the first to apply a change wins, the others find
nothing left to do (or a 412 in a race, and look again at the next round)."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from mla_switchboard.service.gitops.document import OverridesFile, content_revision
from mla_switchboard.service.gitops.lines import read_file
from mla_switchboard.service.gitops.planning import OverridesAsCode
from mla_switchboard.service.gitops.report import text
from mla_switchboard.service.identity.auth import Principal
from mla_switchboard.service.messages import first_line
from mla_switchboard.service.outcomes import Done
from mla_switchboard.service.periodic import Periodic
from mla_switchboard.service.writes.managed import SYNC_ID, ManagedScopes
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("switchboard.gitops")


@dataclass(eq=False)
class FileSync:
    path: Path
    prune: bool
    poll_s: float
    service: OverridesAsCode
    managed: ManagedScopes
    _handled: str | None = field(default=None, init=False)
    """The sha256 of the content last applied (or refused for its mistakes)."""
    _periodic: Periodic | None = field(default=None, init=False)

    @property
    def principal(self) -> Principal:
        """Who the audit says applied it: the file sync, named after the file."""
        return Principal(f"{self.path.name} (file sync)", "admin", None, SYNC_ID)

    def start(self) -> None:
        try:  # before the first request: console writes are refused from the start
            self.sync()
        except SQLAlchemyError as exc:  # the store is away: the rounds below try again
            log.warning("overrides file %s not applied at start: %s", self.path, first_line(exc))
        self._periodic = Periodic("overrides-file", self.poll_s, self.sync, log)
        self._periodic.start()

    def stop(self) -> None:
        if self._periodic is not None:
            self._periodic.stop()

    def sync(self) -> None:
        """One round: apply the file when its content changed since it was handled."""
        try:
            content = self.path.read_bytes()
        except OSError as exc:
            log.warning("overrides file %s unreadable: %s", self.path, exc.strerror)
            return
        digest = hashlib.sha256(content).hexdigest()
        if digest == self._handled:
            return
        found = read_file(content.decode("utf-8", "replace"), str(self.path))
        if not isinstance(found, OverridesFile):
            for problem in found:
                log.error("overrides file not applied: %s", problem)
            self._handled = digest  # said once; the previous file stays in force
            return
        self.apply(found, digest)

    def apply(self, document: OverridesFile, digest: str) -> None:
        revision = content_revision(document)
        self.managed.own(
            self.path.name,
            revision,
            document.overrides,
            rules=document.rules is not None,
            prune=self.prune,
        )
        principal = self.principal
        plan = self.service.plan(principal, document, prune=self.prune)
        if not isinstance(plan, Done):
            log.error("overrides file rev %s not planned: %s", revision, plan.message)
            return
        if not plan.body["changed"]:
            self._handled = digest
            return
        for line in text(plan.body, str(self.path)).splitlines():
            log.info("%s", line)
        done = self.service.apply(
            principal,
            document,
            prune=self.prune,
            revision=revision,
            etags=plan.body["etags"],
        )
        if isinstance(done, Done):
            log.info("overrides file rev %s applied", revision)
            self._handled = digest
        else:  # another replica applied it first, or the store is away: next round
            log.warning("overrides file rev %s not applied: %s", revision, done.message)
