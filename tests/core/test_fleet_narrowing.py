"""A fleet read asks for the evidence its pods trust, and for their stage classes, once
per cluster and model, and gets what asking per pod gives (``service/fleet/narrowing.py``,
``ClassCache.stages``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.evidence import EvidenceIndex
from mla_switchboard.core.schemas import SEED_RULES, SelectRequest
from mla_switchboard.service.evidence.trust import trust_scope
from mla_switchboard.service.fleet.groups import ClassCache, partial_rollouts, stage_classes
from mla_switchboard.service.fleet.narrowing import PerModel, per_model

from tests.core.conftest import NOW, override
from tests.core.test_fleet_replay import SHAPES, staged

CLUSTERS = ("east", "west", "canary")
OVERRIDES = (
    staged("*", 20, deny=["TRTLLM_RAGGED"]),
    override("east", policy="measured", trust_clusters=["east", "west"], note="east trusts"),
    override("*", model="moonshotai/*", policy="measured", trust_clusters=["canary"], note="kimi"),
    staged("west", 30, force="FLASHINFER"),
    staged("canary", 50, model="moonshotai/*", force="CUDNN"),
)


class ByScope:
    """Evidence as the service picks it: an index per trust scope, counting the asks."""

    def __init__(self) -> None:
        self.indexes: dict[object, EvidenceIndex] = {}
        self.asked = 0

    def __call__(
        self, request: SelectRequest, inputs: DecisionInputs, now: datetime
    ) -> DecisionInputs:
        self.asked += 1
        scope = trust_scope(request, inputs, now)
        index = self.indexes.setdefault(scope, EvidenceIndex(min_samples=1, min_pods=1))
        return replace(inputs, evidence=index)


def pods() -> list[SelectRequest]:
    """Every shape in every cluster, several pods each (names differ, as in a fleet)."""
    return [
        shape.model_copy(update={"cluster": c, "pod": f"{c}-{i}-{n}"})
        for c in CLUSTERS
        for i, shape in enumerate(SHAPES)
        for n in range(3)
    ]


def test_the_evidence_trusted_is_asked_once_per_cluster_and_model() -> None:
    inputs = DecisionInputs(SEED_RULES, OVERRIDES, tag=(1, 1))
    hook = ByScope()
    once = per_model(hook)
    assert once is not None
    for r in pods():
        assert once(r, inputs, NOW).evidence is hook(r, inputs, NOW).evidence
    models = {(r.cluster, r.model.name) for r in pods()}
    assert hook.asked == len(pods()) + len(models)

    other = DecisionInputs(SEED_RULES, OVERRIDES[:2], tag=(2, 1))  # another configuration
    asked = hook.asked
    for r in pods():
        assert once(r, other, NOW).evidence is hook(r, other, NOW).evidence
    assert hook.asked - asked == len(pods()) + len(models)


def test_per_model_wraps_once_and_leaves_none() -> None:
    hook = ByScope()
    once = per_model(hook)
    assert isinstance(once, PerModel)
    assert per_model(once) is once
    assert per_model(None) is None


def test_stage_classes_per_cluster_and_model_are_each_pods() -> None:
    inputs = DecisionInputs(SEED_RULES, OVERRIDES, tag=(1, 1))
    classes = ClassCache()
    for r in pods():
        found = classes.stages(r, inputs.overrides, NOW)
        assert found == stage_classes(partial_rollouts(r, inputs.overrides, NOW))
        assert found == classes.of(classes.partials(r, inputs.overrides, NOW))
