"""service/json_bytes.py: the bytes parse to what the standard library's encoding
(Starlette's JSONResponse) gives, for every kind of value the answers hold."""

from __future__ import annotations

import enum
import json
import math
from typing import Any

import pytest
from mla_switchboard.service.json_bytes import encode


def stdlib(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


class Colour(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


BODIES: dict[str, Any] = {
    "nested": {"clusters": {"a": {"FLASHINFER": 3}}, "rollouts": [{"x": [1, 2.5, None]}]},
    "non-str keys": {3: "int", 2.5: "float", True: "bool", None: "none", "s": {7: [0]}},
    "floats": [0.1, 1e-05, 1e300, -0.0, 123456789.123456789, 2**53 + 1, 1 / 3],
    "text": {"naïve": "décision, 速い", "quote": 'a "b" \\ c\n\t', "nul": "\x00\x1f"},
    "tuples": {"pair": (1, "two"), "empty": ()},
    "enums": {"colour": Colour.RED, "level": Level.HIGH},
    "scalars": [True, False, None, 0, -1, ""],
    "big int": {"n": 2**70},
    "deep": {"a": [[[[[[[[[[[[{"b": 1}]]]]]]]]]]]]},
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_parses_to_what_the_standard_library_gives(name: str) -> None:
    body = BODIES[name]
    assert json.loads(encode(body)) == json.loads(stdlib(body))


def test_compact_utf8_like_the_json_response() -> None:
    body = {"a": [1, "é"]}
    assert encode(body) == stdlib(body)


def test_a_large_answer_parses_alike() -> None:
    """The shape of a fleet summary at 1,000 clusters."""
    body = {
        "clusters": {f"c-{i:04d}": {"FLASHINFER": i, "CUDNN": i % 7} for i in range(1000)},
        "regret": {f"c-{i:04d}": {"lost_pct": i / 7, "pods": i} for i in range(1000)},
        "rollouts": [{"cluster": f"c-{i:04d}", "percent": 10.0} for i in range(500)],
    }
    assert json.loads(encode(body)) == json.loads(stdlib(body))


def test_what_neither_encodes_is_refused_as_before() -> None:
    with pytest.raises(TypeError):
        encode({"s": {1, 2}})
    with pytest.raises(TypeError):
        encode({object(): 1})


def test_a_non_finite_float_is_null_where_the_standard_library_refuses() -> None:
    with pytest.raises(ValueError):
        stdlib({"x": math.nan})
    assert json.loads(encode({"x": math.nan, "y": math.inf})) == {"x": None, "y": None}
