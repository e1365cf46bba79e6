"""What a cluster's own override does to a decision, without the cluster's name.

A fleet read decides each group (shape, stage class) of each cluster. Most clusters'
overrides act alike on a shape: a thousand clusters each with "deny CUDNN" give every
pod of a shape the same backend for the same reasons, and differ only in the words
that name the override ("denied by override east: its note"). So a decision is keyed
by the override's *effect* (force, deny, policy, trust scope, rollout state and
percent, and whether the pods are in its stage) and made once, for a stand-in: the
override with a cluster name, note and revision no caller can know, decided for a
request of that stand-in cluster. Its words are then the stand-in's, and
:func:`words` renders them for each cluster's own override: a cluster is still named
only in its own answer.

Where a decision's words or its evidence depend on more than that, it is decided for
the cluster itself (its name is the key): a rule set of the cluster's own, policy
``measured`` on evidence the cluster holds for the pods' situation (what it ranks, and
the pods an exclusion names, are the cluster's; where it is too thin to rank and
holds no failure, every such cluster decides alike), a halted rollout of its own (the
cause quoted names its pods), or more than one override of its own.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from mla_switchboard.core.evaluator import (
    UNKNOWN,
    Assessment,
    Decision,
    DecisionInputs,
    Refusal,
    Unknown,
    applicable_overrides,
    assess,
    decide,
    in_stage,
    request_traits,
)
from mla_switchboard.core.evidence import Situation
from mla_switchboard.core.schemas import FLEET, Override, SelectRequest
from mla_switchboard.core.stages import stage_bucket
from mla_switchboard.service.priority import release_later

_TOKEN = secrets.token_hex(8)
STAND_IN = f"stand-in-{_TOKEN}"
"""The stand-in's cluster name: one no caller can know (and so name a cluster, or write
in a note, that a rendering would take for it). Printable, so a message that quotes a
list of reasons (``repr``) quotes it as it is."""
STAND_IN_NOTE = f"note-{_TOKEN}"
STAND_IN_REVISION = -1
_REVISED = f"{STAND_IN} rev {STAND_IN_REVISION}"
"""How the evaluator's stage messages name the stand-in with its revision."""

Effect = tuple[object, ...]


def effect_of(o: Override) -> Effect | None:
    """What ``o`` does to a decision besides being applicable (its model glob and
    expiry decide that, per request): None when its words depend on its cluster
    beyond its name, note and revision (a halted rollout quotes its cause; a message
    that quotes a list of reasons escapes a note with quotes or backslashes)."""
    r = o.rollout
    if r is not None and r.state == "halted":
        return None
    if not _plain(o.note):
        return None
    trust = None if o.trust_clusters is None else tuple(o.trust_clusters)
    rollout = None if r is None else (r.state, r.percent)
    return (o.force, tuple(b.value for b in o.deny), o.policy, trust, rollout)


def _plain(text: str) -> bool:
    """Whether ``repr`` quotes ``text`` as it is, between single quotes."""
    return "'" not in text and '"' not in text and repr(text)[1:-1] == text


@dataclass(frozen=True)
class Dependence:
    """What a decision of one cluster's pods of a shape depends on besides the shape's
    description and the stage bucket.

    ``key``: "" when every cluster decides it alike (only fleet overrides apply), the
    cluster's name when it is decided for the cluster itself, else the effect of the
    cluster's own override; ``fleet``: the fleet overrides that apply (by identity:
    one set of inputs holds one object each); ``staged``: the staged overrides that
    apply (the pods' stage bits: :meth:`bits`); ``own``: the override a stand-in
    stands for; ``evidence``: whether the decision may read evidence (policy
    ``measured``: then it depends on the shape's situation too)."""

    key: object
    fleet: tuple[int, ...]
    staged: tuple[Override, ...]
    own: Override | None = None
    evidence: bool = False
    unmeasured: Dependence | None = None
    """How the decision is shared where the cluster's own evidence says nothing for
    the pods' situation (policy ``measured`` on the cluster's own evidence, too thin to
    rank and with no failure: ``groups.silent``): every such cluster decides it
    alike, as on no evidence."""

    def bits(self, request: SelectRequest, bucket: int | None) -> tuple[bool, ...]:
        """Whether pods in ``bucket`` are in the stage of each staged override."""
        return tuple(in_stage(request, o, bucket) for o in self.staged)

    def decided_as(self, bits: tuple[bool, ...]) -> object:
        """``key`` for a decision of pods whose stage bits are ``bits``: where they are
        outside the stage of the cluster's own override (a partial rollout, the last
        staged one: a cluster's own come after the fleet's), that override applies to
        none of them, so its deny, force and policy change nothing and only its
        rollout's state and percent are read (the stage message; its name, note and
        revision are the stand-in's, rendered per cluster). Clusters whose staged
        overrides differ in effect then share the decisions of their pods outside the
        stage: the most pods of a 10 % rollout."""
        own = self.own
        key = self.key
        if own is None or not bits or bits[-1] or not (type(key) is tuple and key[0] == "effect"):
            return key
        r = own.rollout
        if r is None or self.staged[-1] is not own or r.state != "active" or r.percent >= 100:
            return key
        return ("outside", r.state, r.percent)


def dependence(
    request: SelectRequest,
    inputs: DecisionInputs,
    now: datetime,
    *,
    exact: bool = False,
    applicable: Sequence[Override] | None = None,
) -> Dependence:
    """How a decision of ``request`` under ``inputs`` is shared (module docstring).
    ``exact``: never through a stand-in (the cluster's own override differs between
    the two sides of a preview: its words must not be rendered from one of them).
    ``applicable``: ``applicable_overrides`` of ``request`` when the caller has it."""
    cluster = request.cluster
    if applicable is None:
        applicable = applicable_overrides(request, inputs.override_set, now)
    fleet = tuple(id(o) for o in applicable if o.cluster == FLEET)
    staged = tuple(o for o in applicable if o.rollout is not None)
    measured = any(o.policy == "measured" for o in applicable)
    if cluster in inputs.rules.clusters:
        return Dependence(cluster, fleet, staged, None, measured)
    own = [o for o in applicable if o.cluster == cluster]
    trusted = any(o.trust_clusters is not None for o in applicable)
    if not own:
        if not measured or trusted:
            return Dependence("", fleet, staged, None, measured)
        unmeasured = Dependence(UNMEASURED, fleet, staged, None, True)
        return Dependence(cluster, fleet, staged, None, True, unmeasured)
    alone = len(inputs.override_set.own(cluster)) == 1  # the one :func:`words` renders
    effect = effect_of(own[0]) if alone and not exact else None
    if effect is None:
        return Dependence(cluster, fleet, staged, None, measured)
    if not measured:
        return Dependence(("effect", effect), fleet, staged, own[0], False)
    unmeasured = None
    if not trusted:  # the cluster's own evidence: alike where it holds nothing
        unmeasured = Dependence((UNMEASURED, effect), fleet, staged, own[0], True)
    return Dependence(cluster, fleet, staged, None, True, unmeasured)


UNMEASURED = "unmeasured"
"""The key part of decisions on a cluster's own evidence where it holds nothing."""


def description(request: SelectRequest) -> tuple[object, ...]:
    """What a decision reads of a request besides its cluster, pod and overrides'
    applicability (``core/evaluator.py``): the device's capability, the model's
    dimensions, the dtype, packages, engine, and what it asks for. Shapes that differ
    only in the GPU's or the model's name are decided alike unless evidence is read
    (the situation names them)."""
    e = request.engine
    return (
        *request_traits(request),
        request.requested_backend,
        request.strict,
        None if e is None else (e.name, e.version),
    )


class StandIns:
    """The stand-ins of one fleet read (:func:`_stand_in`), made once per override,
    inputs and request: a read makes many decisions for each (held with them: an id
    is only theirs while they are alive)."""

    def __init__(self) -> None:
        # a stand-in request per group: freed gradually after a fleet read, like its
        # decisions (service/priority.py), not in one go when the read returns
        self._overrides: dict[int, tuple[Override, Override]] = release_later({})
        self._inputs: dict[tuple[int, int], tuple[DecisionInputs, Override, DecisionInputs]] = (
            release_later({})
        )
        self._requests: dict[int, tuple[SelectRequest, SelectRequest]] = release_later({})

    def of(
        self, request: SelectRequest, inputs: DecisionInputs, own: Override
    ) -> tuple[SelectRequest, DecisionInputs]:
        """``_stand_in(request, inputs, own)``, each part made once."""
        kept = self._requests.get(id(request))
        if kept is None or kept[0] is not request:
            kept = self._requests[id(request)] = (request, _stand_in_request(request))
        found = self._inputs.get((id(inputs), id(own)))
        if found is None or found[0] is not inputs or found[1] is not own:
            made = self._overrides.get(id(own))
            if made is None or made[0] is not own:
                made = self._overrides[id(own)] = (own, _stand_in_override(own))
            found = (inputs, own, _stand_in_inputs(inputs, made[1]))
            self._inputs[(id(inputs), id(own))] = found
        return kept[1], found[2]


def _stand_in_override(own: Override) -> Override:
    """``own`` (the cluster's override) in the stand-in's name."""
    return own.model_copy(
        update={"cluster": STAND_IN, "note": STAND_IN_NOTE, "revision": STAND_IN_REVISION}
    )


def _stand_in_request(request: SelectRequest) -> SelectRequest:
    return request.model_copy(update={"cluster": STAND_IN})


def _stand_in_inputs(inputs: DecisionInputs, stand: Override) -> DecisionInputs:
    """``inputs`` with the fleet's overrides and the stand-in ``stand`` only."""
    return replace(inputs, overrides=(*inputs.override_set.own(FLEET), stand))


def _stand_in(
    request: SelectRequest, inputs: DecisionInputs, own: Override
) -> tuple[SelectRequest, DecisionInputs]:
    """``request`` and ``inputs`` with ``own`` (the cluster's override) in the
    stand-in's name: the fleet's overrides and the stand-in only."""
    stand = _stand_in_override(own)
    return _stand_in_request(request), _stand_in_inputs(inputs, stand)


def _pod_bucket(request: SelectRequest, bucket: int | None) -> int | None:
    """The bucket the evaluator would take for the pods (it hashes the request's own
    cluster and pod when none is given: the stand-in's cluster must not change it)."""
    return bucket if bucket is not None else stage_bucket(request.cluster, request.pod)


def decide_shared(
    request: SelectRequest,
    narrowed: DecisionInputs,
    now: datetime,
    bucket: int | None,
    depends: Dependence,
    situation: Situation | Unknown | None = UNKNOWN,
    stand_ins: StandIns | None = None,
) -> Decision | Refusal:
    """``decide`` of ``request`` as ``depends`` shares it: for the stand-in when
    there is one (its words are the stand-in's: :func:`words`). ``situation``: the
    request's, when the caller has it (a stand-in's is the same: a situation names
    no cluster); ``stand_ins``: the read's, when it keeps them."""
    if depends.own is None:
        return decide(request, narrowed, now=now, bucket=bucket, situation=situation)
    stand_request, stand_inputs = (stand_ins or StandIns()).of(request, narrowed, depends.own)
    return decide(
        stand_request,
        stand_inputs,
        now=now,
        bucket=_pod_bucket(request, bucket),
        situation=situation,
    )


def assess_shared(
    request: SelectRequest,
    narrowed: DecisionInputs,
    now: datetime,
    bucket: int | None,
    depends: Dependence,
    situation: Situation | Unknown | None = UNKNOWN,
    stand_ins: StandIns | None = None,
) -> Assessment:
    """``assess`` as :func:`decide_shared` shares it (validity, policy, situation and
    exclusions are the same for the stand-in; only its override's words differ)."""
    if depends.own is None:
        return assess(request, narrowed, now, bucket, situation)
    stand_request, stand_inputs = (stand_ins or StandIns()).of(request, narrowed, depends.own)
    return assess(stand_request, stand_inputs, now, _pod_bucket(request, bucket), situation)


def words(text: str, own: Sequence[Override]) -> str:
    """``text`` of a shared decision as the cluster whose own override is ``own``
    reads it: the stand-in's name, note and revision are that override's. Text of a
    decision made for the cluster itself, or of no override of its own, holds no
    stand-in and is returned as it is."""
    if STAND_IN not in text and STAND_IN_NOTE not in text:
        return text
    o = own[0]
    text = text.replace(_REVISED, f"{o.cluster} rev {o.revision}")
    return text.replace(STAND_IN_NOTE, o.note).replace(STAND_IN, o.cluster)
