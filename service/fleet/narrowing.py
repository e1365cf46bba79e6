"""The evidence a fleet read's pods trust, found once per cluster and model.

``inputs_for`` (the selector's hook) gives a request the evidence its trust scope
allows; that scope is a function of the overrides that apply to it, which depend on
its cluster and model only (``applicable_overrides``). A fleet read asks for it per
group and stage class, several times per group (the regret, the exclusions, the
progress, both sides of a preview): thousands of times for what a thousand clusters
and a few models decide. :func:`per_model` asks once per (inputs, cluster, model).
"""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from operator import attrgetter, is_

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
        # per (inputs, evidence) answered: the first such answer, so that every
        # cluster and model that trusts one index gets one object (``_shared``)
        self._alike: dict[tuple[int, int], tuple[DecisionInputs, DecisionInputs]] = {}

    def __call__(
        self, request: SelectRequest, inputs: DecisionInputs, now: datetime
    ) -> DecisionInputs:
        key = (id(inputs), request.cluster, request.model.name)
        found = self._found.get(key)
        if found is None or found[0] is not inputs or (found[1] is not now and found[1] != now):
            narrowed = self._shared(inputs, self._inputs_for(request, inputs, now))
            found = self._found[key] = (inputs, now, narrowed)
        return found[2]

    def _shared(self, inputs: DecisionInputs, narrowed: DecisionInputs) -> DecisionInputs:
        """``narrowed``, or an earlier answer for ``inputs`` equal to it field by field
        (the same objects: ``inputs`` with the same evidence index). The stand-ins, the
        overrides that apply and the evidence tests of a read are kept per inputs
        object, so a thousand clusters that trust one index then share them instead of
        building each anew for a copy of the same inputs."""
        if not _only_evidence(inputs, narrowed):
            return narrowed
        key = (id(inputs), id(narrowed.evidence))
        kept = self._alike.get(key)
        if kept is not None and kept[0] is inputs and kept[1].evidence is narrowed.evidence:
            return kept[1]
        self._alike[key] = (inputs, narrowed)
        return narrowed


def _only_evidence(inputs: DecisionInputs, narrowed: DecisionInputs) -> bool:
    """Whether ``narrowed`` is ``inputs`` but (perhaps) for its evidence: every other
    field the very same object."""
    return all(map(is_, _besides_evidence(narrowed), _besides_evidence(inputs)))


_besides_evidence = attrgetter(*(f.name for f in fields(DecisionInputs) if f.name != "evidence"))
"""Every field of a ``DecisionInputs`` but its evidence, as a tuple."""


def per_model(inputs_for: InputsFor | None) -> InputsFor | None:
    """``inputs_for`` asked once per cluster and model (None stays None; one already
    so is returned as it is)."""
    if inputs_for is None or isinstance(inputs_for, PerModel):
        return inputs_for
    return PerModel(inputs_for)
