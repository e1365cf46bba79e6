"""The evaluator as a unit table: the whole backend table and the precedence, directly.

Expected answers come from the spec table in the README, not from the
code: Blackwell's seed list is TRTLLM_RAGGED, FLASHINFER, CUDNN, FLASH_ATTN; every
other GPU FLASH_ATTN; then the fallback chain FLASH_ATTN -> TORCH_SDPA.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from mla_switchboard.core.evaluator import (
    LOCAL_INPUTS,
    Decision,
    DecisionInputs,
    Refusal,
    assess,
    decide,
)
from mla_switchboard.core.evidence import EvidenceIndex, Observation, situation_of
from mla_switchboard.core.schemas import SEED_RULES, RulesDocument
from mla_switchboard.core.specs import Backend

from tests.core.conftest import ALL, BIG, GLM5, KIMI, NOW, R1, SMALL, override, request

TORCH_ONLY = {"torch": "2.11.0"}
NO_FLASHINFER = {"torch": "2.11.0", "cudnn": "1.32.0"}

# (name, capability, dims, dtype, packages, backend, source)
TABLE = [
    ("blackwell-r1", (10, 0), R1, "bfloat16", ALL, "TRTLLM_RAGGED", "priority"),
    ("blackwell-r1-fp16", (10, 0), R1, "float16", ALL, "TRTLLM_RAGGED", "priority"),
    ("blackwell-kimi-dims", (10, 0), KIMI, "bfloat16", ALL, "TRTLLM_RAGGED", "priority"),
    ("blackwell-no-flashinfer", (10, 0), R1, "bfloat16", NO_FLASHINFER, "CUDNN", "priority"),
    ("blackwell-torch-only", (10, 0), R1, "bfloat16", TORCH_ONLY, "FLASH_ATTN", "priority"),
    # (64, 64, 128): head dims (128, 128), which FlashInfer's trtllm-gen ragged DeepSeek
    # kernel takes (as its CUTLASS one does on 10.x): first in Blackwell's list
    ("blackwell-small-dims", (10, 0), SMALL, "bfloat16", ALL, "TRTLLM_RAGGED", "priority"),
    # (256, 0, 256): head dims (256, 256), GLM-5's, which that kernel takes too
    ("blackwell-glm5-dims", (10, 0), GLM5, "bfloat16", ALL, "TRTLLM_RAGGED", "priority"),
    # (128, 64, 256): head dims (192, 256), which neither FlashInfer kernel takes
    ("blackwell-odd-dims", (10, 0), (128, 64, 256), "bfloat16", ALL, "FLASH_ATTN", "priority"),
    ("blackwell-fp32", (10, 0), R1, "float32", ALL, "TORCH_SDPA", "fallback"),
    ("hopper", (9, 0), R1, "bfloat16", ALL, "FLASH_ATTN", "priority"),
    ("hopper-glm5-dims", (9, 0), GLM5, "bfloat16", ALL, "FLASH_ATTN", "priority"),
    ("hopper-big-dims", (9, 0), BIG, "bfloat16", ALL, "TORCH_SDPA", "fallback"),
    ("ampere", (8, 0), R1, "float16", ALL, "FLASH_ATTN", "priority"),
    ("turing", (7, 5), R1, "float16", ALL, "TORCH_SDPA", "fallback"),
    ("rtx-pro-12", (12, 0), R1, "bfloat16", ALL, "FLASH_ATTN", "priority"),
    ("no-gpu", None, R1, "float32", ALL, "TORCH_SDPA", "fallback"),
    ("hopper-fp32", (9, 0), R1, "float32", ALL, "TORCH_SDPA", "fallback"),
]


def inputs(rules: RulesDocument = SEED_RULES, *overrides, evidence=None) -> DecisionInputs:  # type: ignore[no-untyped-def]
    return DecisionInputs(
        rules=rules, overrides=tuple(overrides), evidence=evidence or EvidenceIndex()
    )


def chosen(result: Decision | Refusal) -> tuple[str, str]:
    assert isinstance(result, Decision), result
    return result.backend.value, result.source


@pytest.mark.parametrize(("name", "cap", "dims", "dtype", "packages", "backend", "source"), TABLE)
def test_backend_table(name, cap, dims, dtype, packages, backend, source) -> None:  # type: ignore[no-untyped-def]
    result = decide(request(cap, dims, dtype, packages), LOCAL_INPUTS, now=NOW)
    assert chosen(result) == (backend, source), name
    by = {c.backend.value: c for c in result.candidates}
    assert set(by) == {b.value for b in Backend}, "every backend is listed once"
    assert by[backend].valid and not by[backend].reasons


def test_every_answer_is_consistent_over_a_grid() -> None:
    """valid == no reasons; the chosen backend is valid; a refusal leaves nothing valid."""
    caps = [None, (7, 5), (8, 0), (9, 0), (10, 0), (12, 0)]
    dims_sets = [R1, KIMI, SMALL, GLM5, BIG]
    dtypes = ["bfloat16", "float16", "float32"]
    package_sets = [ALL, TORCH_ONLY, {"flashinfer": "0.7.2"}, {}]
    requested = [None, *Backend]
    for cap, dims, dtype, packages, req in itertools.product(
        caps, dims_sets, dtypes, package_sets, requested
    ):
        extra = {} if req is None else {"requested_backend": req.value}
        result = decide(request(cap, dims, dtype, packages, **extra), LOCAL_INPUTS, now=NOW)
        for c in result.candidates:
            assert c.valid == (not c.reasons)
        if isinstance(result, Decision):
            assert next(c for c in result.candidates if c.backend is result.backend).valid
        else:
            assert result.kind == "no_valid_backend"
            assert not any(c.valid for c in result.candidates), (cap, dims, dtype, packages)


def test_a_forgotten_torch_is_the_reason_given() -> None:
    """Issue 11, reproduction 4: flashinfer without torch used to answer 409 while
    listing FLASHINFER valid; every backend needs torch and says so."""
    result = decide(request((9, 0), packages={"flashinfer": "0.7.2"}), LOCAL_INPUTS, now=NOW)
    assert isinstance(result, Refusal) and result.kind == "no_valid_backend"
    assert not any(c.valid for c in result.candidates)
    flashinfer = next(c for c in result.candidates if c.backend is Backend.FLASHINFER)
    assert "required package torch not installed" in flashinfer.reasons
    assert "required package torch not installed" in result.message


def test_a_valid_backend_outside_every_list_beats_a_refusal() -> None:
    """The list holds only CUDNN (vLLM has none), FLASH_ATTN is denied and vLLM has no
    TORCH_SDPA: a refusal would leave TRTLLM_RAGGED valid and unexplained."""
    rules = RulesDocument.model_validate({"revision": 2, "by_capability": {"10": ["CUDNN"]}})
    req = request((10, 0), engine=("vllm", "0.33.0"))
    result = decide(req, inputs(rules, override("*", deny=["FLASH_ATTN"])), now=NOW)
    assert chosen(result) == ("TRTLLM_RAGGED", "fallback")
    assert result.engine_args == ("--attention-config.mla_prefill_backend=TRTLLM_RAGGED",)


class TestPrecedence:
    def test_deny_beats_force(self) -> None:
        result = decide(
            request((10, 0)),
            inputs(
                SEED_RULES,
                override("*", deny=["FLASHINFER"]),
                override("prod-east", force="FLASHINFER"),
            ),
            now=NOW,
        )
        assert chosen(result) == ("TRTLLM_RAGGED", "priority")
        flashinfer = next(c for c in result.candidates if c.backend is Backend.FLASHINFER)
        assert flashinfer.role == "forced" and any("denied by" in r for r in flashinfer.reasons)
        assert any("Skipping the override" in m for m in result.messages)

    def test_force_beats_request(self) -> None:
        result = decide(
            request((10, 0), requested_backend="CUDNN"),
            inputs(SEED_RULES, override("prod-east", force="FLASHINFER")),
            now=NOW,
        )
        assert chosen(result) == ("FLASHINFER", "override")

    def test_cluster_force_beats_fleet_force(self) -> None:
        result = decide(
            request((10, 0)),
            inputs(
                SEED_RULES, override("*", force="CUDNN"), override("prod-east", force="FLASHINFER")
            ),
            now=NOW,
        )
        assert chosen(result) == ("FLASHINFER", "override")

    def test_request_beats_priority_and_measured(self) -> None:
        ev = _evidence_for(request((9, 0)), FLASHINFER=600.0, FLASH_ATTN=200.0)
        result = decide(
            request((9, 0), requested_backend="CUDNN"),
            inputs(SEED_RULES, override("*", policy="measured"), evidence=ev),
            now=NOW,
        )
        assert chosen(result) == ("CUDNN", "requested")

    def test_strict_invalid_request_is_refused(self) -> None:
        result = decide(
            request((9, 0), requested_backend="TRTLLM_RAGGED", strict=True), LOCAL_INPUTS, now=NOW
        )
        assert isinstance(result, Refusal) and result.kind == "requested_invalid"
        assert "compute capability 9.0 not supported" in result.message

    def test_lenient_invalid_request_falls_back_and_says_so(self) -> None:
        result = decide(request((9, 0), requested_backend="TRTLLM_RAGGED"), LOCAL_INPUTS, now=NOW)
        assert chosen(result) == ("FLASH_ATTN", "priority")
        assert any("Falling back to auto-selection" in m for m in result.messages)

    def test_measured_beats_priority(self) -> None:
        ev = _evidence_for(request((9, 0)), FLASHINFER=600.0, FLASH_ATTN=200.0)
        result = decide(
            request((9, 0)),
            inputs(SEED_RULES, override("*", policy="measured"), evidence=ev),
            now=NOW,
        )
        assert chosen(result) == ("FLASHINFER", "measured")
        assert result.evidence is not None and result.evidence.runner_up is Backend.FLASH_ATTN

    def test_cluster_policy_beats_fleet_policy(self) -> None:
        ev = _evidence_for(request((9, 0)), FLASHINFER=600.0, FLASH_ATTN=200.0)
        both = inputs(
            SEED_RULES,
            override("*", policy="measured"),
            override("prod-east", policy="priority"),
            evidence=ev,
        )
        assert chosen(decide(request((9, 0)), both, now=NOW)) == ("FLASH_ATTN", "priority")

    def test_cluster_rule_and_capability_keys(self) -> None:
        rules = RulesDocument.model_validate(
            {
                "revision": 3,
                "default": ["FLASH_ATTN"],
                "by_capability": {"9": ["CUDNN"], "9.0": ["FLASHINFER"]},
                "clusters": {"special": {"default": ["CUDNN"]}},
            }
        )
        assert chosen(decide(request((9, 0)), inputs(rules), now=NOW)) == ("FLASHINFER", "priority")
        assert chosen(decide(request((9, 4)), inputs(rules), now=NOW)) == ("CUDNN", "priority")
        special = request((8, 0), cluster="special")
        assert chosen(decide(special, inputs(rules), now=NOW)) == ("CUDNN", "priority")

    def test_expired_and_other_models_overrides_do_not_apply(self) -> None:
        expired = override(
            "prod-east", force="CUDNN", expires_at=(NOW - timedelta(minutes=1)).isoformat()
        )
        other_model = override("prod-east", force="CUDNN", model="moonshotai/*")
        for o in (expired, other_model):
            assert chosen(decide(request((9, 0)), inputs(SEED_RULES, o), now=NOW)) == (
                "FLASH_ATTN",
                "priority",
            )

    def test_engine_default_policy_uses_the_engines_order(self) -> None:
        blackwell_vllm = request((10, 0), engine=("vllm", "0.33.0"))
        seed = decide(blackwell_vllm, LOCAL_INPUTS, now=NOW)
        assert chosen(seed) == ("TRTLLM_RAGGED", "priority")  # the seed rules' first
        own = decide(
            blackwell_vllm, inputs(SEED_RULES, override("*", policy="engine-default")), now=NOW
        )
        assert chosen(own) == ("FLASH_ATTN", "priority")  # vLLM >= 0.21's own first
        kimi = request((10, 0), KIMI, engine=("vllm", "0.33.0"))
        own = decide(kimi, inputs(SEED_RULES, override("*", policy="engine-default")), now=NOW)
        assert chosen(own) == ("TRTLLM_RAGGED", "priority")  # vLLM's dims exception


def _evidence_for(req, **tflops: float) -> EvidenceIndex:  # type: ignore[no-untyped-def]
    situation = situation_of(req)
    assert situation is not None
    obs = [
        Observation(situation, backend, f"bench-{i % 2}", value, ok=True, cluster="bench", at=NOW)
        for backend, value in tflops.items()
        for i in range(3)
    ]
    return EvidenceIndex(obs, min_samples=3, min_pods=2)


def test_assess_is_what_decide_reads() -> None:
    """The preview and the regret call assess(); it must agree with decide's candidates."""
    req = request((10, 0), packages=NO_FLASHINFER)
    given = inputs(SEED_RULES, override("*", deny=["CUDNN"]))
    assessed = assess(req, given, NOW)
    result = decide(req, given, now=NOW)
    assert {c.backend: c.reasons for c in result.candidates} == assessed.reasons
    assert chosen(result) == ("FLASH_ATTN", "priority")
