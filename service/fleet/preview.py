"""Impact preview: replay a proposed rules or override change against what every pod
runs now, without changing anything.

Each group of pods (cluster, request shape, stage class: see ``service/fleet/groups.py``) is
decided twice, exactly as its pods asked: under the config in force ("from") and under
the proposal ("to"), so the counts say what *this* change does, not what earlier
changes already did to pods that have not rebooted since (those are counted apart as
``pods_pending``: their recorded backend differs from what the config in force gives
them). Pods the proposal would refuse outright (a strict request that is no longer
valid, or nothing valid at all) are reported as invalid with the reason. One group is
decided once per stage class whatever its number of pods, so a preview of the whole
fleet costs O(clusters x situations), and a preview of one cluster's override, which
changes nothing elsewhere, replays that cluster's groups only (``replay``'s ``settled``).

Each change says why its pods move, read off the same two decisions (``why_moved``):
what the proposal says against the backend they leave, the stage they enter or leave,
an override that no longer applies, and the evaluator's own reason for the new choice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Protocol

from mla_switchboard.core import cause_words
from mla_switchboard.core.causes import MeasuredExclusion
from mla_switchboard.core.evaluator import Decision, DecisionInputs, Refusal
from mla_switchboard.core.schemas import Override, OverrideRef, SelectRequest
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.fleet.effects import words
from mla_switchboard.service.fleet.groups import (
    ClassCache,
    Deadline,
    Decider,
    DecisionMemo,
    FleetSnapshot,
    PodGroup,
    StageClass,
    each_group,
)
from mla_switchboard.service.fleet.narrowing import per_model
from mla_switchboard.service.priority import let_go_later
from mla_switchboard.service.selector import InputsFor
from pydantic import BaseModel, ConfigDict, Field


class ChangeReason(BaseModel):
    """Why ``pods`` of a change move: the evaluator's own words, most telling first."""

    pods: int
    why: list[str] = Field(
        description="what the change does against the backend they leave, the stage they "
        "enter or leave, an override that no longer applies, then the evaluator's reason "
        "for the backend they get"
    )
    exclusions: dict[str, MeasuredExclusion] = Field(
        default_factory=dict,
        description="per backend whose reason in ``why`` is an exclusion by failures: "
        "the same as data (a caller limited to some clusters reads its own pods only)",
    )


class _FromBackend(BaseModel):
    """Pods of one cluster that run a backend now (``from`` in JSON: a Python keyword)."""

    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)

    cluster: str
    from_: str = Field(alias="from")


class Change(_FromBackend):
    """Pods of one cluster that would go from one backend to another."""

    to: str
    pods: int
    reasons: list[ChangeReason] = Field(
        default_factory=list, description="why they move, per group of alike decisions"
    )


class InvalidChange(_FromBackend):
    """Pods the change would refuse a backend (a strict request, or nothing valid)."""

    reason: str
    pods: int


class Preview(BaseModel):
    pods_total: int
    pods_changed: int
    pods_invalid: int
    changes: list[Change]
    invalid: list[InvalidChange]
    clusters_affected: list[str]
    pods_pending: int = 0
    pods_unreadable: int = 0


class Settled(Protocol):
    """What a fleet read keeps of each cluster under the configuration in force
    (``service/fleet/parts.py``)."""

    def pending(self, cluster: str) -> int:
        """Pods of ``cluster`` whose recorded backend is not what the config gives."""
        ...

    def given(self, group: PodGroup, bucket: int | None) -> str | None:
        """The backend the config in force gives the pods of ``group`` in the stage
        bucket ``bucket`` (None: they are refused)."""
        ...

    def given_in(
        self, request: SelectRequest
    ) -> tuple[Mapping[tuple[str, frozenset[int] | None], str | None], tuple[StageClass, ...]]:
        """What the config in force gives the pods of ``request``'s cluster and model:
        the backend per (shape, stage class), and those stage classes."""
        ...

    def given_kept_in(
        self, request: SelectRequest
    ) -> (
        tuple[Mapping[tuple[str, frozenset[int] | None], str | None], tuple[StageClass, ...]] | None
    ):
        """``given_in`` when what the config in force gives ``request``'s cluster is
        worked out or carried already; None when it would have to be decided (the
        replay then decides it as it walks the groups, and hands it to
        ``worked_out``)."""
        ...

    def worked_out(
        self,
        cluster: str,
        pending: int,
        given: dict[tuple[str, frozenset[int] | None], str | None],
    ) -> None:
        """What the config in force gives the pods of ``cluster`` (``pending``,
        ``given`` as ``given_in`` would hold them), decided by a replay: kept as if
        ``pending`` had worked it out."""
        ...

    def kept_given(
        self, cluster: str, proposed: DecisionInputs
    ) -> Mapping[tuple[str, frozenset[int] | None], str | None] | None:
        """What ``proposed`` gives the pods of ``cluster`` per (shape, stage class of
        its own), when that is kept (a change taken back); else None."""
        ...

    def proposed(
        self,
        cluster: str,
        proposed: DecisionInputs,
        pending: int,
        given: dict[tuple[str, frozenset[int] | None], str | None],
        valid: dict[tuple[str, frozenset[int] | None], tuple[Backend, ...] | None] | None = None,
    ) -> None:
        """What ``proposed`` gives the pods of ``cluster``, as ``pending`` and
        ``given`` would say once it is in force, and ``valid``: the backends valid for
        them per (shape, stage class), read off the decisions (None where refused, or
        when not every group was decided): kept for the read after it is."""
        ...


def replay(
    fleet: FleetSnapshot,
    current: DecisionInputs,
    proposed: DecisionInputs,
    *,
    now: datetime,
    inputs_for: InputsFor | None = None,
    deadline: Deadline | None = None,
    settled: Settled | None = None,
    classes: ClassCache | None = None,
    memo: DecisionMemo | None = None,
) -> Preview:
    """Count what changes from ``current`` to ``proposed`` for every pod of ``fleet``.

    Both sides are full ``DecisionInputs``, evidence included, and go through the same
    evaluator as ``/v1/select``: a preview of a ``measured`` policy sees the evidence
    the live path will use.

    With ``settled`` (a fleet read's kept per-cluster figures), a cluster the proposal
    leaves alike (:func:`untouched`: the same rules and the same overrides for it) has
    no pod that changes or becomes invalid, only pods pending under the configuration
    in force: ``settled.pending`` gives that count and the cluster is not replayed. So a
    preview of one cluster's override decides that cluster's groups, whatever the
    number of clusters. In a cluster it replays, the backend the configuration in force
    gives a group is ``settled.given``, and the decision itself is made only for groups
    that move (its reasons say why). Without ``settled`` every group of every cluster
    is decided under both. ``classes``: the stage classes and overrides that apply per
    cluster and model, shared with the read ``settled`` is of (its "from" side finds
    those of the configuration in force too). ``memo``: that read's decisions, whose
    side "" is ``current`` (``PartsRead.memo``): the "from" side of the groups that
    move is then taken from what the read decided for ``settled.given`` instead of
    being decided again, and the proposal's decisions join them."""
    # what the replay builds is let go of a piece at a time once the read ends
    tally = let_go_later(_Tally())
    unreadable = total = 0
    inputs_for = per_model(inputs_for)
    classes = let_go_later(ClassCache()) if classes is None else classes
    # the "from" side: the read's own decisions when they are under ``current``
    from_side = "from" if memo is None else ""
    memo = let_go_later(DecisionMemo(now, classes)) if memo is None else memo
    layouts: _Layouts = {}  # the stage layouts of the models' plans (``_Layout``)

    for cluster, groups in fleet.by_cluster.items():
        own = current.override_set.own(cluster)
        # the cluster's own override changes: its words are not rendered from a stand-in
        exact = not _same(own, proposed.override_set.own(cluster))
        if settled is not None and untouched(current, proposed, cluster):
            for group in groups:
                total += group.pods
                if group.request is None:
                    unreadable += group.pods
            tally.pending += settled.pending(cluster)
            continue
        # what the proposal gives the cluster's pods, per its own stage classes
        # (``Settled.proposed``)
        given_after: dict[tuple[str, frozenset[int] | None], str | None] = {}
        # and the backends valid for them, where the proposal's decision was made
        # (the regret of the read after it is written reads those, not assessments)
        valid_after: dict[tuple[str, frozenset[int] | None], tuple[Backend, ...] | None] = {}
        pending_after = 0
        # per model: what its groups share (the staged overrides that apply, and so
        # the stage classes and how decisions are shared, are a function of the
        # cluster and the model; of the cluster alone where no override names a
        # model: ``ClassCache.model_key``)
        plans: dict[str, _ModelPlan] = {}
        # what the proposal gives, when a kept part holds it: only the groups that
        # move are then decided under it (their reasons need the decision)
        kept = None if settled is None else settled.kept_given(cluster, proposed)
        # what the configuration in force gives the cluster's pods, when no kept
        # figure holds it: decided here as the groups are walked ("from"), not in a
        # walk of its own first (``Settled.worked_out``)
        given_now: dict[tuple[str, frozenset[int] | None], str | None] | None = None
        pending_now = 0
        for group in each_group(groups, deadline):
            total += group.pods
            request = group.request
            if request is None:
                unreadable += group.pods  # recorded under an older schema; cannot be replayed
                continue
            model = classes.model_key(request, current.overrides, proposed.overrides)
            plan = plans.get(model)
            if plan is None:
                plan = plans[model] = _ModelPlan.of(
                    request,
                    current,
                    proposed,
                    now,
                    inputs_for,
                    classes,
                    memo,
                    exact,
                    settled,
                    from_side,
                    layouts,
                )
                if deadline is not None:  # a model's setup, like a group, lets the loop in
                    deadline.check()
                if settled is not None and plan.given is None and given_now is None:
                    given_now = {}
            shape_id = group.shape_id
            to_of, before_of = plan.to, plan.before
            given_to: list[str | None] = []
            valid_to: list[tuple[Backend, ...] | None] = []
            for i, stage in enumerate(plan.stages):
                after: Decision | Refusal | None = None
                at = (shape_id, plan.proposal_buckets[i])
                if kept is not None and at in kept:
                    to = kept[at]
                else:
                    after = to_of(request, shape_id, stage)
                    to = None if isinstance(after, Refusal) else after.backend.value
                given_to.append(to)
                valid_to.append(None if after is None else tally.valid(after))
                if plan.given is not None:
                    given = plan.given.get((shape_id, plan.current_buckets[i]), _MISSING)
                    if given is _MISSING:
                        given = settled.given(group, stage.bucket)  # type: ignore[union-attr]
                else:
                    decided = before_of(request, shape_id, stage)
                    given = None if isinstance(decided, Refusal) else decided.backend.value
                    if given_now is not None:
                        given_now[(shape_id, plan.current_buckets[i])] = given
                for row in group.rows:
                    n = stage.count(row)
                    if not n:
                        continue
                    if given_now is not None and given is not None and row.backend != given:
                        pending_now += n
                    if to is not None and row.backend != to:
                        pending_after += n
                    if given is not None and given == to:  # they stay: pending or not
                        tally.settle(row.backend, given, n)
                        continue
                    if after is None:
                        after = to_of(request, shape_id, stage)
                    tally.add(
                        group.cluster,
                        row.backend,
                        given,
                        partial(before_of, request, shape_id, stage),
                        after,
                        n,
                        own,
                    )
            if settled is not None:
                for buckets, at in plan.proposal_at:
                    given_after[(shape_id, buckets)] = given_to[at]
                    valid_after[(shape_id, buckets)] = valid_to[at]
        if settled is not None:
            if given_now is not None:
                settled.worked_out(cluster, pending_now, given_now)
            # with a kept part, the groups that stay were not decided: no valid sets
            valid = valid_after if kept is None else None
            settled.proposed(cluster, proposed, pending_after, given_after, valid)
            if deadline is not None:
                deadline.check()
    return tally.preview(total=total, unreadable=unreadable)


_MISSING = object()


@dataclass(frozen=True)
class _ModelPlan:
    """What the replay of one cluster's groups of one model shares: the replay's stage
    classes (the current and the proposed rollouts together), each with the class of
    the configuration in force holding it (``current_buckets``), where each class of
    the proposal's own takes its backend from (``proposal_at``), the two sides'
    deciders, and what the configuration in force gives (``Settled.given_in``; None
    without ``settled``: the "from" side is then decided)."""

    stages: tuple[StageClass, ...]
    current_buckets: tuple[frozenset[int] | None, ...]
    proposal_buckets: tuple[frozenset[int] | None, ...]
    proposal_at: tuple[tuple[frozenset[int] | None, int], ...]
    to: Decider
    before: Decider
    given: Mapping[tuple[str, frozenset[int] | None], str | None] | None

    @classmethod
    def of(
        cls,
        request: SelectRequest,
        current: DecisionInputs,
        proposed: DecisionInputs,
        now: datetime,
        inputs_for: InputsFor | None,
        classes: ClassCache,
        memo: DecisionMemo,
        exact: bool,
        settled: Settled | None,
        from_side: str = "from",
        layouts: _Layouts | None = None,
    ) -> _ModelPlan:
        partials = classes.partials(request, proposed.overrides, now)
        current_partials = classes.partials(request, current.overrides, now)

        def side(name: str, inputs: DecisionInputs) -> Decider:
            def narrow() -> DecisionInputs:
                return inputs if inputs_for is None else inputs_for(request, inputs, now)

            return memo.decider(request, inputs, narrow, side=name, exact=exact)

        layouts = {} if layouts is None else layouts
        given = None
        held: tuple[StageClass, ...] | None = None
        if settled is not None:
            found = settled.given_kept_in(request)
            if found is None:  # decided by the replay (its "from" side), as it walks
                held = classes.of(current_partials)
            else:
                given, held = found
        at = (tuple(map(id, current_partials)), tuple(map(id, partials)), id(held))
        layout = layouts.get(at)
        if layout is None:
            layout = layouts[at] = _Layout.of(classes, current_partials, partials, held)
        return cls(*layout, side("to", proposed), side(from_side, current), given)


@dataclass(frozen=True)
class _Layout:
    """The stage classes of a :class:`_ModelPlan` and how they map onto those of each
    side: a function of the two sides' partial rollouts and the classes the
    configuration in force keeps (``held``; None without ``Settled``), so found once
    per distinct such triple in a replay (``layouts``), not per cluster and model:
    every cluster without a staged rollout shares one, and a cluster's models share
    theirs when no override names a model."""

    stages: tuple[StageClass, ...]
    current_buckets: tuple[frozenset[int] | None, ...]
    proposal_buckets: tuple[frozenset[int] | None, ...]
    proposal_at: tuple[tuple[frozenset[int] | None, int], ...]

    @classmethod
    def of(
        cls,
        classes: ClassCache,
        current: Sequence[Override],
        proposed: Sequence[Override],
        held: tuple[StageClass, ...] | None,
    ) -> _Layout:
        stages = classes.of(_union(current, proposed))
        current_buckets: tuple[frozenset[int] | None, ...] = ()
        if held is not None:
            current_buckets = tuple(_holding(held, stage.bucket) for stage in stages)
        own_classes = classes.of(proposed)
        return cls(
            stages,
            current_buckets,
            tuple(_holding(own_classes, stage.bucket) for stage in stages),
            tuple((own.buckets, _at(stages, own)) for own in own_classes),
        )

    def __iter__(self) -> Iterator[Any]:
        """The fields in order, so a plan is made as ``_ModelPlan(*layout, ...)``."""
        return iter((self.stages, self.current_buckets, self.proposal_buckets, self.proposal_at))


_Layouts = dict[tuple[tuple[int, ...], tuple[int, ...], int], _Layout]


def _holding(classes: Sequence[StageClass], bucket: int | None) -> frozenset[int] | None:
    """The buckets of the class of ``classes`` that holds ``bucket`` (a bucket of a
    replay's class, which split the buckets at least as finely)."""
    for stage in classes:
        if stage.buckets is None or bucket in stage.buckets:
            return stage.buckets
    raise LookupError(f"no stage class holds {bucket}")


def _at(stages: Sequence[StageClass], own: StageClass) -> int:
    """Which of the replay's ``stages`` lies within the proposal's class ``own``: those
    split the buckets at least as finely (the current and the proposed rollouts
    together), so the one holding ``own``'s bucket is decided alike."""
    return next(
        i
        for i, stage in enumerate(stages)
        if own.bucket is None or stage.buckets is None or own.bucket in stage.buckets
    )


def untouched(current: DecisionInputs, proposed: DecisionInputs, cluster: str) -> bool:
    """Whether ``proposed`` decides every pod of ``cluster`` as ``current`` does: the
    same rules, evidence and overrides for the cluster (the very objects: a proposal
    replaces one scope's override and keeps the others), and so the same trust scope."""
    if proposed.rules is not current.rules or proposed.evidence is not current.evidence:
        return False
    if proposed.evidence_generation != current.evidence_generation:
        return False
    return _same(current.overrides_for(cluster), proposed.overrides_for(cluster))


def _same(mine: Sequence[Override], theirs: Sequence[Override]) -> bool:
    """Whether two sequences of overrides are the very same objects."""
    return len(mine) == len(theirs) and all(a is b for a, b in zip(mine, theirs, strict=True))


class _Tally:
    """What a replay counts: pods that change, pods refused, and pods still pending."""

    def __init__(self) -> None:
        self.changes: Counter[tuple[str, str, str]] = Counter()
        self.reasons: dict[tuple[str, str, str], Counter[tuple[str, ...]]] = {}
        self.invalid: Counter[tuple[str, str, str]] = Counter()
        # why_moved per pair of decisions (memoised, so shared) and backend left, in
        # the words of a stand-in when the decisions are shared (``fleet/effects.py``)
        self.explained: dict[tuple[int, int, str], tuple[str, ...]] = {}
        # those words for one cluster's own override
        self.rendered: dict[tuple[tuple[str, ...], int], tuple[str, ...]] = {}
        # the exclusions a ``why`` quotes, by backend
        self.causes: dict[tuple[str, ...], dict[str, MeasuredExclusion]] = {}
        # the backends valid per decision (memoised, so shared): ``valid``
        self.valid_of: dict[int, tuple[Decision | Refusal, tuple[Backend, ...] | None]] = {}
        self.pending = 0

    def valid(self, outcome: Decision | Refusal) -> tuple[Backend, ...] | None:
        """The backends ``outcome``'s candidates say are valid: what ``assess`` gives
        (a decision's candidates carry its assessment's reasons as they are). None for
        a refusal, whose strict request may have had a reason added while deciding."""
        found = self.valid_of.get(id(outcome))
        if found is None or found[0] is not outcome:
            backends = (
                None
                if isinstance(outcome, Refusal)
                else tuple(c.backend for c in outcome.candidates if c.valid)
            )
            found = self.valid_of[id(outcome)] = (outcome, backends)
        return found[1]

    def settle(self, recorded: str, given: str | None, n: int) -> str:
        """The backend the configuration in force gives ``n`` pods that run
        ``recorded`` (``recorded`` where it refuses them), counting them pending when
        that is not what they run. All that :meth:`add` counts of pods the proposal
        keeps where they are."""
        was = recorded if given is None else given
        if was != recorded:
            self.pending += n
        return was

    def add(
        self,
        cluster: str,
        recorded: str,
        given: str | None,
        before: Callable[[], Decision | Refusal],
        after: Decision | Refusal,
        n: int,
        own: Sequence[Override] = (),
    ) -> None:
        """``n`` pods of ``cluster`` that run ``recorded``, to which the configuration
        in force gives ``given`` (None: it refuses them; ``before()``: that decision,
        asked only when they move) and the proposal ``after``; ``own``: the cluster's
        own override, whose words a shared decision's stand-in takes."""
        was = self.settle(recorded, given, n)
        if isinstance(after, Refusal):
            if given is not None:
                self.invalid[(cluster, was, words(after.message, own))] += n
        elif after.backend.value != was:
            key = (cluster, was, after.backend.value)
            self.changes[key] += n
            decided = before()
            found = self.explained.get((id(decided), id(after), was))
            if found is None:
                found = why_moved(decided, after, was)
                self.explained[(id(decided), id(after), was)] = found
                cause = _exclusion_of(after, was)
                if cause is not None and f"{was}: {cause_words.exclusion(cause)}" in found:
                    self.causes[found] = {was: cause}
            shown = self._rendered(found, own)
            self.reasons.setdefault(key, Counter())[shown] += n

    def _rendered(self, found: tuple[str, ...], own: Sequence[Override]) -> tuple[str, ...]:
        """``found`` in the words of ``own`` (``effects.words``), once per override."""
        if not own:
            return found
        key = (found, id(own[0]))
        shown = self.rendered.get(key)
        if shown is None:
            shown = self.rendered[key] = tuple(words(w, own) for w in found)
            if found in self.causes:
                self.causes[shown] = self.causes[found]
        return shown

    def preview(self, *, total: int, unreadable: int) -> Preview:
        changes, invalid, reasons = self.changes, self.invalid, self.reasons
        affected = sorted({c for c, _, _ in changes} | {c for c, _, _ in invalid})
        return Preview(
            pods_total=total,
            pods_changed=sum(changes.values()),
            pods_invalid=sum(invalid.values()),
            changes=[
                Change(
                    cluster=c,
                    from_=f,
                    to=t,
                    pods=n,
                    reasons=[
                        ChangeReason(pods=k, why=list(why), exclusions=self.causes.get(why, {}))
                        for why, k in sorted(
                            reasons[(c, f, t)].items(), key=lambda kv: (-kv[1], kv)
                        )
                    ],
                )
                for (c, f, t), n in sorted(
                    changes.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0])
                )
            ],
            invalid=[
                InvalidChange(cluster=c, from_=f, reason=r, pods=n)
                for (c, f, r), n in sorted(invalid.items())
            ],
            clusters_affected=affected,
            pods_pending=self.pending,
            pods_unreadable=unreadable,
        )


def why_moved(before: Decision | Refusal, after: Decision, was: str) -> tuple[str, ...]:
    """Why pods that run ``was`` get ``after.backend`` instead, from the two decisions
    the replay made for them (``before``: under the config in force): the proposal's
    reasons against ``was`` that the config in force did not have, the stages they
    enter or leave, overrides that stop applying, and the evaluator's own reason for
    the new backend. Nothing is decided here: every part is read off the decisions."""
    out: list[str] = []
    old = _reasons_of(before, was)
    out += [f"{was}: {r}" for r in _reasons_of(after, was) if r not in old]
    earlier = {ref.cluster: ref for ref in before.overrides}
    for ref in after.overrides:
        prior = earlier.get(ref.cluster)
        was_in = _in_stage(prior)
        r = ref.rollout
        if r is None:
            continue
        if r.in_stage and not was_in:
            out.append(f"In the {r.percent} % stage of {ref.label}.")
        elif not r.in_stage and was_in:
            out.append(
                f"The rollout of {ref.label} is halted."
                if r.state == "halted"
                else f"Not in the {r.percent} % stage of {ref.label}."
            )
    applied = {ref.cluster for ref in after.overrides if ref.effect != "none"}
    for ref in before.overrides:
        gone = ref.effect != "none" and ref.cluster not in applied
        if gone and not any(x.cluster == ref.cluster and x.rollout for x in after.overrides):
            out.append(f"{ref.label[0].upper()}{ref.label[1:]} no longer applies.")
    out.append(after.why)
    return tuple(out)


def _reasons_of(outcome: Decision | Refusal, backend: str) -> list[str]:
    return next((list(c.reasons) for c in outcome.candidates if c.backend.value == backend), [])


def _in_stage(ref: OverrideRef | None) -> bool:
    return ref is not None and ref.rollout is not None and ref.rollout.in_stage


def _union(a: Sequence[Override], b: Sequence[Override]) -> tuple[Override, ...]:
    seen = {id(o) for o in a}
    return (*a, *(o for o in b if id(o) not in seen))


def with_override(
    overrides: Sequence[Override], cluster: str, proposed: Override | None
) -> list[Override]:
    """The override set with ``cluster``'s entry replaced (or removed when None)."""
    out = [o for o in overrides if o.cluster != cluster]
    if proposed is not None:
        out.append(proposed)
    return out


def _exclusion_of(outcome: Decision, backend: str) -> MeasuredExclusion | None:
    return next((c.exclusion for c in outcome.candidates if c.backend.value == backend), None)
