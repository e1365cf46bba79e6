"""A decider (``DecisionMemo.decider``) is the memo's own decision for the groups of
one cluster and model: what they share is found once, and the decisions it gives are
those ``DecisionMemo.decision`` gives, kept under the same keys."""

from __future__ import annotations

import pytest
from mla_switchboard.core.evaluator import DecisionInputs, Refusal, decide
from mla_switchboard.core.schemas import SEED_RULES
from mla_switchboard.service.fleet.effects import words
from mla_switchboard.service.fleet.groups import ClassCache, DecisionMemo, FleetSnapshot

from tests.core.conftest import NOW
from tests.core.test_fleet_effects import SCENARIOS, names, world


def _answer(decided: object, own: tuple) -> tuple[str, ...]:
    if isinstance(decided, Refusal):
        return ("refused", words(decided.message, own))
    return (decided.backend.value, words(decided.why, own))  # type: ignore[attr-defined]


@pytest.mark.parametrize("staged", [False, True], ids=["whole", "staged"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_decider_gives_what_the_memo_and_the_evaluator_give(scenario: str, staged: bool) -> None:
    clusters = names(6)
    fleet_pods, current, _ = world(clusters, scenario, staged)
    snapshot = FleetSnapshot.of_pods(fleet_pods)
    through_decider = DecisionMemo(NOW, ClassCache())
    through_memo = DecisionMemo(NOW, ClassCache())
    classes = ClassCache()
    for cluster, groups in snapshot.by_cluster.items():
        own = current.override_set.own(cluster)
        deciders: dict[str, object] = {}
        for group in groups:
            request = group.request
            assert request is not None
            decider = deciders.get(request.model.name)
            if decider is None:
                decider = deciders[request.model.name] = through_decider.decider(
                    request, current, lambda: current
                )
            for stage in classes.stages(request, current.overrides, NOW):
                one = decider(request, group.shape_id, stage)  # type: ignore[operator]
                other = through_memo.decision(
                    request, group.shape_id, stage, current, lambda: current
                )
                alone = decide(request, current, now=NOW, bucket=stage.bucket)
                assert _answer(one, own) == _answer(other, own) == _answer(alone, own)
    # the same keys: as many decisions made either way, and fewer than groups x classes
    assert through_decider.made == through_memo.made
    assert through_decider.made < sum(len(g) for g in snapshot.by_cluster.values())


def test_a_decision_made_through_a_decider_is_the_one_the_memo_finds() -> None:
    clusters = names(4)
    fleet_pods, current, _ = world(clusters, "deny, * deleted", False)
    snapshot = FleetSnapshot.of_pods(fleet_pods)
    memo = DecisionMemo(NOW, ClassCache())
    group = snapshot.groups[0]
    request = group.request
    assert request is not None
    stage = ClassCache().stages(request, current.overrides, NOW)[0]
    decider = memo.decider(request, current, lambda: current, side="to")
    first = decider(request, group.shape_id, stage)
    made = memo.made
    again = memo.decision(request, group.shape_id, stage, current, lambda: current, side="to")
    assert again is first and memo.made == made
    elsewhere = memo.decision(request, group.shape_id, stage, current, lambda: current, side="from")
    assert elsewhere is not first and memo.made == made + 1


def test_the_inputs_of_a_decider_are_asked_once() -> None:
    clusters = names(2)
    fleet_pods, current, _ = world(clusters, "force, * deleted", True)
    snapshot = FleetSnapshot.of_pods(fleet_pods)
    asked: list[DecisionInputs] = []

    def narrow() -> DecisionInputs:
        asked.append(current)
        return current

    memo = DecisionMemo(NOW, ClassCache())
    groups = snapshot.of_cluster(clusters[0])
    request = groups[0].request
    assert request is not None
    decider = memo.decider(request, current, narrow)
    for group in groups:
        if group.request is not None and group.request.model.name == request.model.name:
            for stage in ClassCache().stages(group.request, current.overrides, NOW):
                decider(group.request, group.shape_id, stage)
    assert len(asked) <= 1


def test_a_kept_stand_in_is_the_one_made_each_time() -> None:
    from mla_switchboard.service.fleet.effects import StandIns, _stand_in

    from tests.core.conftest import override
    from tests.core.test_fleet_replay import SHAPES

    own = override("c001", deny=["CUDNN"], note="mine")
    inputs = DecisionInputs(SEED_RULES, (override("*", deny=["FLASHINFER"], note="f"), own))
    kept = StandIns()
    for shape in SHAPES:
        request = shape.model_copy(update={"cluster": "c001"})
        made_request, made_inputs = _stand_in(request, inputs, own)
        for _ in range(2):
            kept_request, kept_inputs = kept.of(request, inputs, own)
            assert kept_request == made_request
            assert tuple(kept_inputs.overrides) == tuple(made_inputs.overrides)
            assert kept_inputs.rules is made_inputs.rules
            assert kept_inputs.evidence is made_inputs.evidence
        assert kept.of(request, inputs, own)[1] is kept.of(request, inputs, own)[1]


def test_a_situation_given_decides_as_the_one_worked_out() -> None:
    from mla_switchboard.core.evidence import situation_of

    from tests.core.conftest import override
    from tests.core.test_fleet_replay import SHAPES

    inputs = DecisionInputs(
        SEED_RULES, (override("*", deny=["FLASHINFER"], note="f", policy="measured"),)
    )
    for shape in SHAPES:
        given = decide(shape, inputs, now=NOW, situation=situation_of(shape))
        assert given == decide(shape, inputs, now=NOW)
