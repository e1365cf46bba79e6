"""The cluster names this service knows, for counting refused selects by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.schemas import FLEET
from mla_switchboard.service.fleet.groups import Fleet


@dataclass(eq=False)
class KnownClusters:
    inputs: Callable[[], DecisionInputs]
    fleet: Fleet

    def __call__(self) -> frozenset[str]:
        """Those with live pods, an override or a rule set of their own (reads the
        fleet's counts: not for the event loop)."""
        inputs = self.inputs()
        names = {o.cluster for o in inputs.overrides if o.cluster != FLEET}
        names.update(inputs.rules.clusters)
        names.update(g.cluster for g in self.fleet.current().groups)
        return frozenset(names)
