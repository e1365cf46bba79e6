"""Fleet reads kept per cluster (``service/fleet/parts.py``) answer exactly what reading
the whole fleet again answers, and a change to one cluster works out that cluster only.

The reference is the whole-fleet functions (``regret_by_cluster``,
``exclusions_by_cluster``, ``progress``, ``replay`` without kept figures), themselves
checked against deciding every pod one by one in ``test_fleet_replay.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.evidence import EvidenceIndex, Observation, situation_of
from mla_switchboard.core.schemas import SEED_RULES, Override, SelectRequest
from mla_switchboard.service.fleet.groups import FleetSnapshot, PodGroup
from mla_switchboard.service.fleet.preview import replay, with_override
from mla_switchboard.service.fleet.progress import progress
from mla_switchboard.service.fleet.reads import FleetReads, Proposal, ReadSettings
from mla_switchboard.service.fleet.regret import exclusions_by_cluster, regret_by_cluster

from tests.core.conftest import override
from tests.core.test_fleet_replay import SHAPES, fleet, staged

NOW = datetime.now(UTC)
CLUSTERS = ("east", "west", "canary")


class Evidence:
    """Each cluster's own index (the default trust scope), as the runtime keeps them."""

    def __init__(self) -> None:
        self.indexes = {c: EvidenceIndex(min_samples=1, min_pods=1) for c in CLUSTERS}

    def report(self, cluster: str, backend: str, tflops: float, pods: int = 3) -> None:
        situation = situation_of(SHAPES[0])
        assert situation is not None
        self.indexes[cluster].add(
            Observation(situation, backend, f"{cluster}-{i}", tflops, ok=True, cluster=cluster)
            for i in range(pods)
        )

    def inputs_for(
        self, request: SelectRequest, inputs: DecisionInputs, now: datetime
    ) -> DecisionInputs:
        return replace(inputs, evidence=self.indexes[request.cluster])

    def of_cluster(self, cluster: str) -> EvidenceIndex:
        return self.indexes[cluster]


@dataclass
class Snapshots:
    snap: FleetSnapshot

    def current(self) -> FleetSnapshot:
        return self.snap

    def kept(self) -> FleetSnapshot:
        return self.snap


class Quiet:
    pending = 0


def reads_of(snapshots: Snapshots, evidence: Evidence, inputs: Callable[[], Any]) -> FleetReads:
    return FleetReads(snapshots, Quiet(), evidence, inputs, ReadSettings(600, 1, 1))  # type: ignore[arg-type]


def replayed(snapshots: Snapshots, evidence: Evidence, inputs: Any, proposal: Proposal) -> Any:
    """``proposal``'s preview as the full replay counts it (every group decided)."""
    return replay(
        snapshots.snap, inputs, proposal.applied_to(inputs), now=NOW, inputs_for=evidence.inputs_for
    )


def preview_anew(snapshots: Snapshots, evidence: Evidence, inputs: Any, proposal: Proposal) -> Any:
    """``proposal``'s preview from a new read of the fleet (nothing kept)."""
    fresh = reads_of(snapshots, evidence, lambda: inputs)
    try:
        return fresh.preview(proposal, None, None)
    finally:
        fresh.close()


def whole(snap: FleetSnapshot, inputs: DecisionInputs, evidence: Evidence) -> dict[str, Any]:
    """The summary's figures read from the whole fleet again."""
    kw: dict[str, Any] = {"now": NOW, "inputs_for": evidence.inputs_for}
    return {
        "regret": regret_by_cluster(snap, inputs, **kw),
        "excluded": exclusions_by_cluster(snap, inputs, **kw),
        "rollouts": progress(snap, inputs, evidence_of=evidence.of_cluster, **kw),
    }


def shown(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in ("regret", "excluded", "rollouts")}


def with_one_more_pod(snap: FleetSnapshot, cluster: str) -> FleetSnapshot:
    """A pod of ``cluster`` booted (in bucket 0, on what its group's first row runs)."""
    groups: list[PodGroup] = list(snap.groups)
    i = next(k for k, g in enumerate(groups) if g.cluster == cluster)
    g = groups[i]
    first = g.rows[0]
    moved = replace(first, pods=first.pods + 1, buckets=(first.buckets[0] + 1, *first.buckets[1:]))
    groups[i] = replace(g, rows=(moved, *g.rows[1:]))
    return FleetSnapshot(snap.version + 1, tuple(groups))


OVERRIDES = (
    staged("east", 30, force="FLASHINFER"),
    override("west", policy="measured", note="west measured"),
    staged("*", 20, deny=["TRTLLM_RAGGED"]),
    staged("canary", 50, force="CUDNN"),
)


@pytest.fixture
def world() -> tuple[Snapshots, Evidence, dict[str, DecisionInputs], FleetReads]:
    evidence = Evidence()
    for cluster in CLUSTERS:
        evidence.report(cluster, "FLASHINFER", 600)
        evidence.report(cluster, "FLASH_ATTN", 200)
    current = {"inputs": DecisionInputs(SEED_RULES, OVERRIDES, tag=(1, 1))}
    snapshots = Snapshots(FleetSnapshot.of_pods(fleet(3, current["inputs"]), version=1))
    reads = reads_of(snapshots, evidence, lambda: current["inputs"])
    yield snapshots, evidence, current, reads
    reads.close()


def test_a_summary_from_kept_parts_is_the_whole_fleets(world: Any) -> None:
    snapshots, evidence, current, reads = world
    parts = reads._parts

    def check() -> None:
        body = reads.summary(None, None).body
        assert shown(body) == whole(snapshots.snap, current["inputs"], evidence)

    check()
    first = dict(parts.computed)
    # progress: the fleet's rollout in each of the three clusters, east's and canary's own
    assert first == {"regret": 3, "excluded": 3, "progress": 5}

    snapshots.snap = with_one_more_pod(snapshots.snap, "west")
    check()
    assert parts.computed == {"regret": 4, "excluded": 4, "progress": 6}  # west's only

    # an override written on east: every override is another object after a reload
    again = tuple(Override.model_validate(o.model_dump()) for o in OVERRIDES)
    again = (staged("east", 60, force="FLASHINFER"), *again[1:])
    current["inputs"] = DecisionInputs(SEED_RULES, again, tag=(2, 1))
    check()
    assert parts.computed == {"regret": 5, "excluded": 5, "progress": 8}  # east: * and its own

    evidence.report("canary", "CUDNN", 900)  # canary's evidence moved
    current["inputs"] = replace(current["inputs"], tag=(2, 2))
    check()
    assert parts.computed == {"regret": 6, "excluded": 6, "progress": 10}

    # the fleet's override changed: every cluster again
    current["inputs"] = replace(
        current["inputs"],
        overrides=with_override(again, "*", staged("*", 40, deny=["TRTLLM_RAGGED"])),
        tag=(3, 2),
    )
    check()
    assert parts.computed == {"regret": 9, "excluded": 9, "progress": 15}


def test_a_scoped_summary_reads_the_clusters_it_may_see(world: Any) -> None:
    snapshots, evidence, current, reads = world
    visible = {"east", "canary"}.__contains__
    body = reads.summary(("east", "canary"), visible).body
    expected = whole(snapshots.snap.visible(visible), current["inputs"], evidence)
    expected["rollouts"] = [r for r in expected["rollouts"] if visible(r["cluster"])]
    assert shown(body) == expected
    assert sorted(body["clusters"]) == ["canary", "east"]


@pytest.mark.parametrize(
    ("scope", "proposal"),
    [
        ("east", staged("east", 60, force="FLASHINFER")),
        ("west", None),
        ("canary", override("canary", deny=["FLASH_ATTN"])),
        ("north", override("north", deny=["FLASH_ATTN"])),  # no pods there yet
        ("*", staged("*", 10, force="FLASHINFER")),
    ],
)
def test_a_preview_with_kept_pending_counts_is_the_full_replay(
    world: Any, scope: str, proposal: Override | None
) -> None:
    snapshots, evidence, current, reads = world
    inputs = current["inputs"]
    proposed = Proposal(override_scope=scope, override=proposal)
    got = reads.preview(proposed, None, None)
    full = replayed(snapshots, evidence, inputs, proposed)
    assert got == full
    # each cluster's figures under the configuration in force: the pods pending of
    # those the proposal leaves alike, what it gives each group of those it touches
    assert reads._parts.computed == {"pending": len(CLUSTERS)}

    # the next preview of another change reads them as kept
    other = Proposal(override_scope=scope, override=override(scope, deny=["CUDNN"], note="2"))
    assert reads.preview(other, None, None) == replayed(snapshots, evidence, inputs, other)
    assert reads._parts.computed == {"pending": len(CLUSTERS)}


@pytest.mark.parametrize(
    ("scope", "proposal"),
    [
        ("*", override("*", deny=["FLASHINFER"], note="fleet-wide")),
        ("*", staged("*", 10, force="FLASHINFER")),
        ("east", override("east", deny=["FLASH_ATTN"])),
    ],
)
def test_what_a_preview_decided_is_the_next_configurations_kept_figures(
    world: Any, scope: str, proposal: Override
) -> None:
    """A change's preview decides every group it touches under the proposal; once the
    proposal is written (the override as the store holds it: a revision of its own),
    the change back reads those as the figures in force instead of deciding again,
    and still answers what a full replay does."""
    snapshots, evidence, current, reads = world
    put = Proposal(override_scope=scope, override=proposal)
    reads.preview(put, None, None)
    assert reads._parts.computed == {"pending": len(CLUSTERS)}

    written = proposal.model_copy(update={"revision": 7})
    applied = Proposal(override_scope=scope, override=written).applied_to(current["inputs"])
    current["inputs"] = replace(applied, tag=(2, 2))
    back = Proposal(override_scope=scope, override=None)
    got = reads.preview(back, None, None)
    assert got == replayed(snapshots, evidence, current["inputs"], back)
    assert reads._parts.computed == {"pending": len(CLUSTERS)}  # none decided again


class Made:
    """How many decisions the fleet reads made under each side (``DecisionMemo``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from mla_switchboard.service.fleet import groups

        self.sides: dict[str, int] = {}
        real = groups.DecisionMemo.made_for

        def counted(memo: Any, key: tuple[Any, ...], *args: Any) -> Any:
            if key not in memo._found:
                self.sides[key[0]] = self.sides.get(key[0], 0) + 1
            return real(memo, key, *args)

        monkeypatch.setattr(groups.DecisionMemo, "made_for", counted)


@pytest.mark.parametrize(
    "proposal",
    [
        override("*", deny=["FLASHINFER"], note="fleet-wide"),
        staged("*", 10, force="FLASHINFER"),
        override("east", deny=["FLASH_ATTN"]),
    ],
    ids=["deny", "staged force", "one cluster"],
)
def test_a_change_taken_back_reads_what_the_kept_parts_give(
    world: Any, proposal: Override, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Put, then delete: what the deletion proposes is the configuration the parts
    were worked out for, so the groups that stay are not decided under it, and the
    answer is still the full replay's."""
    snapshots, evidence, current, reads = world
    scope = proposal.cluster
    without = [o for o in current["inputs"].overrides if o.cluster != scope]
    before = current["inputs"] = DecisionInputs(SEED_RULES, tuple(without), tag=(1, 2))
    reads.summary(None, None)
    reads.preview(Proposal(override_scope=scope, override=proposal), None, None)
    written = proposal.model_copy(update={"revision": 7})
    applied = Proposal(override_scope=scope, override=written).applied_to(before)
    current["inputs"] = replace(applied, tag=(2, 2))
    reads.summary(None, None)  # the parts of the new configuration; the old ones kept
    made = Made(monkeypatch)
    back = Proposal(override_scope=scope, override=None)
    got = reads.preview(back, None, None)
    kept_to = made.sides.get("to", 0)
    assert got == replayed(snapshots, evidence, current["inputs"], back)
    # the same preview without the kept parts decides every group under the proposal
    made.sides.clear()
    assert preview_anew(snapshots, evidence, current["inputs"], back) == got
    assert kept_to < made.sides["to"]


def test_a_change_previewed_with_another_note_carries_what_it_gives(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dry run, then the write with another note: what the first found each group
    given carries to the second (a note is words only), which decides only the groups
    that move, and answers what the full replay answers, in its own note's words."""
    snapshots, evidence, current, reads = world
    inputs = current["inputs"]
    dry = Proposal(override_scope="*", override=override("*", deny=["FLASHINFER"], note="dry"))
    reads.preview(dry, None, None)
    made = Made(monkeypatch)
    put = Proposal(override_scope="*", override=override("*", deny=["FLASHINFER"], note="put"))
    got = reads.preview(put, None, None)
    carried_to = made.sides.get("to", 0)
    full = replayed(snapshots, evidence, inputs, put)
    assert got == full
    assert any("put" in w for c in got.changes for r in c.reasons for w in r.why) or not got.changes
    made.sides.clear()
    assert preview_anew(snapshots, evidence, inputs, put) == got
    assert carried_to < made.sides["to"]


def test_a_written_change_counts_its_rollouts_from_what_its_preview_gave(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary after a change is written counts each rollout's pods booted with it
    from the backends the change's preview found (carried), deciding nothing again,
    and reads what the whole fleet read again gives."""
    snapshots, evidence, current, reads = world
    proposal = override("*", deny=["FLASHINFER"], note="fleet-wide")
    reads.preview(Proposal(override_scope="*", override=proposal), None, None)
    written = proposal.model_copy(update={"revision": 3})
    applied = Proposal(override_scope="*", override=written).applied_to(current["inputs"])
    current["inputs"] = replace(applied, tag=(2, 2))
    made = Made(monkeypatch)
    body = reads.summary(None, None).body
    assert made.sides.get("", 0) == 0
    assert body["rollouts"]
    assert shown(body) == whole(snapshots.snap, current["inputs"], evidence)


def test_a_change_previewed_again_after_it_was_taken_back_finds_its_backends(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Put a fleet-wide change, delete it, then preview it again with another note and
    expiry: the backends its first preview found are kept among the cluster's last
    few, so only the groups that move are decided, and the answer is the full
    replay's (in the new note's words)."""
    snapshots, evidence, current, reads = world
    without = [o for o in current["inputs"].overrides if o.cluster != "*"]
    before = current["inputs"] = DecisionInputs(SEED_RULES, tuple(without), tag=(1, 2))

    def change(note: str, hours: int) -> Override:
        expires = NOW + timedelta(hours=hours)
        return override("*", deny=["FLASHINFER"], note=note, expires_at=expires)

    first = Proposal(override_scope="*", override=change("first", 2))
    reads.preview(first, None, None)
    written = first.override.model_copy(update={"revision": 4})  # type: ignore[union-attr]
    applied = Proposal(override_scope="*", override=written).applied_to(before)
    current["inputs"] = replace(applied, tag=(2, 2))
    reads.summary(None, None)
    reads.preview(Proposal(override_scope="*", override=None), None, None)
    current["inputs"] = before
    reads.summary(None, None)

    made = Made(monkeypatch)
    again = Proposal(override_scope="*", override=change("again", 3))
    got = reads.preview(again, None, None)
    again_to = made.sides.get("to", 0)
    assert got == replayed(snapshots, evidence, before, again)
    made.sides.clear()
    assert preview_anew(snapshots, evidence, before, again) == got
    assert again_to < made.sides["to"]


def test_a_change_written_again_reads_the_summary_figures_it_carried(world: Any) -> None:
    """Put a fleet-wide change, take it back, then write it again with another note,
    expiry and revision: the summary after it takes every cluster's regret,
    exclusions and rollout progress from what the first one carried under the same
    content (no figure reads a note or what the store writes), works none out again,
    and reads what the whole fleet read again gives."""
    snapshots, evidence, current, reads = world
    parts = reads._parts
    without = [o for o in current["inputs"].overrides if o.cluster != "*"]
    before = current["inputs"] = DecisionInputs(SEED_RULES, tuple(without), tag=(1, 2))
    reads.summary(None, None)

    def written(note: str, hours: int, revision: int) -> DecisionInputs:
        change = override(
            "*", deny=["FLASHINFER"], note=note, expires_at=NOW + timedelta(hours=hours)
        )
        change = change.model_copy(update={"revision": revision})
        return Proposal(override_scope="*", override=change).applied_to(before)

    current["inputs"] = replace(written("first", 2, 4), tag=(2, 2))
    reads.summary(None, None)
    current["inputs"] = replace(before, tag=(3, 2))
    reads.summary(None, None)
    worked_out = dict(parts.computed)

    current["inputs"] = replace(written("second", 5, 6), tag=(4, 2))
    body = reads.summary(None, None).body
    assert parts.computed == worked_out
    assert shown(body) == whole(snapshots.snap, current["inputs"], evidence)


def test_a_summary_after_a_change_takes_what_its_preview_carried(world: Any) -> None:
    """The summary after a change whose preview ran works out each cluster's regret,
    exclusions and progress under it once; a second configuration of that content
    (the note edited) reads them all from what the first carried, pending pods and
    backends included, and both read what the whole fleet read again gives."""
    snapshots, evidence, current, reads = world
    parts = reads._parts
    inputs = current["inputs"]
    change = override("*", deny=["FLASHINFER"], note="dry run")
    reads.preview(Proposal(override_scope="*", override=change), None, None)
    assert parts.computed == {"pending": len(CLUSTERS)}

    def put(note: str, revision: int, tag: int) -> dict[str, Any]:
        written = change.model_copy(update={"note": note, "revision": revision})
        applied = Proposal(override_scope="*", override=written).applied_to(inputs)
        current["inputs"] = replace(applied, tag=(tag, 2))
        body = reads.summary(None, None).body
        assert shown(body) == whole(snapshots.snap, current["inputs"], evidence)
        return dict(parts.computed)

    first = put("written", 3, 2)
    assert first["pending"] == len(CLUSTERS)  # the preview's backends, not decided again
    assert put("note edited", 4, 3) == first
    reads.preview(Proposal(override_scope="*", override=None), None, None)
    assert parts.computed["pending"] == len(CLUSTERS)  # the change back: kept parts


def test_a_change_taken_back_finds_each_clusters_evidence_without_asking_again(
    world: Any,
) -> None:
    """The evidence a cluster's pods trust is a function of the content of the
    overrides that apply to it: once a fleet-wide change was read, taking it back and
    writing it again (another note and revision) asks the evidence for no cluster's
    model again, and the summaries still read what the whole fleet gives."""
    snapshots, evidence, current, reads = world
    asked: list[str] = []
    real = evidence.inputs_for

    def counted(request: SelectRequest, inputs: DecisionInputs, now: datetime) -> Any:
        asked.append(request.cluster)
        return real(request, inputs, now)

    evidence.inputs_for = counted  # type: ignore[method-assign]
    without = [o for o in current["inputs"].overrides if o.cluster != "*"]
    before = DecisionInputs(SEED_RULES, tuple(without), tag=(1, 2))

    def put(note: str, revision: int) -> DecisionInputs:
        change = override("*", deny=["FLASHINFER"], note=note)
        change = change.model_copy(update={"revision": revision})
        return Proposal(override_scope="*", override=change).applied_to(before)

    for inputs in (before, put("first", 3), replace(before, tag=(3, 2))):
        current["inputs"] = inputs
        reads.summary(None, None)
    assert asked  # each configuration's first read found them
    asked.clear()
    for inputs in (put("again", 5), replace(before, tag=(5, 2))):
        current["inputs"] = replace(inputs, tag=(inputs.tag[0] + 10, 2))
        body = reads.summary(None, None).body
        assert asked == []
        evidence.inputs_for = real  # type: ignore[method-assign]
        assert shown(body) == whole(snapshots.snap, current["inputs"], evidence)
        evidence.inputs_for = counted  # type: ignore[method-assign]
