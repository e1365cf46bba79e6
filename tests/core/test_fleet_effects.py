"""Clusters whose overrides act alike share one decision (``service/fleet/effects.py``),
and the answers still name each cluster's own override, exactly as deciding every pod
alone names it; a caller limited to some clusters reads nothing of the others.

The decisions are counted through the evaluator's entry points the fleet reads call
(a counting pass-through, nothing replaced), so the growth of a fleet-wide change's
cost is checked as a count, not a time."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from mla_switchboard.core.evaluator import DecisionInputs, Refusal, decide
from mla_switchboard.core.schemas import SEED_RULES, Override, OverrideSpec, rollout_id
from mla_switchboard.service.fleet import effects
from mla_switchboard.service.fleet.groups import FleetSnapshot
from mla_switchboard.service.fleet.preview import Preview, replay, with_override
from mla_switchboard.service.fleet.reads import Proposal
from mla_switchboard.service.state import PodState

from tests.core.conftest import NOW, override
from tests.core.test_fleet_parts import Quiet, Snapshots
from tests.core.test_fleet_replay import SHAPES, assert_moves_as_one_by_one, one_by_one

FLEET_READ_BUDGET_S = 600


def names(n: int) -> list[str]:
    return [f"c{i:03d}" for i in range(n)]


def own(cluster: str, staged: bool = False, **effect: Any) -> Override:
    """``cluster``'s override: the same effect on every cluster, a note of its own."""
    note = f"why {cluster} did it"
    if not staged:
        return override(cluster, note=note, **effect)
    spec = OverrideSpec.model_validate({**effect, "note": note})
    rollout = {"percent": 50, "id": rollout_id(cluster, spec)}
    return override(cluster, note=note, rollout=rollout, **effect)


def pods(clusters: list[str], inputs: DecisionInputs, per_cluster: int = 60) -> list[PodState]:
    """Pods of every shape in each cluster, each on what ``inputs`` gives it."""
    rng = random.Random(3)
    out = []
    for cluster in clusters:
        for i in range(per_cluster):
            shape = SHAPES[i % len(SHAPES)]
            r = shape.model_copy(update={"cluster": cluster, "pod": f"{cluster}-{i}"})
            d = decide(r, inputs, now=NOW)
            backend = "FLASH_ATTN" if isinstance(d, Refusal) else d.backend.value
            if rng.random() < 0.1:
                backend = "CUDNN"  # booted under an older configuration
            out.append(PodState(cluster, "n", r.pod or "", f"d{i}", backend, "priority",
                                r.model_dump_json()))  # fmt: skip
    return out


class Counted:
    """How many decisions and assessments the fleet reads made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        for name in ("decide", "assess"):
            real = getattr(effects, name)

            def counted(*args: Any, _real: Any = real, **kw: Any) -> Any:
                self.calls += 1
                return _real(*args, **kw)

            monkeypatch.setattr(effects, name, counted)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counted:
    return Counted(monkeypatch)


SCENARIOS = {
    # the fleet's force gives way: a strict request for what each cluster denies is
    # refused in the words of that cluster's own override
    "deny, * deleted": (
        lambda c, staged: own(c, staged, deny=["TRTLLM_RAGGED"]),
        override("*", force="FLASHINFER", note="fleet force"),
    ),
    # the fleet's deny goes: each cluster's own force is valid again, and says so
    "force, * deleted": (
        lambda c, staged: own(c, staged, force="CUDNN"),
        override("*", deny=["CUDNN"], note="fleet deny"),
    ),
}


def world(
    clusters: list[str], scenario: str, staged: bool
) -> tuple[list[PodState], DecisionInputs, DecisionInputs]:
    make, fleet_wide = SCENARIOS[scenario]
    current = DecisionInputs(SEED_RULES, (fleet_wide, *(make(c, staged) for c in clusters)))
    proposed = replace(current, overrides=tuple(with_override(current.overrides, "*", None)))
    return pods(clusters, current), current, proposed


def refusals(fleet: list[PodState], current: DecisionInputs, proposed: DecisionInputs) -> Counter:
    """(cluster, backend left, refusal) of each pod the proposal refuses, deciding it alone."""
    out: Counter[tuple[str, str, str]] = Counter()
    for p in fleet:
        assert p.request is not None
        before, after = decide(p.request, current, now=NOW), decide(p.request, proposed, now=NOW)
        if isinstance(after, Refusal) and not isinstance(before, Refusal):
            out[(p.cluster, before.backend.value, after.message)] += 1
    return out


def texts(preview: Preview) -> list[tuple[str, str]]:
    """(cluster, words) of every reason and refusal the preview gives."""
    shown = preview.model_dump()
    out = [(c["cluster"], w) for c in shown["changes"] for r in c["reasons"] for w in r["why"]]
    return out + [(i["cluster"], i["reason"]) for i in shown["invalid"]]


@pytest.mark.parametrize("staged", [False, True], ids=["whole", "staged"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_alike_overrides_share_decisions_and_each_answer_names_its_own(
    counted: Counted, scenario: str, staged: bool
) -> None:
    clusters = names(3)
    fleet, current, proposed = world(clusters, scenario, staged)
    counted.calls = 0
    got = replay(FleetSnapshot.of_pods(fleet), current, proposed, now=NOW)
    shared = counted.calls

    changes, _, pending, reasons = one_by_one(fleet, current, proposed)
    shown = got.model_dump()
    assert_moves_as_one_by_one(shown, changes, reasons)
    assert Counter(
        {(i["cluster"], i["from"], i["reason"]): i["pods"] for i in shown["invalid"]}
    ) == (refusals(fleet, current, proposed))
    assert got.pods_pending == pending

    said = texts(got)
    mentions = [(c, w) for c, w in said if "why c0" in w]
    assert mentions, "the scenario must put a cluster's own override into words"
    for cluster, words in said:
        assert "\x00" not in words
        for other in clusters:
            assert (f"override {other}" in words) == (
                other == cluster and f"override {other}" in words
            )
    assert {c for c, _ in mentions} == set(clusters)
    for cluster, words in mentions:
        assert f"why {cluster} did it" in words

    # one cluster alone costs what all three cost: their overrides act alike
    one, *_ = world(clusters[:1], scenario, staged)
    _, current1, proposed1 = world(clusters[:1], scenario, staged)
    counted.calls = 0
    replay(FleetSnapshot.of_pods(one), current1, proposed1, now=NOW)
    assert shared == counted.calls


@pytest.fixture
def reads_over() -> Iterator[Any]:
    from mla_switchboard.service.fleet.reads import FleetReads, ReadSettings

    made: list[FleetReads] = []

    def make(fleet: list[PodState], inputs: dict[str, DecisionInputs]) -> FleetReads:
        snapshots = Snapshots(FleetSnapshot.of_pods(fleet, version=1))

        class NoEvidence:
            def inputs_for(self, request: Any, given: DecisionInputs, now: Any) -> DecisionInputs:
                return given

            def of_cluster(self, cluster: str) -> Any:
                return inputs["inputs"].evidence

        reads = FleetReads(
            snapshots,  # type: ignore[arg-type]
            Quiet(),  # type: ignore[arg-type]
            NoEvidence(),  # type: ignore[arg-type]
            lambda: inputs["inputs"],
            ReadSettings(FLEET_READ_BUDGET_S, 1, 1),
        )
        made.append(reads)
        return reads

    yield make
    for reads in made:
        reads.close()


def test_a_scoped_caller_reads_nothing_of_other_clusters(reads_over: Any) -> None:
    clusters = names(3)
    fleet, current, _ = world(clusters, "deny, * deleted", False)
    reads = reads_over(fleet, {"inputs": current})
    mine = {"c001"}.__contains__
    got = reads.preview(Proposal(override_scope="*", override=None), ("c001",), mine)
    said = texts(got)
    assert said and {c for c, _ in said} == {"c001"}
    body = got.model_dump_json()
    for other in ("c000", "c002"):
        assert other not in body
    assert "why c001 did it" in body


def fleet_change_cost(clusters: int, reads_over: Any, counted: Counted, every: int = 1) -> int:
    """Decisions made by a dry run of a fleet-wide change, the change, and the summary
    after it, with an override on every ``every``-th cluster (every second staged)."""
    names_ = names(clusters)
    overrides = [
        own(
            c,
            staged=bool(i // every % 2),
            deny=["TRTLLM_RAGGED"] if i // every % 4 < 2 else ["CUDNN"],
        )
        for i, c in enumerate(names_)
        if i % every == 0
    ]
    inputs = {"inputs": DecisionInputs(SEED_RULES, tuple(overrides), tag=(1, 1))}
    reads = reads_over(pods(names_, inputs["inputs"], per_cluster=10), inputs)
    reads.summary(None, None)
    counted.calls = 0
    fleet_deny = override("*", deny=["FLASHINFER"], note="fleet change")
    reads.preview(Proposal(override_scope="*", override=fleet_deny), None, None)
    inputs["inputs"] = replace(
        inputs["inputs"], overrides=(*inputs["inputs"].overrides, fleet_deny), tag=(2, 1)
    )
    reads.summary(None, None)
    return counted.calls


def test_a_fleet_wide_change_costs_its_distinct_effects_not_its_clusters(
    reads_over: Any, counted: Counted
) -> None:
    small = fleet_change_cost(8, reads_over, counted)
    large = fleet_change_cost(80, reads_over, counted)
    assert small > 0
    assert large == small


def test_ten_times_the_overrides_cost_less_than_twice(reads_over: Any, counted: Counted) -> None:
    tenth = fleet_change_cost(80, reads_over, counted, every=10)
    everyone = fleet_change_cost(80, reads_over, counted)
    assert everyone < 2 * tenth


@pytest.mark.parametrize(
    "change",
    [
        {"device": {"name": "NVIDIA H100", "capability": [9, 0]}},
        {"num_heads": 128},
        {"model_name": "moonshotai/Kimi-K2"},
        {"cluster": "c001", "pod": "another-pod"},
    ],
)
def test_what_a_shared_decision_leaves_out_of_its_key_changes_no_decision(
    change: dict[str, Any],
) -> None:
    """``effects.description`` leaves out the GPU's and the model's names, the heads,
    the cluster and the pod: a decision that reads no evidence is the same without
    them (the shapes' situations, which name them, key the decisions that read it)."""
    base = SHAPES[0].model_copy(update={"cluster": "c000", "pod": "p"})
    body = base.model_dump()
    if "device" in change:
        body["device"] = change["device"]
    if "num_heads" in change:
        body["model"]["num_heads"] = change["num_heads"]
    if "model_name" in change:
        body["model"]["name"] = change["model_name"]
    body.update({k: v for k, v in change.items() if k in ("cluster", "pod")})
    other = type(base).model_validate(body)
    assert effects.description(other) == effects.description(base)
    overrides = (
        override("*", deny=["CUDNN"], note="fleet"),
        *(own(c, deny=["FLASHINFER"]) for c in ("c000", "c001")),
    )
    inputs = DecisionInputs(SEED_RULES, overrides)
    # the decision ``base`` shares, in the words of ``other``'s cluster, is ``other``'s own
    depends = effects.dependence(base, inputs, NOW)
    assert depends.own is not None and not depends.evidence
    shared = effects.decide_shared(base, inputs, NOW, None, depends)
    alone = decide(other, inputs, now=NOW)
    assert not isinstance(shared, Refusal) and not isinstance(alone, Refusal)
    mine = inputs.override_set.own(other.cluster)
    assert [effects.words(m, mine) for m in shared.messages] == list(alone.messages)
    assert [
        (c.backend, c.valid, [effects.words(r, mine) for r in c.reasons]) for c in shared.candidates
    ] == [(c.backend, c.valid, list(c.reasons)) for c in alone.candidates]
    assert (shared.backend, shared.source, shared.engine_args) == (
        alone.backend,
        alone.source,
        alone.engine_args,
    )
