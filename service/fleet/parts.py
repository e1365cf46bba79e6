"""Each cluster's share of the fleet reads, kept across reads until what it depends on
changes.

A summary adds up, cluster by cluster, what each cluster's pods give: their counts,
their regret and exclusions, and their part of every staged override's progress. A
preview of one cluster's override needs, of every other cluster, only how many of its
pods run something else than the configuration in force gives them (``pods_pending``):
the proposal decides them exactly as before; and of the cluster it replays, what the
configuration in force gives each group (the preview's "from", ``given``). Each of
these is a function of one cluster's:

- groups (its pods' counts by shape, backend, source and stage bucket);
- rules (the fleet's and the cluster's own rule set);
- overrides (the fleet's ``*`` ones and its own: ``DecisionInputs.overrides_for``),
  as text less what no figure reads (``_UNCARRIED``: a note, an expiry, what the store
  writes), with which of them have expired;
- evidence: the indexes its pods' decisions read (the trust scope their overrides
  give them, found through ``inputs_for``) and its own samples (``evidence_of``), as
  their versions, under an epoch that moves when one of those indexes is replaced by
  another object (a full reload, a cluster's first report, a new trust scope).

That tuple is the part's key. A read works out only the parts whose key moved and
takes the others as kept, so a summary after one pod booted, a report of one cluster,
or an override written on one cluster costs that cluster's groups plus a lookup per
other cluster: O(clusters + overrides) lookups and the changed clusters' evaluations,
however many clusters hold overrides. Within one read the decisions are shared by
every cluster they hold for alike, and by every cluster whose overrides act alike
(``DecisionMemo``, ``fleet/effects.py``).

Only the configuration in force is kept, with the part each cluster had before it (a
change taken back finds it again). Besides, each cluster's figures are carried by
content (``_Carried``: the key less what no figure reads, an override's note and what
the store writes): a change's preview carries what its proposal gives each group, and
each figure a read works out is carried too, so the read after a change is written
takes them instead of walking the cluster's groups again: the backends and pending
pods when its content was previewed before (a change written after its dry run), and
every figure when it was in force before (taken back and written again, its note or
expiry edited). The parts are read and written by the
replica's one fleet-read thread.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mla_switchboard.core.causes import MeasuredExclusion
from mla_switchboard.core.evaluator import DecisionInputs, Refusal
from mla_switchboard.core.evidence import EvidenceIndex
from mla_switchboard.core.schemas import FLEET, Override, RulesDocument, SelectRequest
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.fleet.groups import (
    ClassCache,
    Deadline,
    Decider,
    DecisionMemo,
    FleetSnapshot,
    KeptDecisions,
    PodGroup,
    StageClass,
    each_group,
)
from mla_switchboard.service.fleet.narrowing import per_model
from mla_switchboard.service.fleet.progress import (
    Counted,
    ProgressWalk,
    RolloutTally,
    StageSamples,
)
from mla_switchboard.service.fleet.regret import (
    situation_failing,
    situation_rankable,
)
from mla_switchboard.service.selector import InputsFor

__all__ = ["ClusterPart", "ClusterParts", "PartsRead"]


@dataclass(eq=False)
class ClusterPart:
    """One cluster's share of the fleet reads under one key; each figure is worked out
    the first time a read asks for it (a summary never needs ``pending``, a preview
    needs nothing else)."""

    key: Hashable
    counts: dict[str, int] | None = None
    regret: dict[str, Any] | None = None
    excluded: dict[str, MeasuredExclusion] | None = None
    progress: dict[int, RolloutTally] = field(default_factory=dict)
    """per position in ``DecisionInputs.overrides_for(cluster)``: that staged
    override's progress among this cluster's pods"""
    pending: int | None = None
    given: dict[tuple[str, frozenset[int] | None], str | None] | None = None
    """per (shape, stage class) of the configuration in force: the backend it gives
    those pods (None: refused); worked out with ``pending``"""
    valid: _Valid | None = None
    """per (shape, stage class): the backends valid for those pods (None: not known,
    a refusal), read off the decisions of a preview of this content; the regret reads
    them instead of assessing those groups again"""


class _Texts:
    """Each override's content as text, worked out once per override object: a reload
    keeps the objects of the overrides that did not change (``ConfigStore.load_config``),
    and so their texts. ``exclude``: fields left out of the text."""

    def __init__(self, exclude: frozenset[str] = frozenset()) -> None:
        self._exclude = set(exclude) or None
        self._set: Sequence[Override] | None = None
        self._text: dict[int, tuple[Override, str]] = {}  # the object is held: ids stay

    def of(self, overrides: Sequence[Override], o: Override) -> str:
        """``o``'s text; ``overrides``: the set it is one of. The texts of overrides no
        longer in it are forgotten once they are many: a preview asks for those of the
        configuration in force and of the proposal in turn, cluster by cluster."""
        if overrides is not self._set and len(self._text) > 2 * len(overrides) + 64:
            alive = {id(x): x for x in overrides}
            self._text = {i: v for i, v in self._text.items() if alive.get(i) is v[0]}
            self._set = overrides
        found = self._text.get(id(o))
        if found is None or found[0] is not o:
            found = self._text[id(o)] = (o, o.model_dump_json(exclude=self._exclude))
        return found[1]


_Read = tuple[frozenset[str], list[EvidenceIndex], int]
"""A cluster's models, the evidence indexes its figures read, and their epoch."""

_Given = dict[tuple[str, frozenset[int] | None], str | None]
"""``ClusterPart.given``."""

_Valid = dict[tuple[str, frozenset[int] | None], tuple[Backend, ...] | None]
"""``ClusterPart.valid``."""

_WRITTEN = frozenset({"created_at", "created_by", "revision"})
"""What the store sets of an override it writes: no decision reads them as a backend."""

_UNCARRIED = _WRITTEN | {"note", "expires_at"}
"""What a carried figure (``_Carried``: backends, counts of pods, regret, exclusions,
rollout progress) leaves out of an override's text. A note is only ever words: the
evaluator quotes it in a reason or a message, and no backend depends on a reason's
words (a backend is valid when it has no reason; the one kept valid against failures
has the failure's reason alone, which begins otherwise than a deny's); a revision is
named in messages only. An expiry only decides whether the override applies
at all, which the key holds apart (expired or not at the read's time). So a change
previewed with one note and written with another, or previewed again, carries what
the first preview found."""

CARRIED_KEPT = 4
"""How many carried figures are kept per cluster (the newest): a change previewed,
written and taken back, then previewed again, finds each of them."""


@dataclass(frozen=True)
class _KeptFor:
    """What a kept thing was worked out from: ``key``, and the evidence indexes (the
    very objects, whose versions ``key`` holds). It holds for a read whose key is equal
    and whose indexes are those objects: a version is only comparable within one."""

    key: Hashable
    indexes: tuple[EvidenceIndex, ...]

    def holds(self, key: Hashable, indexes: Sequence[EvidenceIndex]) -> bool:
        return (
            len(indexes) == len(self.indexes)
            and all(a is b for a, b in zip(indexes, self.indexes, strict=True))
            and key == self.key
        )


@dataclass(frozen=True)
class _Carried(_KeptFor):
    """One cluster's figures under one configuration's content (``ClusterParts.carry``),
    with what they were worked out from: the cluster's groups, rules, overrides (less
    ``_UNCARRIED``), which of them had expired, and the evidence indexes (the very
    objects) at their versions. ``figures``: a part whose figures fill in as reads work
    them out under that content: a proposal's ``pending`` and ``given`` from its
    preview, the summary's regret, exclusions and rollout progress from the first
    read that needs them. None of them reads an override's note or what the store
    writes (they are numbers, backends and failure causes), so every configuration of
    the same content shares them: a change written after its dry run, taken back and
    written again, or its expiry moved, finds those worked out so far."""

    figures: ClusterPart


def trust_content(
    overrides: Sequence[Override], expired: Sequence[bool]
) -> tuple[tuple[bool, str, tuple[str, ...], bool], ...]:
    """What the evidence a cluster's pods trust is a function of, of ``overrides`` (the
    fleet's and the cluster's own, ``DecisionInputs.overrides_for``; ``expired``:
    whether each had expired at the read's time): a pod trusts the scope of the last
    override that applies to it and names one (``trust_scope``: the fleet's first),
    and whether one applies is its scope (fleet or own), model glob and expiry. An
    override that names no scope changes nothing a cluster trusts, so a change of
    what it denies, forces or notes (a fleet-wide deny never seen before) finds the
    indexes kept for the content before it."""
    return tuple(
        (o.cluster == FLEET, o.model, tuple(o.trust_clusters), gone)
        for o, gone in zip(overrides, expired, strict=True)
        if o.trust_clusters is not None
    )


@dataclass(frozen=True)
class Telling(_KeptFor):
    """Which of a cluster's groups the regret and the exclusions read, from the
    evidence alone: those whose situation the index their pods trust could rank
    (``regret.situation_rankable``), and those whose situation has failures noted in it
    (``regret.situation_failing``); in the groups' order. Neither reads an override but
    through the trust scope, so they hold for every configuration whose indexes for
    the cluster are the same objects at the same versions: a fleet-wide deny never
    seen before reads the few groups that tell (a tenth of a fleet's, and failing far
    fewer), not every group of every cluster."""

    rankable: tuple[PodGroup, ...]
    failing: tuple[PodGroup, ...]

    @classmethod
    def find(
        cls,
        key: Hashable,
        indexes: Sequence[EvidenceIndex],
        groups: Sequence[PodGroup],
        inputs: DecisionInputs,
        now: datetime,
        narrow: InputsFor | None,
        memo: DecisionMemo,
        deadline: Deadline | None,
    ) -> Telling:
        """Those of ``groups`` (one cluster's, under ``inputs``) that tell, asked of
        the evidence their pods trust (``narrow``: the read's ``inputs_for``)."""
        rankable: list[PodGroup] = []
        failing: list[PodGroup] = []
        for group in each_group(groups, deadline):
            request = group.request
            if request is None:
                continue
            evidence = (inputs if narrow is None else narrow(request, inputs, now)).evidence
            if memo.of_situation(situation_rankable, evidence, group.shape_id, request):
                rankable.append(group)
            if memo.of_situation(situation_failing, evidence, group.shape_id, request):
                failing.append(group)
        return cls(key, tuple(indexes), tuple(rankable), tuple(failing))


class ClusterParts:
    """The parts of the configuration in force, one per cluster (module docstring).

    ``computed`` counts the figures worked out, by kind: what the growth tests count,
    since a figure kept costs no evaluation however large the fleet."""

    def __init__(self) -> None:
        self._kept: dict[str, ClusterPart] = {}
        self._before_parts: dict[str, ClusterPart] = {}  # the one each replaced
        self._lock = threading.Lock()
        self._carry_texts = _Texts(_UNCARRIED)
        self._carried: dict[str, list[_Carried]] = {}  # per cluster, the newest last
        self._rules: tuple[RulesDocument, str] | None = None
        self._stamp: tuple[Any, ...] = (None, None, None)
        self._read: dict[str, _Read] = {}
        self._before: dict[str, _Read] = {}
        self._epochs = itertools.count()
        # per cluster, the indexes its figures read by the content of its overrides,
        # under one evidence generation and index of all (``indexes_by_content``)
        self._by_content: dict[str, dict[Hashable, list[EvidenceIndex]]] = {}
        self._content_stamp: tuple[Any, ...] = (None, None)
        self.samples = StageSamples()  # a rollout's stage samples, by evidence version
        self.telling: dict[str, Telling] = {}  # per cluster, the latest (``Telling``)
        # per (cluster, scope of a staged override): its progress there but
        # ``booted``, the newest few (``progress.Counted``)
        self.counted: dict[tuple[str, str], list[Counted]] = {}
        # per cluster: its groups (the snapshot's tuple), as the keys read them
        self._shaped: dict[str, tuple[tuple[PodGroup, ...], tuple[Any, ...], frozenset[str]]] = {}
        self.computed: dict[str, int] = {}
        self.decisions = KeptDecisions()  # under the configuration in force, across reads

    def reading(
        self,
        fleet: FleetSnapshot,
        inputs: DecisionInputs,
        now: datetime,
        *,
        inputs_for: InputsFor | None = None,
        evidence_of: Callable[[str], EvidenceIndex] | None = None,
        deadline: Deadline | None = None,
    ) -> PartsRead:
        """One read's view of the parts: ``fleet``, ``inputs`` and ``now`` are those of
        the read; parts it works out are kept for the next."""
        return PartsRead(self, fleet, inputs, now, inputs_for, evidence_of, deadline)

    def count(self, kind: str) -> None:
        self.computed[kind] = self.computed.get(kind, 0) + 1

    def kept(self, cluster: str, key: Hashable) -> ClusterPart:
        """The part of ``cluster`` under ``key``: the kept one while the key holds,
        else a new, empty one (kept from now on). The part it replaces is kept too,
        one per cluster: a change taken back (a fleet-wide override put, then
        deleted; the reload keeps the objects, and so the texts, of the overrides
        that did not change) finds every cluster's figures as they were."""
        with self._lock:
            part = self._kept.get(cluster)
            if part is None or part.key != key:
                before = self._before_parts.get(cluster)
                if part is not None:
                    self._before_parts[cluster] = part
                taken_back = before is not None and before.key == key
                part = before if taken_back and before is not None else ClusterPart(key)
                self._kept[cluster] = part
            return part

    def forget_others(self, clusters: dict[str, Any]) -> None:
        """Drop the parts of clusters no longer in the fleet (``clusters``: the whole
        fleet's, not a caller's scope), once they are many."""
        with self._lock:
            if len(self._kept) <= 2 * len(clusters) + 64:
                return
            for cluster in [c for c in self._kept if c not in clusters]:
                del self._kept[cluster]
                self._before_parts.pop(cluster, None)
            for cluster in [c for c in self._carried if c not in clusters]:
                del self._carried[cluster]
            for cluster in [c for c in self.telling if c not in clusters]:
                del self.telling[cluster]
            # the latest per cluster and override alive: others' are dropped
            self.counted = {k: v for k, v in self.counted.items() if k[0] in clusters}
            for cluster in [c for c in self._shaped if c not in clusters]:
                del self._shaped[cluster]

    def shaped(
        self, cluster: str, groups: tuple[PodGroup, ...]
    ) -> tuple[tuple[tuple[str, Any], ...], frozenset[str]]:
        """What the keys read of ``cluster``'s ``groups`` (one snapshot's tuple of them):
        each group's shape and rows, and the cluster's models; found once per snapshot
        and cluster, not per read and configuration (a preview asks for the two it
        compares, a summary for its key and its telling groups)."""
        found = self._shaped.get(cluster)
        if found is None or found[0] is not groups:
            models = frozenset(g.request.model.name for g in groups if g.request is not None)
            found = (groups, tuple((g.shape_id, g.rows) for g in groups), models)
            self._shaped[cluster] = found
        return found[1], found[2]

    def read_by(
        self,
        cluster: str,
        groups: Sequence[PodGroup],
        inputs: DecisionInputs,
        find: Callable[[], list[EvidenceIndex]],
    ) -> tuple[list[EvidenceIndex], int]:
        """``reading.indexes_read`` of ``cluster``, and its epoch.

        Which indexes a cluster reads changes only with the overrides in force (its
        pods' trust scopes) and when an index is replaced or added (the evidence
        generation moves), so they are found again only then; a read in between asks
        each index's version. The epoch moves when the indexes found are other objects
        than before: a version is only comparable within one index. ``find()``: the
        indexes, when they are to be found again (``PartsRead.indexes_by_content``)."""
        stamp = (inputs.overrides, inputs.evidence_generation, inputs.evidence)
        if any(a is not b for a, b in zip(self._stamp, stamp, strict=True)):
            # the previous mapping is kept until the next change: its indexes stay alive
            # meanwhile, so "the same object" below is never a new one at a reused
            # address (a replaced index is released at the change after)
            self._stamp, self._before, self._read = stamp, self._read, {}
        models = self.shaped(cluster, tuple(groups))[1]
        found = self._read.get(cluster)
        if found is None or found[0] != models:
            indexes = find()
            prior = found or self._before.get(cluster)
            same = (
                prior is not None
                and len(prior[1]) == len(indexes)
                and all(a is b for a, b in zip(prior[1], indexes, strict=True))
            )
            epoch = prior[2] if same and prior is not None else next(self._epochs)
            found = self._read[cluster] = (models, indexes, epoch)
        return found[1], found[2]

    def indexes_by_content(
        self,
        cluster: str,
        content: Hashable,
        inputs: DecisionInputs,
        find: Callable[[], list[EvidenceIndex]],
    ) -> list[EvidenceIndex]:
        """The indexes the figures of ``cluster`` read (``PartsRead.indexes_read``)
        under overrides of ``content`` (its models, and what of its overrides decides
        the scopes its pods trust: ``trust_content``), found by ``find()`` when this
        content was not met since the evidence generation or the index of all last
        moved (an index replaced or added moves them). A change taken back, previewed
        and then written, or one that names no trust scope (a fleet-wide deny) returns
        every cluster to a content met before: their indexes are not asked of the
        evidence again, cluster by model."""
        stamp = (inputs.evidence_generation, inputs.evidence)
        kept = self._content_stamp
        if kept[0] != stamp[0] or kept[1] is not stamp[1]:
            self._content_stamp, self._by_content = stamp, {}
        per = self._by_content.setdefault(cluster, {})
        found = per.get(content)
        if found is None:
            if len(per) >= CARRIED_KEPT:
                del per[next(iter(per))]  # the oldest met
            found = per[content] = find()
        return found

    def epoch_of(self, cluster: str, indexes: Sequence[EvidenceIndex]) -> int | None:
        """The epoch ``read_by`` gave ``cluster`` for these very indexes (in this
        configuration's mapping or the one before), None when it gave none."""
        for found in (self._read.get(cluster), self._before.get(cluster)):
            if (
                found is not None
                and len(found[1]) == len(indexes)
                and all(a is b for a, b in zip(found[1], indexes, strict=True))
            ):
                return found[2]
        return None

    def peek(self, cluster: str, key: Hashable) -> ClusterPart | None:
        """The part of ``cluster`` kept under ``key`` (the one in force or the one it
        replaced), without keeping anything: None when neither has that key."""
        with self._lock:
            for part in (self._kept.get(cluster), self._before_parts.get(cluster)):
                if part is not None and part.key == key:
                    return part
        return None

    def rules_text(self, rules: RulesDocument) -> str:
        kept = self._rules
        if kept is None or kept[0] is not rules:
            text = rules.model_dump_json()
            digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
            kept = self._rules = (rules, digest)
        return kept[1]

    def carry_text(self, overrides: Sequence[Override], o: Override) -> str:
        """``o`` as text without what the store sets when it writes it and without its
        note (``_UNCARRIED``): a proposal's override and the one written of it read
        alike."""
        return self._carry_texts.of(overrides, o)

    def carry(self, cluster: str, key: Hashable, indexes: Sequence[EvidenceIndex]) -> ClusterPart:
        """The figures kept for ``cluster`` under the content ``key`` and ``indexes``
        (``_Carried``), among the last ``CARRIED_KEPT``: made empty when none are, and
        filled by whoever works one out. Once a configuration of that content is in
        force, the next read takes them for the cluster's new part instead of walking
        its groups again (``PartsRead.part``), and a preview of it again takes its
        backends (``PartsRead.kept_given``)."""
        with self._lock:
            kept = self._carried.get(cluster, [])
            found = next((c for c in kept if c.holds(key, indexes)), None)
            if found is None:
                found = _Carried(key, tuple(indexes), ClusterPart(key))
            kept = [c for c in kept if c is not found and c.key != key]
            kept.append(found)
            self._carried[cluster] = kept[-CARRIED_KEPT:]
            return found.figures

    def carried(
        self, cluster: str, key: Hashable, indexes: Sequence[EvidenceIndex]
    ) -> _Carried | None:
        """The figures kept for ``cluster`` that were worked out from ``key`` and
        ``indexes`` (``_Carried.holds``), None when none were."""
        with self._lock:
            kept = self._carried.get(cluster, ())
            return next((c for c in reversed(kept) if c.holds(key, indexes)), None)


class PartsRead:
    """The parts as one read sees them (see :meth:`ClusterParts.reading`)."""

    def __init__(
        self,
        parts: ClusterParts,
        fleet: FleetSnapshot,
        inputs: DecisionInputs,
        now: datetime,
        inputs_for: InputsFor | None,
        evidence_of: Callable[[str], EvidenceIndex] | None,
        deadline: Deadline | None,
    ) -> None:
        self._parts = parts
        self.fleet, self.inputs, self.now = fleet, inputs, now
        self._inputs_for = per_model(inputs_for)
        self._evidence_of = evidence_of
        self.deadline = deadline
        self._classes = ClassCache()
        self._memo = DecisionMemo(now, self._classes, parts.decisions.under(inputs))
        self._walk = ProgressWalk(
            inputs,
            now,
            self._inputs_for,
            evidence_of,
            memo=self._memo,
            classes=self._classes,
            samples=parts.samples,
        )
        self._found: dict[str, ClusterPart] = {}
        self._given_in: dict[tuple[str, str], tuple[_Given, tuple[StageClass, ...]]] = {}
        self._carry_keys: dict[
            tuple[int, str], tuple[DecisionInputs, Hashable, list[EvidenceIndex]]
        ] = {}
        self._figures: dict[str, ClusterPart] = {}  # per cluster: ``carried_figures``

    @property
    def classes(self) -> ClassCache:
        """The read's stage classes and overrides that apply, per cluster and model: a
        preview of this read shares them (``replay``'s ``classes``)."""
        return self._classes

    @property
    def memo(self) -> DecisionMemo:
        """The read's decisions: those of its side "" are under ``inputs`` (the
        configuration in force), so a preview of this read takes its "from" side
        from them (``replay``'s ``memo``) rather than deciding those groups again."""
        return self._memo

    @property
    def parts(self) -> ClusterParts:
        """What is kept across reads, as this read found it."""
        return self._parts

    @property
    def walk(self) -> ProgressWalk:
        """The read's walk of rollouts' progress (its stage samples, decisions and
        stage classes shared with the read's other figures)."""
        return self._walk

    @property
    def inputs_for(self) -> InputsFor | None:
        """The read's ``inputs_for``, asked once per cluster and model (``narrowing``)."""
        return self._inputs_for

    # ------------------------------------------------------------------ keys

    def key(self, cluster: str) -> tuple[Hashable, ...]:
        """What every figure of ``cluster`` depends on (module docstring): the content
        its figures are carried under (``carry_key``), and the epoch of the evidence
        indexes it reads (``ClusterParts.read_by``: their versions are only comparable
        while they are the same objects)."""
        groups = self.fleet.of_cluster(cluster)
        content, indexes = self.carry_key(cluster, self.inputs)
        epoch = self._parts.read_by(cluster, groups, self.inputs, lambda: indexes)[1]
        return (content, epoch)

    def check_deadline(self) -> None:
        """Check this read's deadline, which lets the event loop in now and then: the
        work a cluster needs before its groups are read (its evidence, its key, what is
        kept for it) is small, but across a thousand clusters without a check it held
        the interpreter for milliseconds at a time."""
        if self.deadline is not None:
            self.deadline.check()

    def kept_given(self, cluster: str, proposed: DecisionInputs) -> _Given | None:
        """What ``proposed`` gives the pods of ``cluster`` (``ClusterPart.given``), when
        a kept part holds it: the proposal is a configuration the parts were worked out
        for, as when a change is taken back (a fleet-wide override deleted right after
        it was put). Its key is the part's as a read under ``proposed`` would find it:
        the same groups, rules, overrides (as text), expiries, and evidence indexes (the
        very objects) at the same versions. Else what the last preview carried for the
        cluster, when it was of the same change (``_Carried``: a dry run, then the
        write). None when neither holds it."""
        content, indexes = self.carry_key(cluster, proposed)
        epoch = self._parts.epoch_of(cluster, indexes)
        part = None if epoch is None else self._parts.peek(cluster, (content, epoch))
        if part is not None and part.given is not None:
            return part.given
        carried = self._parts.carried(cluster, content, indexes)
        return None if carried is None else carried.figures.given

    def indexes_read(
        self,
        cluster: str,
        groups: Sequence[PodGroup],
        inputs: DecisionInputs | None = None,
    ) -> list[EvidenceIndex]:
        """The evidence indexes the figures of ``cluster`` read: for each model among
        its ``groups``, the one ``inputs_for`` gives its first request (a pod's trust
        scope is a function of its cluster and model: the overrides that apply), then
        the cluster's own samples (``evidence_of``: rollout progress). ``inputs``: the
        read's unless given (a proposal's)."""
        inputs = inputs or self.inputs
        found: list[EvidenceIndex] = []
        if self._inputs_for is None:
            found.append(inputs.evidence)
        else:
            models: set[str] = set()
            for g in groups:
                request = g.request
                if request is None or request.model.name in models:
                    continue
                models.add(request.model.name)
                found.append(self._inputs_for(request, inputs, self.now).evidence)
                self.check_deadline()
        if self._evidence_of is not None:
            found.append(self._evidence_of(cluster))
        return found

    def part(self, cluster: str) -> ClusterPart:
        part = self._found.get(cluster)
        if part is None:
            part = self._found[cluster] = self._parts.kept(cluster, self.key(cluster))
        return part

    def carried_figures(self, cluster: str) -> ClusterPart:
        """The figures carried for ``cluster`` under the content of this read's
        configuration (``ClusterParts.carry``: filled by the preview of a change, and
        by every read that works one out), found once per read and cluster. A part
        whose key moved takes what they hold rather than walking the cluster's groups
        again, and what it works out goes there too, for the next configuration of
        the same content."""
        found = self._figures.get(cluster)
        if found is None:
            key, indexes = self.carry_key(cluster, self.inputs)
            found = self._figures[cluster] = self._parts.carry(cluster, key, indexes)
        return found

    def given_kept(self, cluster: str) -> _Given | None:
        """The part's ``given`` when it is worked out or a preview carried it (the
        configuration in force was previewed before it was written), without deciding
        it: None otherwise."""
        part = self.part(cluster)
        if part.given is None:
            carried = self.carried_figures(cluster)
            if carried.pending is None or carried.given is None:
                return None
            part.pending, part.given = carried.pending, carried.given
        return part.given

    def pending(self, cluster: str) -> int:
        """Pods of ``cluster`` whose recorded backend is not what the configuration in
        force gives them (a preview's ``pods_pending``, counted as ``replay`` does)."""
        if self.given_kept(cluster) is None:  # kept as carried: a later preview finds it
            self.worked_out(cluster, *self._current(self.fleet.of_cluster(cluster)))
        pending = self.part(cluster).pending
        assert pending is not None  # set with ``given``, always
        return pending

    def carry_key(
        self, cluster: str, inputs: DecisionInputs
    ) -> tuple[Hashable, list[EvidenceIndex]]:
        """What ``pending`` and ``given`` of ``cluster`` under ``inputs`` are worked out
        from (``_Carried``), once per inputs and cluster in this read."""
        at = (id(inputs), cluster)
        found = self._carry_keys.get(at)
        if found is None or found[0] is not inputs:
            found = self._carry_keys[at] = (inputs, *self._carry_key_of(cluster, inputs))
        return found[1], found[2]

    def _carry_key_of(
        self, cluster: str, inputs: DecisionInputs
    ) -> tuple[Hashable, list[EvidenceIndex]]:
        groups = self.fleet.of_cluster(cluster)
        overrides = inputs.overrides_for(cluster)
        parts, now = self._parts, self.now
        texts = tuple(parts.carry_text(inputs.overrides, o) for o in overrides)
        expired = tuple(o.expires_at is not None and o.expires_at <= now for o in overrides)
        shapes, models = parts.shaped(cluster, groups)

        def find() -> list[EvidenceIndex]:
            content = (models, trust_content(overrides, expired))
            return parts.indexes_by_content(
                cluster, content, inputs, lambda: self.indexes_read(cluster, groups, inputs)
            )

        if inputs is self.inputs:  # found once per configuration (``read_by``)
            indexes = parts.read_by(cluster, groups, inputs, find)[0]
        else:
            indexes = find()
        key = (
            shapes,
            parts.rules_text(inputs.rules),
            texts,
            expired,
            inputs.evidence_generation,
            tuple(index.version for index in indexes),
        )
        self.check_deadline()
        return key, indexes

    def proposed(
        self,
        cluster: str,
        proposed: DecisionInputs,
        pending: int,
        given: _Given,
        valid: _Valid | None = None,
    ) -> None:
        """What a preview's proposal gives the pods of ``cluster`` (``pending``: those
        whose recorded backend it does not give; ``given``: per shape and stage class
        of the proposal; ``valid``: the backends valid there, when every group was
        decided), kept for the read after the proposal is written
        (``ClusterParts.carry``). A change of rules is not carried: its text is
        worked out anew for every cluster."""
        if proposed.rules is not self.inputs.rules:
            return
        carried = self._parts.carry(cluster, *self.carry_key(cluster, proposed))
        carried.pending, carried.given = pending, given
        if valid is not None:
            carried.valid = valid

    def given(self, group: PodGroup, bucket: int | None) -> str | None:
        """The backend the configuration in force gives the pods of ``group`` in stage
        bucket ``bucket`` (None: refused): a preview's "from", kept with ``pending``.
        ``bucket`` is any bucket of a stage class of the preview's, which splits those
        of the configuration in force further (a proposal may add a staged rollout)."""
        assert group.request is not None
        given, stages = self.given_in(group.request)
        for stage in stages:
            if stage.buckets is None or bucket in stage.buckets:
                return given[(group.shape_id, stage.buckets)]
        raise LookupError(f"no stage class of {group.cluster}/{group.shape_id} holds {bucket}")

    def given_kept_in(self, request: SelectRequest) -> tuple[_Given, tuple[StageClass, ...]] | None:
        """``given_in`` when the cluster's ``given`` is worked out or carried; None
        otherwise (a preview then decides it as it walks the groups: ``worked_out``)."""
        found = self._given_in.get((request.cluster, request.model.name))
        if found is not None:
            return found
        return None if self.given_kept(request.cluster) is None else self.given_in(request)

    def worked_out(self, cluster: str, pending: int, given: _Given) -> None:
        """What the config in force gives the pods of ``cluster``, decided by
        :meth:`pending` or by a preview as it walks the groups (the read's memo both),
        kept in the part and carried as every figure is."""
        self._parts.count("pending")
        carried = self.carried_figures(cluster)
        carried.pending, carried.given = pending, given
        part = self.part(cluster)
        part.pending, part.given = pending, given

    def given_in(self, request: SelectRequest) -> tuple[_Given, tuple[StageClass, ...]]:
        """What the configuration in force gives the pods of ``request``'s cluster and
        model: the backend per (shape, stage class) (``given``), and those stage
        classes (a function of the cluster and the model)."""
        at = (request.cluster, request.model.name)
        found = self._given_in.get(at)
        if found is None:
            self.pending(request.cluster)
            given = self.part(request.cluster).given
            assert given is not None
            stages = self._classes.of(
                self._classes.partials(request, self.inputs.overrides, self.now)
            )
            found = self._given_in[at] = (given, stages)
        return found

    def _current(
        self, groups: Sequence[PodGroup]
    ) -> tuple[int, dict[tuple[str, frozenset[int] | None], str | None]]:
        """What the configuration in force gives each group of one cluster, and its
        pods pending. Decided through one ``Decider`` per model (how the decisions
        depend on the cluster, the evidence they trust and the stage bits are a
        function of the cluster and the model, of the cluster alone where no override
        names a model: found once, not per group), with the read's memo, whose
        decisions a preview of this read shares for its "from" side (``memo``)."""
        inputs, now, memo, narrow = self.inputs, self.now, self._memo, self._inputs_for
        pending = 0
        given: dict[tuple[str, frozenset[int] | None], str | None] = {}
        deciders: dict[str, tuple[Decider, tuple[StageClass, ...]]] = {}
        for group in each_group(groups, self.deadline):
            request = group.request
            if request is None:
                continue
            model = self._classes.model_key(request, inputs.overrides)
            found = deciders.get(model)
            if found is None:

                def narrowed(r: SelectRequest = request) -> DecisionInputs:
                    return inputs if narrow is None else narrow(r, inputs, now)

                found = deciders[model] = (
                    memo.decider(request, inputs, narrowed),
                    self._classes.stages(request, inputs.overrides, now),
                )
            decider, stages = found
            for stage in stages:
                decided = decider(request, group.shape_id, stage)
                backend = None if isinstance(decided, Refusal) else decided.backend.value
                given[(group.shape_id, stage.buckets)] = backend
                for row in group.rows:
                    n = stage.count(row)
                    if n and backend is not None and backend != row.backend:
                        pending += n
        return pending, given
