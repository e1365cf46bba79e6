"""Fleet reads by group give exactly what a replay of every single pod gives.

The preview, the regret and the rollout progress take pods by (cluster, shape, stage
class) and decide each group once. The reference here decides every pod one by one
with its own name (the evaluator hashes it into its bucket, as ``/v1/select`` does);
the two must agree on every count for fleets mixing shapes, clusters, staged rollouts
in force and staged rollouts proposed.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from mla_switchboard.core.evaluator import Decision, DecisionInputs, Refusal, decide, in_stage
from mla_switchboard.core.schemas import SEED_RULES, Override, OverrideSpec, rollout_id
from mla_switchboard.service.fleet.groups import FleetSnapshot
from mla_switchboard.service.fleet.preview import replay, why_moved, with_override
from mla_switchboard.service.fleet.progress import progress
from mla_switchboard.service.state import PodState

from tests.core.conftest import NOW, override, request


def staged(cluster: str, percent: int, **effect: object) -> Override:
    spec = OverrideSpec.model_validate({**effect, "note": "x"})
    rid = rollout_id(cluster, spec)
    return override(cluster, **effect, rollout={"percent": percent, "id": rid})


SHAPES = [
    request((9, 0)),
    request((10, 0), device="NVIDIA B200"),
    request((10, 0), device="NVIDIA B200", requested_backend="TRTLLM_RAGGED", strict=True),
    request((8, 0), device="NVIDIA A100", engine=("vllm", "0.33.0")),
    request((9, 0), model="moonshotai/Kimi-K2", dims=(192, 64, 256)),
]


def fleet(seed: int, inputs: DecisionInputs, pods: int = 900) -> list[PodState]:
    """Pods as the store holds them: each with the answer ``inputs`` gave it, and some
    (one in seven) still on what an older configuration gave them."""
    rng = random.Random(seed)
    out = []
    for i in range(pods):
        cluster = rng.choice(["east", "west", "canary"])
        shape = rng.choice(SHAPES)
        r = shape.model_copy(update={"cluster": cluster, "pod": f"{cluster}-{i}", "node": "n"})
        d = decide(r, inputs, now=NOW)
        backend, source = ("FLASH_ATTN", "priority")
        if isinstance(d, Decision):
            backend, source = d.backend.value, d.source
        if i % 7 == 0:
            backend = "CUDNN"  # booted under an older configuration
        out.append(
            PodState(cluster, "n", r.pod or "", f"d{i}", backend, source, r.model_dump_json())
        )
    return out


Reasons = Counter[tuple[str, str, str, tuple[str, ...]]]


def one_by_one(
    pods: list[PodState], current: DecisionInputs, proposed: DecisionInputs
) -> tuple[Counter[tuple[str, str, str]], Counter[tuple[str, str]], int, Reasons]:
    changes: Counter[tuple[str, str, str]] = Counter()
    invalid: Counter[tuple[str, str]] = Counter()
    reasons: Reasons = Counter()
    pending = 0
    for p in pods:
        r = p.request
        assert r is not None
        before, after = decide(r, current, now=NOW), decide(r, proposed, now=NOW)
        was = p.backend if isinstance(before, Refusal) else before.backend.value
        pending += was != p.backend
        if isinstance(after, Refusal):
            if not isinstance(before, Refusal):
                invalid[(p.cluster, was)] += 1
        elif after.backend.value != was:
            changes[(p.cluster, was, after.backend.value)] += 1
            reasons[(p.cluster, was, after.backend.value, why_moved(before, after, was))] += 1
    return changes, invalid, pending, reasons


def assert_moves_as_one_by_one(
    shown: dict[str, Any], changes: Counter[tuple[str, str, str]], reasons: Reasons
) -> None:
    """A replay's changes and each one's reasons are what deciding every pod alone
    gives (``one_by_one``), under the group each pod was counted in."""
    assert {(c["cluster"], c["from"], c["to"]): c["pods"] for c in shown["changes"]} == changes
    assert {
        (c["cluster"], c["from"], c["to"], tuple(r["why"])): r["pods"]
        for c in shown["changes"]
        for r in c["reasons"]
    } == reasons


CURRENT = [
    (),
    (staged("east", 30, force="FLASHINFER"),),
    (staged("*", 20, deny=["TRTLLM_RAGGED"]), staged("west", 50, force="CUDNN")),
]
PROPOSED = [
    ("east", staged("east", 60, force="FLASHINFER")),  # a promotion of the same rollout
    ("*", staged("*", 10, force="FLASHINFER")),
    ("canary", override("canary", deny=["FLASH_ATTN"])),
    ("west", None),  # deleting it
]


@pytest.mark.parametrize("current_overrides", CURRENT)
@pytest.mark.parametrize(("scope", "proposal"), PROPOSED)
def test_the_preview_by_group_equals_the_replay_of_every_pod(
    current_overrides: tuple[Override, ...], scope: str, proposal: Override | None
) -> None:
    current = DecisionInputs(SEED_RULES, current_overrides)
    proposed = replace(current, overrides=tuple(with_override(current.overrides, scope, proposal)))
    pods = fleet(len(current_overrides) * 10 + len(scope), current)
    got = replay(FleetSnapshot.of_pods(pods), current, proposed, now=NOW)
    changes, invalid, pending, reasons = one_by_one(pods, current, proposed)
    shown = got.model_dump()
    assert got.pods_total == len(pods)
    assert got.pods_pending == pending
    assert_moves_as_one_by_one(shown, changes, reasons)
    assert _summed(shown["invalid"]) == invalid
    assert got.pods_changed == sum(changes.values())
    if proposal is not None or any(o.cluster == scope for o in current_overrides):
        assert got.pods_changed + got.pods_invalid > 0  # the change does something


def _summed(rows: list[dict[str, object]]) -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for row in rows:
        out[(str(row["cluster"]), str(row["from"]))] += int(row["pods"])  # type: ignore[call-overload]
    return out


@pytest.mark.parametrize("current_overrides", CURRENT[1:])
def test_rollout_progress_by_group_equals_counting_every_pod(
    current_overrides: tuple[Override, ...],
) -> None:
    inputs = DecisionInputs(SEED_RULES, current_overrides)
    pods = fleet(7, inputs)
    got = {p["cluster"]: p for p in progress(FleetSnapshot.of_pods(pods), inputs, now=NOW)}
    for o in current_overrides:
        scoped = [p for p in pods if o.cluster in ("*", p.cluster)]
        inside = [p for p in scoped if in_stage(p.request, o)]  # type: ignore[arg-type]
        booted = 0
        for p in inside:
            d = decide(p.request, inputs, now=NOW)  # type: ignore[arg-type]
            booted += isinstance(d, Decision) and d.backend.value == p.backend
        row = got[o.cluster]
        assert (row["pods_in_scope"], row["pods_in_stage"], row["pods_booted_with_it"]) == (
            len(scoped),
            len(inside),
            booted,
        )
        assert 0 < len(inside) < len(scoped)
