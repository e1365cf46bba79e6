"""The hot path of ``/v1/select``: decide from the snapshot in memory, with a cache.

Thousands of pods of one rollout send the same description apart from their names,
so decisions are cached by everything the evaluator reads (``decision_key``: all but
node and pod) for one configuration version, until the next override expires. A
cached decision is also serialised once: the answer is a template into which each
request's decision id is put.

Evidence arrives all the time (every benchmark report), yet most decisions never read
it: only policy ``measured`` does, and then only its own situation. So new evidence
does not empty the cache. A decision that read evidence is kept with a *stamp*: the
index it was given, the situation and that situation's published statistics (an
immutable mapping the index replaces whenever the situation changes); a hit whose
statistics were replaced since is decided again. What a stamp cannot see (an index
replaced or added, evidence expiring) moves ``DecisionInputs.evidence_generation``,
which empties the cache as a new configuration does.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.core.evaluator import Decision, DecisionInputs, Refusal, decide, decision_key
from mla_switchboard.core.evidence import EvidenceIndex, Group, Situation, situation_of
from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.service.store.shapes import Shape, shape_of

CACHE_SIZE = 4096
InputsFor = Callable[[SelectRequest, DecisionInputs, datetime], DecisionInputs]
ID_PLACEHOLDER = "@@DECISION_ID@@"
Stamp = tuple[EvidenceIndex, Situation, Group]
"""What a measured decision read: the index, the situation, its statistics then."""


_RECORDED = b',"recorded":true'
_NOT_RECORDED = b',"recorded":false'


@dataclass(frozen=True)
class Rendered:
    """A decision serialised once: the response template, its ETag, the stored answer
    (without decision id) with the content hash it is filed under, and the shape of the
    requests it answers (every request with this cache key has the same shape).

    The template is also kept as the UTF-8 bytes before and after the decision id,
    and the ETag as header bytes, so that an answer costs one concatenation."""

    decision: Decision
    template: str
    etag: str
    answer_id: str
    answer_json: str
    shape: Shape
    backend: str  # decision.backend's value, read per answer
    etag_header: bytes
    body_head: bytes
    body_tail: bytes

    @classmethod
    def of(cls, decision: Decision, rules_revision: int, request: SelectRequest) -> Rendered:
        response = decision.to_response(rules_revision=rules_revision, decision_id=ID_PLACEHOLDER)
        template = response.model_dump_json()
        digest = hashlib.blake2b(template.encode(), digest_size=12).hexdigest()
        # the top-level field, found as JSON syntax: text from a request is escaped
        # inside its string, so it cannot look like a key, and nothing before this
        # field has a key of that name
        field = f',"decision_id":"{ID_PLACEHOLDER}"'
        at = template.index(field) + len(field) - len(ID_PLACEHOLDER) - 1
        head, tail = template[:at], template[at + len(ID_PLACEHOLDER) :]
        return cls(
            decision=decision,
            template=template,
            etag=f'"{digest}"',
            answer_id=digest,
            answer_json=response.model_dump_json(exclude={"decision_id", "recorded"}),
            shape=shape_of(request),
            backend=decision.backend.value,
            etag_header=f'"{digest}"'.encode(),
            body_head=head.encode(),
            body_tail=tail.encode(),
        )

    def body(self, decision_id: bytes) -> bytes:
        """The answer for one decision: the template with its id put in."""
        return self.body_head + decision_id + self.body_tail

    @property
    def dry_body(self) -> bytes:
        """The answer of a decision not recorded (a dry run, or one the recorder could
        not keep): ``decision_id`` is null (the template's quotes around the id go
        with it) and ``recorded`` false (the field after it)."""
        tail = self.body_tail[1:]
        assert tail.startswith(_RECORDED)
        return self.body_head[:-1] + b"null" + _NOT_RECORDED + tail[len(_RECORDED) :]


class Selector:
    def __init__(
        self,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        inputs_for: InputsFor | None = None,
    ) -> None:
        self._clock = clock
        # the inputs one request is decided with (the service narrows the evidence to
        # the clusters that request's policy trusts); a function of the request's
        # cluster and the inputs, so the cache below stays right
        self._inputs_for = inputs_for or (lambda _request, inputs, _now: inputs)
        self._cache: OrderedDict[tuple[Any, ...], tuple[Rendered | Refusal, Stamp | None]] = (
            OrderedDict()
        )
        self._cache_tag: tuple[int, int] = (-1, -1)
        self._valid_until: datetime | None = None
        self.decided = 0  # decisions made (cache misses): what the cache tests count

    def select(self, request: SelectRequest, inputs: DecisionInputs) -> Rendered | Refusal:
        now = self._clock()
        tag = (inputs.tag[0], inputs.evidence_generation)
        if tag != self._cache_tag or (self._valid_until is not None and now >= self._valid_until):
            self._cache.clear()
            self._cache_tag = tag
            upcoming = [
                o.expires_at for o in inputs.overrides if o.expires_at and o.expires_at > now
            ]
            self._valid_until = min(upcoming, default=None)
        key = decision_key(request, inputs.staged_for(request.cluster))
        hit = self._cache.get(key)
        if hit is not None:
            result, stamp = hit
            if stamp is None or stamp[0].group(stamp[1]) is stamp[2]:
                self._cache.move_to_end(key)
                return result
        given = self._inputs_for(request, inputs, now)
        # read before deciding: evidence that lands meanwhile makes the stamp stale
        # (decided again next time), never a stale decision look current
        situation = situation_of(request)
        before = given.evidence.group(situation)
        decided = decide(request, given, now=now)
        self.decided += 1
        result = (
            decided
            if isinstance(decided, Refusal)
            else Rendered.of(decided, inputs.rules.revision or 0, request)
        )
        read = decided.evidence_situation
        self._cache[key] = (result, None if read is None else (given.evidence, read, before))
        self._cache.move_to_end(key)  # a stale hit decided again is as recent as a new one
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return result
