"""Every change of a file previewed together: one replay of the recorded fleet under
the configuration the file would leave in force, not one preview per change (two
overrides that both apply to a cluster's pods, ``*`` and the cluster's own, move them
once, to where both together send them)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from datetime import datetime

from mla_switchboard.core import rollouts
from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.schemas import Override
from mla_switchboard.service.fleet.preview import with_override
from mla_switchboard.service.fleet.reads import Proposal
from mla_switchboard.service.gitops.diff import Change
from mla_switchboard.service.identity.auth import Principal


@dataclass(frozen=True)
class CombinedProposal(Proposal):
    """New rules (or None) and several scopes' overrides put or deleted at once. The
    overrides the file leaves alone stay the very objects in force, so the replay
    decides again only the clusters an override of the file applies to (or every
    cluster, when the rules or ``*`` change)."""

    overrides: tuple[tuple[str, Override | None], ...] = ()

    def digest(self) -> str:
        body = {
            "rules": None if self.rules is None else self.rules.rules_only(),
            "overrides": [
                [scope, None if o is None else o.model_dump(mode="json", exclude={"created_at"})]
                for scope, o in self.overrides
            ],
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def applied_to(self, current: DecisionInputs) -> DecisionInputs:
        overrides = list(current.overrides)
        for scope, proposed in self.overrides:
            overrides = with_override(overrides, scope, proposed)
        return replace(
            current,
            rules=self.rules if self.rules is not None else current.rules,
            overrides=tuple(overrides),
            tag=(-1, -1),
        )


def combined(changes: list[Change], principal: Principal, now: datetime) -> CombinedProposal:
    """The proposal of every change of a plan; a staged override starts its rollout
    now, as ``PUT /v1/overrides/{cluster}`` would (so the same pods are in its stage)."""
    rules = next((c.rules for c in changes if c.rules is not None), None)
    overrides: list[tuple[str, Override | None]] = []
    for change in changes:
        if change.resource != "override":
            continue
        proposed = None
        if change.spec is not None:
            proposed = Override.model_validate(
                {
                    **rollouts.stored_payload(change.target, change.spec, now),
                    "cluster": change.target,
                    "created_at": now,
                    "created_by": principal.name,
                    "revision": 0,
                }
            )
        overrides.append((change.target, proposed))
    return CombinedProposal(rules=rules, overrides=tuple(overrides))
