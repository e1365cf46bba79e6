"""A fleet-wide change never seen before decides each distinct effect once.

Clusters whose own overrides act alike on a group (the same deny, the same staged
rollout percent; their notes and names differ) share one decision under the proposal
and one under the configuration in force, however many clusters there are; the
preview's "from" side of the groups that move is what the read decided for the
configuration in force, not decided again; and the evidence a cluster trusts is found
again only when what decides its trust scope changed. Every answer is still the full
replay's (``tests/core/test_fleet_replay.py`` checks that against every pod alone).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.evidence import EvidenceIndex, Observation, situation_of
from mla_switchboard.core.schemas import SEED_RULES, Override
from mla_switchboard.service.fleet.groups import FleetSnapshot
from mla_switchboard.service.fleet.parts import trust_content
from mla_switchboard.service.fleet.preview import replay
from mla_switchboard.service.fleet.reads import FleetReads, Proposal, ReadSettings
from mla_switchboard.service.state import PodState

from tests.core.conftest import NOW, override
from tests.core.test_fleet_parts import (
    OVERRIDES,
    Evidence,
    Made,
    Quiet,
    Snapshots,
    reads_of,
    shown,
    whole,
)
from tests.core.test_fleet_replay import SHAPES, fleet, staged


class OwnEvidence(Evidence):
    """Each cluster's own (empty) index, the default trust scope, for any cluster."""

    def __init__(self) -> None:
        self.indexes = defaultdict(lambda: EvidenceIndex(min_samples=1, min_pods=1))


def own_override(i: int, cluster: str) -> Override:
    """Cluster ``i``'s own override: a deny of CUDNN, staged (10 %) on every second
    cluster, each with a note of its own."""
    if i % 2:
        return staged(cluster, 10, deny=["CUDNN"]).model_copy(
            update={"note": f"{cluster}: staged deny"}
        )
    return override(cluster, deny=["CUDNN"], note=f"{cluster}: its own deny")


def pods_of(clusters: list[str], per_shape: int = 6) -> list[PodState]:
    """Every shape in every cluster, ``per_shape`` pods each, all on FLASH_ATTN (so any
    backend the configuration gives them counts as pending or moving)."""
    return [
        PodState(
            cluster,
            "n",
            f"{cluster}-{s}-{k}",
            f"d-{cluster}-{s}-{k}",
            "FLASH_ATTN",
            "priority",
            shape.model_copy(
                update={"cluster": cluster, "pod": f"{cluster}-{s}-{k}"}
            ).model_dump_json(),
        )
        for cluster in clusters
        for s, shape in enumerate(SHAPES)
        for k in range(per_shape)
    ]


def fleet_of(clusters: list[str], inputs: DecisionInputs) -> FleetSnapshot:
    """:func:`pods_of` as a snapshot."""
    return FleetSnapshot.of_pods(pods_of(clusters), version=1)


def decided_for(n: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The decisions a never-seen fleet-wide deny's preview makes per side, with ``n``
    clusters (after a summary, as a replica answers one), checked against the full
    replay."""
    clusters = [f"c{i}" for i in range(n)]
    inputs = DecisionInputs(
        SEED_RULES, tuple(own_override(i, c) for i, c in enumerate(clusters)), tag=(1, 1)
    )
    snapshots = Snapshots(fleet_of(clusters, inputs))
    evidence = OwnEvidence()
    reads = FleetReads(
        snapshots,  # type: ignore[arg-type]
        Quiet(),  # type: ignore[arg-type]
        evidence,  # type: ignore[arg-type]
        lambda: inputs,
        ReadSettings(600, 1, 1),
    )
    try:
        reads.summary(None, None)
        made = Made(monkeypatch)
        change = Proposal(
            override_scope="*", override=override("*", deny=["FLASH_ATTN"], note="never seen")
        )
        got = reads.preview(change, None, None)
        sides = dict(made.sides)
    finally:
        reads.close()
    full = replay(
        snapshots.snap,
        inputs,
        change.applied_to(inputs),
        now=datetime.now(UTC),
        inputs_for=evidence.inputs_for,
    )
    assert got == full
    assert got.pods_changed  # the deny moves pods: the "from" side was asked for
    return sides


def test_a_never_seen_fleet_change_decides_each_effect_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = {n: decided_for(n, monkeypatch) for n in (2, 6, 20)}
    # no decision of the "from" side of its own: the moving groups' are the read's
    assert all("from" not in sides for sides in counts.values()), counts
    # as many decisions for 20 clusters as for 2: one per (effect, shape, stage bits)
    assert counts[2] == counts[6] == counts[20], counts
    assert counts[2]["to"] <= 3 * len(SHAPES)  # own deny, staged in / out of its stage


def _trusting(cluster: str, **spec: Any) -> Override:
    return override(cluster, trust_clusters=["east-*"], **{"policy": "measured", **spec})


LATER = NOW.replace(year=NOW.year + 1)


@pytest.mark.parametrize(
    ("before", "after", "same"),
    [
        # what no trust scope reads
        ((override("east", deny=["CUDNN"]),), (override("*", deny=["FLASHINFER"]),), True),
        ((override("*", deny=["CUDNN"]),), (override("*", note="b", force="FLASH_ATTN"),), True),
        ((_trusting("east", note="a"),), (_trusting("east", note="b", deny=["CUDNN"]),), True),
        (
            (override("east", deny=["CUDNN"], model="x/*"),),
            (override("east", policy="measured"),),
            True,
        ),
        # what it reads: a scope named, by whom, for which models, in force or not
        ((override("east", policy="measured"),), (_trusting("east"),), False),
        ((_trusting("east"),), (_trusting("*"),), False),
        ((_trusting("east"),), (_trusting("east", model="deepseek-ai/*"),), False),
        (
            (_trusting("east"),),
            (override("east", trust_clusters=["west"], policy="measured"),),
            False,
        ),
        ((_trusting("*"), _trusting("east")), (_trusting("east"), _trusting("*")), False),
    ],
)
def test_what_a_trust_scope_is_found_again_for(
    before: tuple[Override, ...], after: tuple[Override, ...], same: bool
) -> None:
    def content(overrides: tuple[Override, ...]) -> object:
        return trust_content(overrides, [False] * len(overrides))

    assert (content(before) == content(after)) is same


def test_an_expired_trust_scope_is_another_content() -> None:
    trusting = (_trusting("east", expires_at=LATER),)
    assert trust_content(trusting, [False]) != trust_content(trusting, [True])
    denying = (override("east", deny=["CUDNN"], expires_at=LATER),)
    assert trust_content(denying, [False]) == trust_content(denying, [True]) == ()


@pytest.mark.parametrize(
    "change",
    [
        override("*", deny=["FLASH_ATTN"], note="never seen"),
        staged("*", 30, deny=["FLASH_ATTN"]),
        override("c1", force="CUDNN", note="one cluster"),
    ],
    ids=["fleet deny", "fleet staged", "one cluster"],
)
def test_what_a_preview_decides_of_the_config_in_force_is_what_a_read_works_out(
    change: Override,
) -> None:
    """A preview on a replica that has not worked out what the configuration in force
    gives a cluster decides it while it walks the cluster's groups; kept, it equals
    what a read of its own works out (pending pods, and the backend per shape and
    stage class)."""
    clusters = [f"c{i}" for i in range(4)]
    inputs = DecisionInputs(
        SEED_RULES, tuple(own_override(i, c) for i, c in enumerate(clusters)), tag=(1, 1)
    )
    snapshots = Snapshots(fleet_of(clusters, inputs))
    evidence = OwnEvidence()

    def reads() -> FleetReads:
        return FleetReads(
            snapshots,  # type: ignore[arg-type]
            Quiet(),  # type: ignore[arg-type]
            evidence,  # type: ignore[arg-type]
            lambda: inputs,
            ReadSettings(600, 1, 1),
        )

    previewed, alone = reads(), reads()
    try:
        previewed.preview(Proposal(override_scope=change.cluster, override=change), None, None)
        now = datetime.now(UTC)
        mine = previewed._parts_of(snapshots.snap, inputs, now)
        theirs = alone._parts_of(snapshots.snap, inputs, now)
        for cluster in clusters:
            assert mine.pending(cluster) == theirs.pending(cluster)
            assert mine.part(cluster).given == theirs.part(cluster).given
        # every cluster's worked out once, by the preview (none by the read after it)
        assert previewed._parts.computed == {"pending": len(clusters)}
    finally:
        previewed.close()
        alone.close()


def test_the_summary_after_a_never_seen_change_reads_the_groups_that_tell() -> None:
    """Which groups the regret and the exclusions read is found from the evidence once
    (``parts.Telling``); a fleet-wide deny never seen before works out every cluster's
    regret and exclusions again from those groups only, and the summary is what the
    whole fleet read again gives. A report moves the cluster's evidence: its groups
    are found again."""
    evidence = Evidence()
    for cluster in ("east", "west"):
        evidence.report(cluster, "FLASHINFER", 600)
        evidence.report(cluster, "FLASH_ATTN", 200)
    situation = situation_of(SHAPES[0])
    assert situation is not None
    evidence.indexes["canary"].add(
        [Observation(situation, "CUDNN", "canary-9", None, ok=False, cluster="canary", at=NOW)]
    )
    current = {"inputs": DecisionInputs(SEED_RULES, OVERRIDES, tag=(1, 1))}
    snapshots = Snapshots(FleetSnapshot.of_pods(fleet(3, current["inputs"]), version=1))
    reads = reads_of(snapshots, evidence, lambda: current["inputs"])
    try:
        reads.summary(None, None)
        parts = reads._parts
        found = dict(parts.telling)
        assert {c: len(t.rankable) > 0 for c, t in found.items()} == {
            "east": True,
            "west": True,
            "canary": False,
        }
        assert [c for c, t in found.items() if t.failing] == ["canary"]
        worked_out = dict(parts.computed)

        change = override("*", deny=["FLASHINFER"], note="never seen")
        current["inputs"] = replace(
            Proposal(override_scope="*", override=change).applied_to(current["inputs"]),
            tag=(2, 1),
        )
        body = reads.summary(None, None).body
        assert shown(body) == whole(snapshots.snap, current["inputs"], evidence)
        assert parts.computed["regret"] == worked_out["regret"] + 3
        assert all(parts.telling[c] is t for c, t in found.items())  # not found again

        evidence.report("west", "CUDNN", 900)
        current["inputs"] = replace(current["inputs"], tag=(2, 2))
        body = reads.summary(None, None).body
        assert shown(body) == whole(snapshots.snap, current["inputs"], evidence)
        assert parts.telling["west"] is not found["west"]
        assert parts.telling["east"] is found["east"]
    finally:
        reads.close()


def test_the_summary_after_a_previewed_change_assesses_no_group_its_preview_decided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The regret of a change never seen before reads, per group and stage class, the
    backends valid under it: its preview decided every group under it, and the
    candidates of those decisions say which are valid. Carried with the backends it
    gives (``ClusterPart.valid``), the summary after the change is written assesses
    none of those groups again, and is what the whole fleet read again gives; without
    the preview, it assesses them."""
    from mla_switchboard.service.fleet import groups

    evidence = Evidence()
    for cluster in ("east", "west"):
        evidence.report(cluster, "FLASHINFER", 600)
        evidence.report(cluster, "FLASH_ATTN", 200)
    first = DecisionInputs(SEED_RULES, OVERRIDES, tag=(1, 1))
    snapshots = Snapshots(FleetSnapshot.of_pods(fleet(3, first), version=1))
    change = override("*", deny=["FLASHINFER"], note="never seen")
    # as the store writes it: another revision, the same content
    written = change.model_copy(update={"revision": change.revision + 7})
    assessed: list[int] = []
    real = groups.DecisionMemo.assessment

    def counted(memo: Any, *args: Any) -> Any:
        assessed.append(1)
        return real(memo, *args)

    monkeypatch.setattr(groups.DecisionMemo, "assessment", counted)

    def assessments_after(previewed: bool) -> int:
        current = {"inputs": first}
        reads = reads_of(snapshots, evidence, lambda: current["inputs"])
        try:
            reads.summary(None, None)
            if previewed:
                reads.preview(Proposal(override_scope="*", override=change), None, None)
            current["inputs"] = replace(
                Proposal(override_scope="*", override=written).applied_to(first), tag=(2, 1)
            )
            assessed.clear()
            body = reads.summary(None, None).body
            made = len(assessed)
            assert shown(body) == whole(snapshots.snap, current["inputs"], evidence)
            assert any(r["pods_measured"] for r in body["regret"].values())
            return made
        finally:
            reads.close()

    assert assessments_after(previewed=False) > 0
    assert assessments_after(previewed=True) == 0


@pytest.mark.parametrize(
    ("change", "walked_again"),
    [
        (override("*", deny=["FLASH_ATTN"], note="never seen"), False),
        (staged("*", 40, deny=["TRTLLM_RAGGED"]), True),
    ],
    ids=["fleet deny", "fleet staged"],
)
def test_a_rollouts_progress_after_a_change_recounts_only_the_pods_booted_with_it(
    change: Override, walked_again: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of a rollout's progress in a cluster, only the pods booted with it depend on the
    configuration (whether it applies, the stage classes, the pods in its stage and
    its stage samples do not, while the cluster's partial rollouts are the same): the
    summary after a fleet-wide deny recounts those from the backends its preview
    carried and walks no cluster's groups for it; a staged change of the fleet's
    splits the stage classes again, and they are walked. Either way the summary is
    the whole fleet read again."""
    from mla_switchboard.service.fleet import progress

    clusters = [f"c{i}" for i in range(6)]
    first = DecisionInputs(
        SEED_RULES, tuple(own_override(i, c) for i, c in enumerate(clusters)), tag=(1, 1)
    )
    snapshots = Snapshots(fleet_of(clusters, first))
    evidence = OwnEvidence()
    walked: list[str] = []
    real = progress.ProgressWalk.cluster

    def counted(walk: Any, o: Override, groups: Any, *args: Any) -> Any:
        walked.append(groups[0].cluster)
        return real(walk, o, groups, *args)

    monkeypatch.setattr(progress.ProgressWalk, "cluster", counted)
    current = {"inputs": first}
    reads = FleetReads(
        snapshots,  # type: ignore[arg-type]
        Quiet(),  # type: ignore[arg-type]
        evidence,  # type: ignore[arg-type]
        lambda: current["inputs"],
        ReadSettings(600, 1, 1),
    )
    try:
        before = reads.summary(None, None).body["rollouts"]
        assert sorted(walked) == clusters[1::2]  # the staged ones
        assert any(r["pods_booted_with_it"] for r in before)
        reads.preview(Proposal(override_scope="*", override=change), None, None)
        walked.clear()
        current["inputs"] = replace(
            Proposal(override_scope="*", override=change).applied_to(first), tag=(2, 1)
        )
        body = reads.summary(None, None).body
        assert bool(walked) == walked_again, walked
        assert body["rollouts"] == progress.progress(
            snapshots.snap,
            current["inputs"],
            now=datetime.now(UTC),
            inputs_for=evidence.inputs_for,
            evidence_of=evidence.of_cluster,
        )
        assert any(r["pods_in_stage"] for r in body["rollouts"])
        assert body["rollouts"] != before  # the change moved what they count
    finally:
        reads.close()


@pytest.mark.parametrize(
    ("own", "per_model"),
    [
        (override("east", deny=["CUDNN"], note="every model"), False),
        (override("east", deny=["CUDNN"], model="moonshotai/*", note="one family"), True),
    ],
    ids=["no model named", "a model named"],
)
def test_a_clusters_models_share_what_applies_and_how_it_is_decided(
    own: Override, per_model: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which overrides apply to a pod, and so how its decisions are shared
    (``effects.dependence``), are functions of its cluster and model only through the
    overrides' model globs: where no override that may apply to a cluster names a
    model, the cluster's models are worked out once; where one does, per model."""
    from mla_switchboard.service.fleet import groups

    calls = {"applicable": 0, "dependence": 0}
    real_applicable, real_dependence = groups.applicable_overrides, groups.dependence

    def applicable(*args: Any) -> Any:
        calls["applicable"] += 1
        return real_applicable(*args)

    def dependence(*args: Any, **kw: Any) -> Any:
        calls["dependence"] += 1
        return real_dependence(*args, **kw)

    monkeypatch.setattr(groups, "applicable_overrides", applicable)
    monkeypatch.setattr(groups, "dependence", dependence)
    inputs = DecisionInputs(
        SEED_RULES, (override("*", deny=["FLASHINFER"], note="fleet"), own), tag=(1, 1)
    )
    memo = groups.DecisionMemo(NOW, groups.ClassCache())
    first, other = (s.model_copy(update={"cluster": "east"}) for s in (SHAPES[0], SHAPES[4]))
    assert first.model.name != other.model.name
    a, b = (memo.depends_of(r, inputs, False) for r in (first, other))
    assert (a is b) != per_model
    assert calls == (
        {"applicable": 2, "dependence": 2} if per_model else {"applicable": 1, "dependence": 1}
    )
    assert a == real_dependence(first, inputs, NOW)
    assert b == real_dependence(other, inputs, NOW)
