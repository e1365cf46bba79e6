"""The evidence a fleet read's pods trust, found once per cluster and model.

``inputs_for`` (the selector's hook) gives a request the evidence its trust scope
allows; that scope is a function of the overrides that apply to it, which depend on
its cluster and model only (``applicable_overrides``). A fleet read asks for it per
group and stage class, several times per group (the regret, the exclusions, the
progress, both sides of a preview): thousands of times for what a thousand clusters
and a few models decide. :func:`per_model` asks once per (inputs, cluster, model).
"""

from __future__ import annotations

from datetime import datetime

from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.service.selector import InputsFor

__all__ = ["PerModel", "per_model"]


class PerModel:
    """``inputs_for``, asked once per (inputs, cluster, model, now) within one read.

    The inputs are held with each answer: an id is only theirs while they are alive.
    A scope's index built meanwhile moves the evidence generation, which a kept read
    keys on, so what one read saw is never taken for another's."""

    def __init__(self, inputs_for: InputsFor) -> None:
        self._inputs_for = inputs_for
        # by the inputs' id, cluster and model: ``now`` is held with the answer and
        # compared (one read asks with one ``now``; hashing it per ask costs more)
        self._found: dict[
            tuple[int, str, str], tuple[DecisionInputs, datetime, DecisionInputs]
        ] = {}

    def __call__(
        self, request: SelectRequest, inputs: DecisionInputs, now: datetime
    ) -> DecisionInputs:
        key = (id(inputs), request.cluster, request.model.name)
        found = self._found.get(key)
        if found is None or found[0] is not inputs or (found[1] is not now and found[1] != now):
            found = self._found[key] = (inputs, now, self._inputs_for(request, inputs, now))
        return found[2]


def per_model(inputs_for: InputsFor | None) -> InputsFor | None:
    """``inputs_for`` asked once per cluster and model (None stays None; one already
    so is returned as it is)."""
    if inputs_for is None or isinstance(inputs_for, PerModel):
        return inputs_for
    return PerModel(inputs_for)
