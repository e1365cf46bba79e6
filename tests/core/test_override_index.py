"""The overrides in force, indexed by cluster: a request reads the fleet's and its own
cluster's, never the others', and gets exactly what a scan of them all would give."""

from __future__ import annotations

import pickle
import random
from dataclasses import replace
from datetime import timedelta

import pytest
from mla_switchboard.core.evaluator import (
    DecisionInputs,
    OverrideSet,
    applicable_overrides,
    assess,
    decide,
    decision_key,
    in_stage,
)
from mla_switchboard.core.schemas import SEED_RULES, Override

from tests.core.conftest import NOW, override, request

FLEET_DENY = override("*", deny=["TRTLLM_RAGGED"], note="fleet")
EAST = override("east", force="FLASHINFER", note="east")
WEST = override("west", deny=["FLASH_ATTN"], note="west")
FLEET_MEASURED = override("*", policy="measured", note="fleet measured")
STAGED_EAST = override("east", deny=["CUDNN"], rollout={"percent": 30, "id": "r-east"})
STAGED_FLEET = override("*", deny=["FLASHINFER"], rollout={"percent": 20, "id": "r-fleet"})
HALTED_WEST = override(
    "west", deny=["CUDNN"], rollout={"percent": 30, "id": "r-west", "state": "halted"}
)


@pytest.mark.parametrize(
    ("overrides", "cluster", "expected"),
    [
        ((), "east", ()),
        ((EAST,), "east", (EAST,)),
        ((EAST,), "west", ()),
        ((FLEET_DENY,), "west", (FLEET_DENY,)),
        # the fleet's first, each part in the order of the set
        ((EAST, FLEET_DENY, WEST), "east", (FLEET_DENY, EAST)),
        ((EAST, FLEET_DENY, WEST), "west", (FLEET_DENY, WEST)),
        ((EAST, FLEET_DENY, WEST, FLEET_MEASURED), "east", (FLEET_DENY, FLEET_MEASURED, EAST)),
        ((EAST, FLEET_DENY, WEST), "north", (FLEET_DENY,)),
        # the fleet's own scope: the fleet's overrides, once
        ((EAST, FLEET_DENY), "*", (FLEET_DENY,)),
    ],
)
def test_for_cluster_is_the_fleets_then_the_clusters_own(
    overrides: tuple[Override, ...], cluster: str, expected: tuple[Override, ...]
) -> None:
    found = OverrideSet(overrides).for_cluster(cluster)
    assert found == expected
    assert all(a is b for a, b in zip(found, expected, strict=True))


@pytest.mark.parametrize(
    ("overrides", "cluster", "expected"),
    [
        ((EAST, WEST), "east", ()),
        ((STAGED_EAST, WEST), "east", (STAGED_EAST,)),
        ((STAGED_EAST, WEST), "west", ()),
        ((STAGED_EAST, STAGED_FLEET), "east", (STAGED_FLEET, STAGED_EAST)),
        ((STAGED_EAST, STAGED_FLEET), "west", (STAGED_FLEET,)),
        ((HALTED_WEST,), "west", ()),  # halted: no stage to be in
    ],
)
def test_staged_for_is_the_partial_rollouts_among_them(
    overrides: tuple[Override, ...], cluster: str, expected: tuple[Override, ...]
) -> None:
    inputs = DecisionInputs(SEED_RULES, overrides)
    assert inputs.staged_for(cluster) == expected
    assert inputs.override_set.staged_for(cluster) == expected


def test_the_set_is_the_tuple_it_holds() -> None:
    overrides = (EAST, FLEET_DENY, WEST)
    s = OverrideSet(overrides)
    assert s == overrides and len(s) == 3 and s.position(WEST) == 2
    assert list(s) == list(overrides)
    assert s.own("east") == (EAST,) and s.own("*") == (FLEET_DENY,) and s.own("x") == ()
    assert OverrideSet.of(s) is s
    assert pickle.loads(pickle.dumps(s)) == overrides
    assert OverrideSet() == ()


def test_inputs_hold_an_indexed_set_and_replace_keeps_it() -> None:
    """``dataclasses.replace`` (a decision's evidence is narrowed that way) carries the
    set and its index; new overrides make a new set; a list given becomes one."""
    inputs = DecisionInputs(SEED_RULES, [EAST, WEST])  # type: ignore[arg-type]
    assert isinstance(inputs.overrides, OverrideSet)
    assert inputs.overrides == (EAST, WEST)
    assert inputs == DecisionInputs(SEED_RULES, (EAST, WEST))  # equal to the plain tuple's
    inputs.overrides_for("east")
    narrowed = replace(inputs, tag=(2, 3))
    assert narrowed.overrides is inputs.overrides
    changed = replace(inputs, overrides=(WEST,))
    assert isinstance(changed.overrides, OverrideSet)
    assert changed.overrides_for("east") == () and changed.overrides_for("west") == (WEST,)


def _scan(overrides: tuple[Override, ...]) -> tuple[Override, ...]:
    """The same overrides as a plain tuple: ``applicable_overrides`` scans them all."""
    return tuple(overrides)


CLUSTERS = ["east", "west", "north", "south", "*"]
MODELS = ["deepseek-ai/DeepSeek-R1", "moonshotai/Kimi-K2", "zai-org/GLM-5"]


def _random_overrides(rng: random.Random) -> tuple[Override, ...]:
    out = []
    for i in range(rng.randint(0, 12)):
        spec: dict[str, object] = {"note": f"o{i}"}
        kind = rng.randrange(6)
        if kind == 0:
            spec["deny"] = [rng.choice(["FLASH_ATTN", "FLASHINFER", "CUDNN"])]
        elif kind == 1:
            spec["force"] = rng.choice(["FLASHINFER", "CUDNN", "TORCH_SDPA"])
        elif kind == 2:
            spec["policy"] = rng.choice(["measured", "engine-default", "priority"])
        elif kind == 3:
            spec["deny"] = ["CUDNN"]
            spec["rollout"] = {"percent": rng.choice([10, 50, 100]), "id": f"r{i}"}
        elif kind == 4:
            spec["force"] = "FLASHINFER"
            spec["model"] = rng.choice(["deepseek-ai/*", "moonshotai/*"])
        else:
            spec["deny"] = ["FLASHINFER"]
            spec["expires_at"] = NOW + timedelta(minutes=rng.choice([-5, 5]))
        out.append(override(rng.choice(CLUSTERS), **spec))
    return tuple(out)


@pytest.mark.parametrize("seed", range(40))
def test_the_index_gives_what_a_scan_of_every_override_gives(seed: int) -> None:
    """For random override sets and requests: the overrides that apply, the decision
    key, the assessment and the decision are those a scan of every override gives."""
    rng = random.Random(seed)
    overrides = _random_overrides(rng)
    indexed = DecisionInputs(SEED_RULES, overrides)
    for i in range(12):
        cluster = rng.choice(CLUSTERS[:-1])
        req = request(
            rng.choice([(9, 0), (10, 0), (8, 0)]),
            cluster=cluster,
            pod=f"pod-{i}",
            model=rng.choice(MODELS),
        )
        scanned = applicable_overrides(req, _scan(overrides), NOW)
        assert applicable_overrides(req, indexed.overrides, NOW) == scanned
        assert applicable_overrides(req, indexed.override_set, NOW) == scanned
        assert decision_key(req, indexed.overrides) == decision_key(req, _scan(overrides))
        # the selector's key: the fleet's staged overrides, then the cluster's
        fleet_first = [o for o in overrides if o.cluster == "*"] + [
            o for o in overrides if o.cluster == cluster
        ]
        assert decision_key(req, indexed.staged_for(cluster)) == decision_key(req, fleet_first)
        active = [o for o in scanned if o.rollout is None or in_stage(req, o)]
        assert list(assess(req, indexed, NOW).active) == active


def test_an_assessments_reasons_are_its_own() -> None:
    """The spec and engine reasons of a description are worked out once and shared;
    each assessment gets its own lists (a deny appends to them)."""
    req = request((9, 0))
    denied = DecisionInputs(SEED_RULES, (override("*", deny=["FLASH_ATTN"], note="no"),))
    plain = DecisionInputs(SEED_RULES)

    def said(inputs: DecisionInputs, text: str) -> bool:
        return any(text in r for rs in assess(req, inputs, NOW).reasons.values() for r in rs)

    assert said(denied, "denied by")
    assert not said(plain, "denied by")
    mine = assess(req, plain, NOW)
    for reasons in mine.reasons.values():
        reasons.append("scribbled")
    assert not said(plain, "scribbled")
    assert decide(req, plain, now=NOW) == decide(req, plain, now=NOW)
