"""A request's *shape*: everything a pod sent except its cluster, node and name.

A fleet is few distinct situations times many pods: thousands of pods of one
deployment send the same description and differ only in their names. The store keeps
each shape once (``shapes``), decisions point at it, and the fleet's counts are kept
per (cluster, shape): reading what the fleet runs, replaying it under a proposed
change or estimating its regret then costs one evaluation per shape, not per pod.

The id is a hash of the shape's canonical JSON (sorted keys, package order ignored),
so equal descriptions share one id on every replica.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mla_switchboard.core.evidence import Situation, situation_of
from mla_switchboard.core.schemas import SelectRequest
from pydantic import ValidationError

__all__ = [
    "NAMING_FIELDS",
    "Shape",
    "request_from_shape",
    "shape_of",
    "shape_of_json",
    "shape_request",
    "shape_situation",
]

NAMING_FIELDS = frozenset({"cluster", "node", "pod"})
"""What names a pod rather than describes it: kept on the decision row, not in the shape."""


@dataclass(frozen=True)
class Shape:
    id: str
    json: str


def shape_of(request: SelectRequest) -> Shape:
    """The shape of ``request`` and its id."""
    return _canonical(request.model_dump(mode="json", exclude=NAMING_FIELDS))


def shape_of_json(request_json: str) -> Shape:
    """The shape of a request stored as JSON text (a whole dump of the request, as the
    decision log held it before shapes): the same id as ``shape_of`` of that request.
    Text that does not parse as an object is kept whole, as a shape nothing replays."""
    try:
        body = json.loads(request_json)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return _canonical({"unparsed": request_json})
    return _canonical({k: v for k, v in body.items() if k not in NAMING_FIELDS})


def _canonical(body: dict[str, Any]) -> Shape:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return Shape(hashlib.blake2b(text.encode(), digest_size=12).hexdigest(), text)


def request_from_shape(
    shape_json: str, cluster: str, node: str | None = None, pod: str | None = None
) -> dict[str, Any]:
    """The request a pod sent, as a JSON-ready dict (the decision log shows it)."""
    return {"cluster": cluster, "node": node, "pod": pod, **json.loads(shape_json)}


@lru_cache(maxsize=65_536)
def _base(shape_json: str) -> SelectRequest | None:
    try:
        return SelectRequest.model_validate({"cluster": "x", **json.loads(shape_json)})
    except (ValidationError, ValueError):
        return None


def shape_request(shape_json: str, cluster: str) -> SelectRequest | None:
    """A pod of this shape in ``cluster``, without a name (the stage bucket is given to
    the evaluator apart): what a replay decides. None when the shape was stored under
    an older schema and no longer validates. Parsed once per shape, then copied."""
    base = _base(shape_json)
    return None if base is None else base.model_copy(update={"cluster": cluster})


@lru_cache(maxsize=65_536)
def shape_situation(shape_json: str) -> Situation | None:
    """The evidence situation of every request of this shape (a situation names no
    cluster, node or pod), worked out once per shape: a benchmark report asks it of
    the pod's recent decisions, and a fleet has few shapes. None as for
    :func:`shape_request`, or when the shape has no exact situation."""
    base = _base(shape_json)
    return None if base is None else situation_of(base)
