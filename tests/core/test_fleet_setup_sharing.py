"""What a fleet-wide change's replay sets up per cluster and model is shared by the
clusters it holds for alike, and a decision's parts that only its description reads
are worked out once per description.

Counted, never timed: the stage layouts a replay works out (one per distinct pair of
rollout sets, not one per cluster and model), its plans (one per cluster where no
override there names a model), the overrides that apply asked where no
rollout may be partial (never), the narrowed inputs of clusters that trust one index
(one object), the engine choices of decisions of one description (one per
backend), and the evidence a cluster's pods trust (asked only where a decision reads
evidence). Every answer is still what deciding each alone gives.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from mla_switchboard.core import evaluator
from mla_switchboard.core.evaluator import Decision, DecisionInputs, decide
from mla_switchboard.core.evidence import EvidenceIndex
from mla_switchboard.core.schemas import SEED_RULES, SelectRequest
from mla_switchboard.service.fleet import groups, preview
from mla_switchboard.service.fleet.groups import FleetSnapshot
from mla_switchboard.service.fleet.narrowing import PerModel
from mla_switchboard.service.fleet.preview import replay

from tests.core.conftest import NOW, override, request
from tests.core.test_fleet_replay import (
    SHAPES,
    assert_moves_as_one_by_one,
    one_by_one,
    staged,
)
from tests.core.test_fleet_sharing import fleet_of, pods_of


def counted(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """``module.name`` from now on counting its calls, in the one-item list returned."""
    calls = [0]
    real = getattr(module, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, call)
    return calls


def layouts_of(n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, Any]:
    """The stage layouts a replay of a never-seen fleet-wide deny works out over ``n``
    clusters, every second one with a staged rollout of its own, and its preview."""
    made = counted(monkeypatch, preview._Layout, "of")
    clusters = [f"c{i}" for i in range(n)]
    own = tuple(
        staged(c, 10, deny=["CUDNN"]) if i % 2 else override(c, deny=["CUDNN"])
        for i, c in enumerate(clusters)
    )
    inputs = DecisionInputs(SEED_RULES, own, tag=(1, 1))
    proposed = replace(inputs, overrides=(*own, override("*", deny=["FLASH_ATTN"])))
    got = replay(fleet_of(clusters, inputs), inputs, proposed, now=NOW)
    return made[0], got


def test_a_replays_stage_layouts_are_one_per_pair_of_rollout_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    models = len({s.model.name for s in SHAPES})
    assert models > 1  # else sharing between a cluster's models shows nothing
    for n in (2, 6, 20):
        layouts, got = layouts_of(n, monkeypatch)
        assert got.pods_changed
        # one for every cluster without a staged rollout, one per staged cluster (its
        # rollout is its own), whatever the number of models each cluster has
        assert layouts == 1 + n // 2, (n, layouts)


def test_partial_rollouts_ask_nothing_of_what_applies_where_none_may_be_partial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = counted(monkeypatch, groups, "applicable_overrides")
    inputs = DecisionInputs(
        SEED_RULES,
        (
            override("*", deny=["FLASHINFER"]),
            override("east", deny=["CUDNN"]),
            staged("west", 10, deny=["TRTLLM_RAGGED"]),
        ),
    )
    classes = groups.ClassCache()
    east_request = SHAPES[0].model_copy(update={"cluster": "east"})
    west_request = SHAPES[0].model_copy(update={"cluster": "west"})
    assert classes.partials(east_request, inputs.overrides, NOW) == ()
    assert asked[0] == 0
    assert classes.partials(west_request, inputs.overrides, NOW) == groups.partial_rollouts(
        west_request, inputs.overrides, NOW
    )
    assert asked[0] == 2  # the cache's own ask, and the check's


def test_clusters_that_trust_one_index_share_one_narrowed_inputs() -> None:
    one, other = EvidenceIndex(), EvidenceIndex()
    inputs = DecisionInputs(SEED_RULES, (override("*", deny=["CUDNN"]),))
    trusted = {"east": one, "west": one, "north": other}

    def inputs_for(r: SelectRequest, given: DecisionInputs, now: datetime) -> DecisionInputs:
        return replace(given, evidence=trusted[r.cluster])

    narrow = PerModel(inputs_for)
    east, west, north = (
        narrow(SHAPES[0].model_copy(update={"cluster": c}), inputs, NOW)
        for c in ("east", "west", "north")
    )
    assert east is west and east.evidence is one
    assert north is not east and north.evidence is other
    assert east == replace(inputs, evidence=one)  # what each would be given alone

    def renamed(r: SelectRequest, given: DecisionInputs, now: datetime) -> DecisionInputs:
        return replace(given, evidence=one, tag=(len(r.cluster), 0))

    narrow = PerModel(renamed)
    a, b = (narrow(SHAPES[0].model_copy(update={"cluster": c}), inputs, NOW) for c in "ab")
    assert a is not b  # a field besides the evidence is the answer's own: not shared


def test_decisions_of_one_description_choose_each_backends_flags_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = counted(monkeypatch, evaluator, "choose")
    monkeypatch.setattr(evaluator, "_described_kept", {})
    monkeypatch.setattr(evaluator, "_refs_kept", {})
    inputs = DecisionInputs(SEED_RULES, (override("*", deny=["CUDNN"], note="fleet"),))
    pods = [request((9, 0), cluster=f"c{i}", pod=f"p{i}", engine=("vllm", None)) for i in range(8)]
    made = [decide(r, inputs, now=NOW) for r in pods]
    assert all(isinstance(d, Decision) for d in made)
    assert asked[0] == 1  # one description, one backend chosen
    assert len({id(d.overrides[0]) for d in made}) == 1  # one reference, shared
    # what a decision with nothing kept gives
    monkeypatch.setattr(evaluator, "_described_kept", {})
    monkeypatch.setattr(evaluator, "_refs_kept", {})
    alone = decide(pods[-1], inputs, now=NOW)
    assert alone == made[-1]


def outside_decisions(effects: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> int:
    """The decisions a never-seen fleet-wide deny's replay makes for pods outside the
    stage of their cluster's own 10 % rollout, over 8 clusters whose rollouts take
    ``effects`` in turn; the replay checked against deciding every pod alone."""
    keys: list[tuple[Any, ...]] = []
    real = groups.DecisionMemo.made_for

    def recorded(memo: Any, key: tuple[Any, ...], *args: Any) -> Any:
        if key not in memo._found:
            keys.append(key)
        return real(memo, key, *args)

    monkeypatch.setattr(groups.DecisionMemo, "made_for", recorded)
    clusters = [f"c{i}" for i in range(8)]
    own = tuple(staged(c, 10, **effects[i % len(effects)]) for i, c in enumerate(clusters))
    current = DecisionInputs(SEED_RULES, own)
    proposed = replace(current, overrides=(*own, override("*", deny=["FLASH_ATTN"])))
    pods = pods_of(clusters, per_shape=12)
    got = replay(FleetSnapshot.of_pods(pods), current, proposed, now=NOW)
    changes, invalid, pending, reasons = one_by_one(pods, current, proposed)
    assert got.pods_pending == pending
    assert_moves_as_one_by_one(got.model_dump(), changes, reasons)
    assert got.pods_changed == sum(changes.values()) and got.pods_changed
    assert {(i.cluster, i.from_): i.pods for i in got.invalid} == dict(invalid)
    return sum(1 for k in keys if k[4] and not k[4][-1])  # the stage bits: outside


def test_pods_outside_a_clusters_own_stage_share_decisions_whatever_its_effect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alike = outside_decisions([{"deny": ["CUDNN"]}], monkeypatch)
    differ = outside_decisions(
        [{"deny": ["CUDNN"]}, {"deny": ["TRTLLM_RAGGED"]}, {"force": "FLASHINFER"}], monkeypatch
    )
    assert alike  # some pods are outside the stage
    # three effects decide their pods outside the stage as one effect does
    assert differ == alike, (alike, differ)


def test_decisions_under_the_config_in_force_are_kept_across_reads_unless_they_read_evidence() -> (
    None
):
    inputs = DecisionInputs(
        SEED_RULES,
        (override("*", deny=["FLASHINFER"]), override("east", deny=["CUDNN"])),
        tag=(1, 1),
    )
    measured = replace(inputs, overrides=(*inputs.overrides, override("west", policy="measured")))
    kept = groups.KeptDecisions()

    def read(given: DecisionInputs) -> tuple[int, list[Any]]:
        """One read's decisions of every shape in east and west (side ""): how many it
        made, and what it answered."""
        memo = groups.DecisionMemo(NOW, groups.ClassCache(), kept.under(given))
        got = [
            memo.decision(
                shape.model_copy(update={"cluster": cluster}),
                f"s{i}",
                groups.EVERY_POD,
                given,
                lambda: given,
            )
            for cluster in ("east", "west")
            for i, shape in enumerate(SHAPES)
        ]
        return memo.made, got

    made, first = read(inputs)
    assert made
    again, second = read(replace(inputs, tag=(1, 2)))  # evidence moved: no decision reads it
    assert again == 0 and all(a is b for a, b in zip(first, second, strict=True))
    assert read(measured)[0] == made  # other overrides: decided again
    in_west = sum(1 for _ in SHAPES)  # west's pods read evidence under its policy
    assert read(measured)[0] == in_west
    assert read(inputs)[0] == made  # the kept ones are of one configuration


def test_only_decisions_that_read_evidence_ask_for_the_evidence_their_pods_trust(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clusters = ["east", "west", "north", "south"]
    own = (override("west", policy="measured"), override("north", deny=["CUDNN"]))
    current = DecisionInputs(SEED_RULES, own, tag=(1, 1))
    proposed = replace(current, overrides=(*own, override("*", deny=["FLASH_ATTN"])))
    asked: list[str] = []

    def inputs_for(r: SelectRequest, given: DecisionInputs, now: datetime) -> DecisionInputs:
        asked.append(r.cluster)
        return given  # every cluster trusts the one (empty) index

    pods = pods_of(clusters, per_shape=3)
    got = replay(FleetSnapshot.of_pods(pods), current, proposed, now=NOW, inputs_for=inputs_for)
    assert set(asked) == {"west"}  # the one cluster whose policy reads evidence
    changes, invalid, pending, reasons = one_by_one(pods, current, proposed)
    assert got.pods_changed == sum(changes.values()) and got.pods_changed
    assert_moves_as_one_by_one(got.model_dump(), changes, reasons)
    assert {(i.cluster, i.from_): i.pods for i in got.invalid} == dict(invalid)
    assert got.pods_pending == pending


def test_a_replay_plans_once_per_cluster_unless_an_override_there_names_a_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plans = counted(monkeypatch, preview._ModelPlan, "of")
    models = len({s.model.name for s in SHAPES})
    assert models > 1
    clusters = ["east", "west", "north"]
    own = (
        override("east", deny=["CUDNN"]),
        override("west", model="moonshotai/*", deny=["FLASHINFER"]),
    )
    current = DecisionInputs(SEED_RULES, own, tag=(1, 1))
    proposed = replace(current, overrides=(*own, override("*", deny=["FLASH_ATTN"])))
    pods = pods_of(clusters, per_shape=3)
    got = replay(FleetSnapshot.of_pods(pods), current, proposed, now=NOW)
    # one for east and one for north (no override there names a model), one per model
    # for west, whose own override names one
    assert plans[0] == 2 + models
    changes, invalid, pending, reasons = one_by_one(pods, current, proposed)
    assert got.pods_changed == sum(changes.values()) and got.pods_changed
    assert_moves_as_one_by_one(got.model_dump(), changes, reasons)
    assert {(i.cluster, i.from_): i.pods for i in got.invalid} == dict(invalid)
    assert got.pods_pending == pending


@pytest.mark.parametrize(
    ("current", "proposed", "key"),
    [
        ((), (), ""),
        ((override("*", deny=["CUDNN"]),), (), ""),
        ((override("east", deny=["CUDNN"]),), (override("*", deny=["CUDNN"]),), ""),
        ((override("west", model="deepseek-ai/*", deny=["CUDNN"]),), (), ""),  # not east's
        ((override("east", model="deepseek-ai/*", deny=["CUDNN"]),), (), "deepseek-ai/DeepSeek-R1"),
        ((), (override("*", model="moonshotai/*", deny=["CUDNN"]),), "deepseek-ai/DeepSeek-R1"),
    ],
)
def test_what_a_reads_per_model_work_is_keyed_by(
    current: tuple[Any, ...], proposed: tuple[Any, ...], key: str
) -> None:
    # the model's name only where an override that may apply to the cluster, on either
    # side, names a model (whether or not it matches this one: which apply is then a
    # function of the model)
    pod = request((9, 0), cluster="east")
    sides = [DecisionInputs(SEED_RULES, o).override_set for o in (current, proposed)]
    assert groups.ClassCache().model_key(pod, *sides) == key
