"""Why a preview's pods move, as a unit table: each change names what the proposal does
to them, read off the very decisions the replay made (no HTTP, no store)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from mla_switchboard.core.evaluator import Decision, DecisionInputs, decide
from mla_switchboard.core.evidence import EvidenceIndex, Observation, situation_of
from mla_switchboard.core.schemas import SEED_RULES, Override, OverrideSpec, rollout_id
from mla_switchboard.service.fleet.groups import FleetSnapshot
from mla_switchboard.service.fleet.preview import replay, with_override
from mla_switchboard.service.state import PodState

from tests.core.conftest import NOW, override, request

B200 = request((10, 0), device="NVIDIA B200", cluster="east")
H200 = request((9, 0), device="NVIDIA H200", cluster="east")
TRT_FIRST = (
    "Using TRTLLM_RAGGED: first valid backend in the priority list (fleet rule for "
    "capability 10: TRTLLM_RAGGED, FLASHINFER, CUDNN, FLASH_ATTN)."
)
FI_SECOND = TRT_FIRST.replace("Using TRTLLM_RAGGED", "Using FLASHINFER")


def staged(percent: int, state: str = "active", **effect: object) -> Override:
    spec = OverrideSpec.model_validate({**effect, "note": "canary"})
    rollout = {"percent": percent, "id": rollout_id("east", spec), "state": state}
    return override("east", **effect, note="canary", rollout=rollout)


def pods_of(req: object, inputs: DecisionInputs, n: int = 40) -> list[PodState]:
    out = []
    for i in range(n):
        r = req.model_copy(update={"pod": f"east-{i}"})  # type: ignore[attr-defined]
        d = decide(r, inputs, now=NOW)
        assert isinstance(d, Decision)
        out.append(PodState("east", "n", f"east-{i}", f"d{i}", d.backend.value, d.source,
                            r.model_dump_json()))  # fmt: skip
    return out


def reasons(
    current: DecisionInputs, scope: str, proposal: Override | None, req: object = B200
) -> dict[tuple[str, str], list[tuple[int, list[str]]]]:
    """(from, to) -> [(pods, why), ...] of a preview of ``proposal`` on 40 pods."""
    proposed = replace(current, overrides=tuple(with_override(current.overrides, scope, proposal)))
    p = replay(FleetSnapshot.of_pods(pods_of(req, current)), current, proposed, now=NOW)
    out = {}
    for c in p.model_dump()["changes"]:
        assert sum(r["pods"] for r in c["reasons"]) == c["pods"], c
        out[(c["from"], c["to"])] = [(r["pods"], r["why"]) for r in c["reasons"]]
    return out


def evidence(**tflops: float) -> EvidenceIndex:
    situation = situation_of(H200)
    assert situation is not None
    return EvidenceIndex(
        [
            Observation(situation, b, f"bench-{i % 2}", t, ok=True, cluster="bench", at=NOW)
            for b, t in tflops.items()
            for i in range(3)
        ]
    )


SEED = DecisionInputs(SEED_RULES)
DENY = override("east", deny=["TRTLLM_RAGGED"], note="INC-4711 segfault")
FORCE = override("east", force="CUDNN", note="try cuDNN")


@pytest.mark.parametrize(
    ("current", "scope", "proposal", "move", "why"),
    [
        pytest.param(
            SEED, "east", DENY, ("TRTLLM_RAGGED", "FLASHINFER"),
            ["TRTLLM_RAGGED: denied by override east: INC-4711 segfault", FI_SECOND],
            id="deny",
        ),
        pytest.param(
            SEED, "east", FORCE, ("TRTLLM_RAGGED", "CUDNN"),
            ["Forced to CUDNN by override east: try cuDNN"],
            id="force",
        ),
        pytest.param(
            replace(SEED, overrides=(DENY,)), "east", None, ("FLASHINFER", "TRTLLM_RAGGED"),
            ["Override east no longer applies.", TRT_FIRST],
            id="removed",
        ),
        pytest.param(
            replace(SEED, overrides=(override("*", deny=["TRTLLM_RAGGED"], note="fleet"),)),
            "*", None, ("FLASHINFER", "TRTLLM_RAGGED"),
            ["Fleet override (*) no longer applies.", TRT_FIRST],
            id="fleet-removed",
        ),
        pytest.param(
            SEED, "east", override("east", policy="engine-default", note="vLLM's own"),
            ("TRTLLM_RAGGED", "FLASH_ATTN"),
            ["Using FLASH_ATTN: first valid backend in the priority list (vLLM 0.33.0's own "
             "default order: FLASH_ATTN, TRTLLM_RAGGED, FLASHINFER, TOKENSPEED_MLA)."],
            id="engine-default",
        ),
    ],
)  # fmt: skip
def test_each_change_says_why(
    current: DecisionInputs,
    scope: str,
    proposal: Override | None,
    move: tuple[str, str],
    why: list[str],
) -> None:
    vllm = request((10, 0), device="NVIDIA B200", cluster="east", engine=("vllm", "0.33.0"))
    got = reasons(current, scope, proposal, vllm if "vLLM" in why[-1] else B200)
    assert got == {move: [(40, why)]}


def test_measured_names_the_faster_backend() -> None:
    current = replace(SEED, evidence=evidence(FLASHINFER=600, FLASH_ATTN=200))
    got = reasons(current, "east", override("east", policy="measured", note="m"), H200)
    assert got == {
        ("FLASH_ATTN", "FLASHINFER"): [
            (
                40,
                [
                    "Using FLASHINFER: fastest correct backend measured for this device, "
                    "dims, dtype and engine (600 TFLOP/s median over 3 samples from 2 pods)."
                ],
            )
        ]
    }


def test_a_stage_says_which_pods_are_in_it_and_a_halt_why_they_go_back() -> None:
    got = reasons(SEED, "east", staged(20, force="CUDNN"))
    ((pods, because),) = got[("TRTLLM_RAGGED", "CUDNN")]
    assert 0 < pods < 40
    assert because == [
        "In the 20 % stage of override east.",
        "Forced to CUDNN by override east: canary",
    ]

    in_force = replace(SEED, overrides=(staged(20, force="CUDNN"),))
    promoted = reasons(in_force, "east", staged(60, force="CUDNN"))
    ((more, because),) = promoted[("TRTLLM_RAGGED", "CUDNN")]
    assert more > 0 and because[0] == "In the 60 % stage of override east."

    halted = reasons(in_force, "east", staged(20, state="halted", force="CUDNN"))
    ((back, because),) = halted[("CUDNN", "TRTLLM_RAGGED")]
    assert back == pods  # exactly the stage's pods go back
    assert because == ["The rollout of override east is halted.", TRT_FIRST]


@pytest.mark.parametrize(
    ("inputs", "req", "source"),
    [
        (SEED, B200, "priority"),
        (replace(SEED, overrides=(FORCE,)), B200, "override"),
        (SEED, request((9, 0), cluster="east", requested_backend="CUDNN"), "requested"),
        (SEED, request(None, cluster="east"), "fallback"),
        (
            replace(
                SEED,
                overrides=(override("east", policy="measured", note="m"),),
                evidence=evidence(FLASHINFER=600, FLASH_ATTN=200),
            ),
            H200,
            "measured",
        ),
    ],
)
def test_a_decision_names_the_message_that_chose_its_backend(
    inputs: DecisionInputs, req: object, source: str
) -> None:
    d = decide(req, inputs, now=NOW)  # type: ignore[arg-type]
    assert isinstance(d, Decision) and d.source == source
    assert d.why in d.messages and d.backend.value in d.why, d.messages
