"""A staged override's rollout is validated field by field: every bad one is a 422 naming
the field (the app in this process; the rollouts themselves are tested on two real
replicas in tests/service/test_rollouts.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest


@pytest.mark.parametrize(
    ("rollout", "field"),
    [
        ({"percent": 0}, "percent"),
        ({"percent": 101}, "percent"),
        ({"percent": "10"}, "percent"),
        ({"percent": 10.5}, "percent"),
        ({"percent": True}, "percent"),
        ({}, "percent"),
        ({"percent": 10, "max_failures": 0}, "max_failures"),
        ({"percent": 10, "max_slowdown_pct": -1}, "max_slowdown_pct"),
        ({"percent": 10, "max_slowdown_pct": "5"}, "max_slowdown_pct"),
        ({"percent": 10, "steps": [10, 50], "step_every": "30x"}, "step_every"),
        ({"percent": 10, "steps": [50, 10], "step_every": "30m"}, "rollout"),
        ({"percent": 10, "steps": [10, 50]}, "rollout"),
        ({"percent": 10, "steps": [0, 50], "step_every": "1m"}, "steps"),
        ({"percent": 10, "colour": "red"}, "colour"),
    ],
)
def test_bad_rollouts_are_422_naming_the_field(
    shared_inprocess: httpx.Client, rollout: dict[str, Any], field: str
) -> None:
    r = shared_inprocess.put(
        "/v1/overrides/ro-bad",
        json={"note": "staged", "force": "FLASHINFER", "rollout": rollout},
    )
    assert r.status_code == 422, r.text
    assert any(field in [str(x) for x in e["loc"]] for e in r.json()["detail"]), r.json()
