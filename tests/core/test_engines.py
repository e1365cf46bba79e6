"""Engine-aware decisions: no answer names a backend the pod's engine would reject.

``vllm_0_33_accepts`` below is vLLM 0.33.0's own rule, written from its source
independently of core/engines.py (vllm/v1/attention/backends/mla/prefill/registry.py,
base.py, flash_attn.py, flashinfer.py, trtllm_ragged.py, tokenspeed_mla.py): the test
walks every capability from 7.5 to 12.x, every dtype, the dims sets vLLM knows and
more, each explicit request (strict and not), each force override and each policy.
"""

from __future__ import annotations

import itertools

import pytest
from mla_switchboard.core.engines import parse_version, resolve
from mla_switchboard.core.evaluator import Decision, DecisionInputs, Refusal, decide
from mla_switchboard.core.evidence import EvidenceIndex, Observation, situation_of
from mla_switchboard.core.schemas import SEED_RULES
from mla_switchboard.core.specs import Backend

from tests.core.conftest import ALL, BIG, GLM5, KIMI, NOW, R1, SMALL, override, request

VLLM = ("vllm", "0.33.0")
FLAG = "--attention-config.mla_prefill_backend"
CAPS = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)]
DIMS = [R1, KIMI, SMALL, GLM5, BIG, (128, 64, 256)]
DTYPES = ["bfloat16", "float16", "float32"]
PACKAGES = [ALL, {**ALL, "tokenspeed_mla": "0.1"}, {"torch": "2.11.0"}]


def vllm_0_33_accepts(backend: str, cap: tuple[int, int], dims, dtype: str, packages) -> bool:  # type: ignore[no-untyped-def]
    if backend not in {"FLASH_ATTN", "FLASHINFER", "TRTLLM_RAGGED", "TOKENSPEED_MLA"}:
        return False  # argument parsing fails: exit 2
    if dtype not in {"bfloat16", "float16"}:
        return False
    if backend == "FLASH_ATTN":
        return dims in {(128, 64, 128), (192, 64, 256), (64, 64, 128), (256, 0, 256)}
    if cap[0] != 10:
        return False
    if backend == "TRTLLM_RAGGED":
        return dims in {(128, 64, 128), (192, 64, 256)} and "flashinfer" in packages
    if backend == "FLASHINFER":
        return dims == (128, 64, 128) and "flashinfer" in packages
    return dims == (128, 64, 128) and "tokenspeed_mla" in packages


def _policies(cap):  # type: ignore[no-untyped-def]
    yield DecisionInputs(rules=SEED_RULES)
    yield DecisionInputs(rules=SEED_RULES, overrides=(override("*", policy="engine-default"),))
    for forced in Backend:
        yield DecisionInputs(rules=SEED_RULES, overrides=(override("*", force=forced.value),))


def test_no_vllm_answer_names_a_backend_vllm_rejects() -> None:
    checked = refused = 0
    for cap, dims, dtype, packages in itertools.product(CAPS, DIMS, DTYPES, PACKAGES):
        requests = [(None, False), *itertools.product(Backend, [False, True])]
        for given, (req, strict) in itertools.product(_policies(cap), requests):
            extra = {} if req is None else {"requested_backend": req.value, "strict": strict}
            result = decide(
                request(cap, dims, dtype, packages, engine=VLLM, **extra), given, now=NOW
            )
            checked += 1
            if isinstance(result, Refusal):
                refused += 1
                if result.kind == "no_valid_backend":
                    assert not any(c.valid for c in result.candidates)
                continue
            name = result.backend.value
            assert vllm_0_33_accepts(name, cap, dims, dtype, packages), (cap, dims, dtype, name)
            assert result.engine_args == (f"{FLAG}={name}",)
            for c in result.candidates:  # a candidate vLLM rejects is never marked valid
                if c.valid:
                    assert vllm_0_33_accepts(c.backend.value, cap, dims, dtype, packages)
    assert checked > 20_000 and 0 < refused < checked


def test_explicit_requests_vllm_accepts_are_honoured() -> None:
    for cap, dims in itertools.product(CAPS, DIMS):
        for backend in ("FLASH_ATTN", "FLASHINFER", "TRTLLM_RAGGED"):
            if not vllm_0_33_accepts(backend, cap, dims, "bfloat16", ALL) or cap[0] < 8:
                continue  # (our own FLASH_ATTN wrapper spec needs 8.0 or newer too)
            if dims != R1 and backend == "FLASH_ATTN" and sum(dims[:2]) > 256:
                continue
            result = decide(
                request(cap, dims, engine=VLLM, requested_backend=backend, strict=True),
                DecisionInputs(rules=SEED_RULES),
                now=NOW,
            )
            assert isinstance(result, Decision), (cap, dims, backend, result)
            assert result.backend.value == backend and result.source == "requested"


def test_engine_reasons_name_the_engine_and_version() -> None:
    result = decide(request((9, 0), engine=VLLM), DecisionInputs(rules=SEED_RULES), now=NOW)
    by = {c.backend.value: c.reasons for c in result.candidates}
    assert (
        "vLLM 0.33.0 runs FLASHINFER prefill only on compute capability 10.x (this pod: 9.0)"
        in by["FLASHINFER"]
    )
    assert any(r.startswith("vLLM 0.33.0 has no CUDNN MLA prefill backend") for r in by["CUDNN"])
    assert any(r.startswith("vLLM 0.33.0 has no TORCH_SDPA") for r in by["TORCH_SDPA"])


def test_strict_request_vllm_rejects_is_refused_and_lenient_falls_back() -> None:
    strict = request((9, 0), engine=VLLM, requested_backend="FLASHINFER", strict=True)
    refusal = decide(strict, DecisionInputs(rules=SEED_RULES), now=NOW)
    assert isinstance(refusal, Refusal) and refusal.kind == "requested_invalid"
    assert "vLLM 0.33.0" in refusal.message
    lenient = decide(
        request((9, 0), engine=VLLM, requested_backend="CUDNN"),
        DecisionInputs(rules=SEED_RULES),
        now=NOW,
    )
    assert isinstance(lenient, Decision) and lenient.backend is Backend.FLASH_ATTN
    assert any("CUDNN is not valid" in m for m in lenient.messages)


def test_nothing_vllm_accepts_is_a_refusal_with_every_engine_reason() -> None:
    for req in (request((9, 0), dtype="float32", engine=VLLM), request((9, 0), BIG, engine=VLLM)):
        result = decide(req, DecisionInputs(rules=SEED_RULES), now=NOW)
        assert isinstance(result, Refusal) and result.kind == "no_valid_backend"
        assert "under vLLM 0.33.0" in result.message
        assert all(c.reasons and not c.valid for c in result.candidates)


def test_h200_measured_flashinfer_evidence_under_vllm_gets_flash_attn() -> None:
    """Issue 12's done-means: vLLM on Hopper cannot run FLASHINFER prefill, whatever the
    fleet measured."""
    pod = request((9, 0), engine=VLLM)
    situation = situation_of(pod)
    assert situation is not None
    ev = EvidenceIndex(
        [
            Observation(situation, b, f"bench-{i % 2}", t, ok=True, at=NOW)
            for b, t in (("FLASHINFER", 634.0), ("FLASH_ATTN", 623.0))
            for i in range(4)
        ]
    )
    given = DecisionInputs(
        rules=SEED_RULES, overrides=(override("*", policy="measured"),), evidence=ev
    )
    result = decide(pod, given, now=NOW)
    assert isinstance(result, Decision) and result.backend is Backend.FLASH_ATTN
    assert result.source == "measured"
    flashinfer = next(c for c in result.candidates if c.backend is Backend.FLASHINFER)
    assert not flashinfer.valid and any("vLLM 0.33.0" in r for r in flashinfer.reasons)
    assert result.engine_args == (f"{FLAG}=FLASH_ATTN",)


def test_a_fleet_force_vllm_rejects_does_not_take_hopper_pods_down() -> None:
    given = DecisionInputs(rules=SEED_RULES, overrides=(override("*", force="FLASHINFER"),))
    result = decide(request((9, 0), engine=VLLM), given, now=NOW)
    assert isinstance(result, Decision) and result.backend is Backend.FLASH_ATTN
    assert any("Skipping the override" in m for m in result.messages)


def test_legacy_vllm_gets_no_flags_and_is_told_why() -> None:
    result = decide(
        request((9, 0), engine=("vllm", "0.20.2")), DecisionInputs(rules=SEED_RULES), now=NOW
    )
    assert isinstance(result, Decision) and result.engine_args == ()
    assert any("has no --attention-config.mla_prefill_backend" in m for m in result.messages)


_NEWEST_VLLM = resolve("vllm", None).verified
_NEWEST_SGLANG = resolve("sglang", None).verified
_VLLM_LEGACY = "vLLM 0.20.2 has no --attention-config.mla_prefill_backend (added in vLLM 0.21.0)"
_SGLANG_LEGACY = (
    "SGLang 0.4.9.post4 has no --prefill-attention-backend (SGLang's first release with it "
    "is 0.4.9.post5)"
)


@pytest.mark.parametrize(
    ("engine", "cap", "asked", "strict", "answer", "args", "said"),
    [
        # No version: the newest rules, said so; no flag, since no spelling of the prefill
        # flag is taken by every release (vLLM 0.20.2's own parser refuses this one).
        (
            ("vllm", None),
            (10, 0),
            None,
            False,
            "TRTLLM_RAGGED",
            (),
            [
                f"No vLLM version was given: the rules of vLLM {_NEWEST_VLLM}, the newest "
                "release read, are assumed",
                "No engine flags are given: no vLLM version was given, and not every vLLM "
                f"release takes one flag for TRTLLM_RAGGED: {_VLLM_LEGACY}. vLLM keeps its own "
                "choice; give its version to direct its MLA prefill backend.",
            ],
        ),
        (
            ("sglang", None),
            (9, 0),
            None,
            False,
            "FLASH_ATTN",
            (),
            [
                f"No SGLang version was given: the rules of SGLang {_NEWEST_SGLANG}, the "
                "newest release read, are assumed",
                f"not every SGLang release takes one flag for FLASH_ATTN: {_SGLANG_LEGACY}",
            ],
        ),
        # ... and a strict request for a backend the engine may not be told is refused.
        (
            ("vllm", None),
            (10, 0),
            "TRTLLM_RAGGED",
            True,
            "requested_invalid",
            None,
            [
                "Requested MLA prefill backend TRTLLM_RAGGED cannot be passed to the engine: "
                "no vLLM version was given, and not every vLLM release takes one flag for "
                f"TRTLLM_RAGGED: {_VLLM_LEGACY}, so the engine would make its own choice. "
                "strict is true, so no other backend is chosen.",
                f"No vLLM version was given: the rules of vLLM {_NEWEST_VLLM}",
            ],
        ),
        # A release older than the flag: strict is refused with that reason ...
        (
            ("vllm", "0.20.2"),
            (10, 0),
            "TRTLLM_RAGGED",
            True,
            "requested_invalid",
            None,
            [
                "Requested MLA prefill backend TRTLLM_RAGGED cannot be passed to the engine: "
                f"{_VLLM_LEGACY}, so the engine would make its own choice. strict is true, so "
                "no other backend is chosen."
            ],
        ),
        (
            ("sglang", "0.4.9.post4"),
            (9, 0),
            "FLASH_ATTN",
            True,
            "requested_invalid",
            None,
            [f"cannot be passed to the engine: {_SGLANG_LEGACY}, so the engine would make"],
        ),
        # ... and a lenient request is answered without it: the engine decides, no flag.
        (
            ("vllm", "0.20.2"),
            (10, 0),
            "FLASHINFER",
            False,
            "TRTLLM_RAGGED",
            (),
            [
                "Requested MLA prefill backend FLASHINFER cannot be passed to the engine: "
                f"{_VLLM_LEGACY}: the engine decides. Answered as if not requested.",
                f"{_VLLM_LEGACY}: no engine flags are given, so vLLM keeps its own choice.",
            ],
        ),
        (
            ("vllm", "0.20.2"),
            (9, 0),
            None,
            False,
            "FLASH_ATTN",
            (),
            [f"{_VLLM_LEGACY}: no engine flags are given"],
        ),
        # the first release with the flag honours the same strict request, with its flag
        (
            ("vllm", "0.21.0"),
            (10, 0),
            "TRTLLM_RAGGED",
            True,
            "TRTLLM_RAGGED",
            (f"{FLAG}=TRTLLM_RAGGED",),
            ["Using requested MLA prefill backend TRTLLM_RAGGED."],
        ),
        # our own kernels have no releases: no version is the usual case, nothing to say
        (
            ("switchboard", None),
            (10, 0),
            "FLASHINFER",
            True,
            "FLASHINFER",
            (),
            ["Using requested MLA prefill backend FLASHINFER."],
        ),
    ],
)
def test_unknown_and_legacy_engine_versions(  # type: ignore[no-untyped-def]
    engine, cap, asked, strict, answer, args, said
) -> None:
    extra = {} if asked is None else {"requested_backend": asked, "strict": strict}
    result = decide(
        request(cap, R1, engine=engine, **extra), DecisionInputs(rules=SEED_RULES), now=NOW
    )
    if args is None:  # refused: the reason in the message and on the requested candidate
        assert isinstance(result, Refusal) and result.kind == answer, result
        for text in said:
            assert text in result.message, result.message
        (wanted,) = [c for c in result.candidates if c.backend.value == asked]
        assert not wanted.valid and wanted.role == "requested"
        assert wanted.reasons[-1].startswith("the engine cannot be told it: ")
        return
    assert isinstance(result, Decision), result
    assert result.backend.value == answer and result.engine_args == args
    if result.source == "requested":  # honoured means told: never an answer without flags
        assert result.engine_args or result.engine_env
    messages = " | ".join(result.messages)
    for text in said:
        assert text in messages, messages
    if engine[1] is not None or engine[0] == "switchboard":
        assert not any(m.startswith("No ") and "version was given" in m for m in result.messages)


def test_no_version_gets_a_flag_where_every_release_takes_the_same_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where every profile of the engine runs the backend and spells it alike, an answer
    without a version carries that flag; one release that does not run it here is named
    and no flag is given. (vLLM without its pre-flag profile stands in for such an
    engine: with it no flag is ever common.)"""
    from mla_switchboard.core import engines

    monkeypatch.setitem(engines.ENGINES, "vllm", engines.ENGINES["vllm"][:-1])
    given = DecisionInputs(rules=SEED_RULES)
    r1 = decide(request((10, 0), R1, engine=("vllm", None)), given, now=NOW)
    assert isinstance(r1, Decision) and r1.engine_args == (f"{FLAG}=TRTLLM_RAGGED",)
    # (192, 64, 256): vLLM 0.21.0 to 0.23.0 refuse TRTLLM_RAGGED for it
    kimi = decide(request((10, 0), KIMI, engine=("vllm", None)), given, now=NOW)
    assert isinstance(kimi, Decision) and kimi.backend is Backend.TRTLLM_RAGGED
    assert kimi.engine_args == ()
    assert any("vLLM 0.23.0 does not run TRTLLM_RAGGED here" in m for m in kimi.messages)


@pytest.mark.parametrize(
    ("cap", "dims", "requested", "args"),
    [
        (
            (9, 0),
            R1,
            None,
            ("--prefill-attention-backend", "fa3", "--decode-attention-backend", "fa3"),
        ),
        (
            (10, 0),
            R1,
            "FLASH_ATTN",
            ("--prefill-attention-backend", "fa4", "--decode-attention-backend", "trtllm_mla"),
        ),
        (
            (10, 0),
            R1,
            None,
            (
                "--prefill-attention-backend",
                "trtllm_mla",
                "--decode-attention-backend",
                "trtllm_mla",
            ),
        ),
        (
            (10, 0),
            R1,
            "FLASHINFER",
            (
                "--prefill-attention-backend",
                "flashinfer",
                "--decode-attention-backend",
                "trtllm_mla",
            ),
        ),
        (  # (64, 64, 128): head dims (128, 128), which trtllm_mla's ragged kernel takes
            (10, 0),
            SMALL,
            None,
            (
                "--prefill-attention-backend",
                "trtllm_mla",
                "--decode-attention-backend",
                "flashinfer",
            ),
        ),
        (  # (64, 64, 128) asked for FlashInfer: its CUTLASS kernel takes (128, 128) too
            (10, 0),
            SMALL,
            "FLASHINFER",
            (
                "--prefill-attention-backend",
                "flashinfer",
                "--decode-attention-backend",
                "flashinfer",
            ),
        ),
        (  # no rope part, head dims (256, 256): trtllm_mla's ragged kernel takes them
            (10, 0),
            GLM5,
            None,
            (
                "--prefill-attention-backend",
                "trtllm_mla",
                "--decode-attention-backend",
                "flashinfer",
            ),
        ),
        (  # ... and asked for FlashAttention, FlashAttention 4 runs them
            (10, 0),
            GLM5,
            "FLASH_ATTN",
            ("--prefill-attention-backend", "fa4", "--decode-attention-backend", "flashinfer"),
        ),
    ],
)
def test_sglang_flags_pin_the_decode_backend(cap, dims, requested, args) -> None:  # type: ignore[no-untyped-def]
    extra = {} if requested is None else {"requested_backend": requested}
    result = decide(
        request(cap, dims, engine=("sglang", "0.5.23"), **extra),
        DecisionInputs(rules=SEED_RULES),
        now=NOW,
    )
    assert isinstance(result, Decision) and result.engine_args == args


def test_sglang_has_no_fa3_mla_prefill_on_ampere() -> None:
    """fa3 asserts SM9x for MLA: on 8.x only SGLang's flashinfer MLA backend is left."""
    result = decide(
        request((8, 0), engine=("sglang", "0.5.23")), DecisionInputs(rules=SEED_RULES), now=NOW
    )
    assert isinstance(result, Decision) and result.backend is Backend.FLASHINFER
    assert result.engine_args[:2] == ("--prefill-attention-backend", "flashinfer")
    fa = next(c for c in result.candidates if c.backend is Backend.FLASH_ATTN)
    assert any("fa3 on 9.x or fa4 on 10.x" in r for r in fa.reasons)


def test_switchboard_engine_is_the_default_and_echoed() -> None:
    result = decide(request((9, 0)), DecisionInputs(rules=SEED_RULES), now=NOW)
    assert isinstance(result, Decision)
    assert result.engine.name == "switchboard" and result.engine_args == ()
    assert dict(result.engine_env) == {"SWITCHBOARD_BACKEND": "FLASH_ATTN"}


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("0.33.0", (0, 33, 0)),
        ("0.33.1rc1", (0, 33, 1)),
        ("0.11.0+cu128", (0, 11, 0)),
        ("1", (1, 0, 0)),
        ("", None),
        ("x", None),
    ],
)
def test_versions(text: str, parsed) -> None:  # type: ignore[no-untyped-def]
    assert parse_version(text) == parsed


def test_profiles_by_version() -> None:
    # each release range is its own profile now (core/engine_rules/vllm.py): 0.21.0 is
    # in the 0.21-0.23 range, read up to 0.23.0, not under 0.33.0's rules
    assert resolve("vllm", "0.21.0").verified == "0.23.0"
    # the legacy profile names the last release whose own parser refused the flag
    assert resolve("vllm", "0.20.9").verified == "0.20.2"
    assert resolve("vllm", None).verified == "0.34.0"
    # SGLang's prefill flag first ships in 0.4.9.post5 (the old boundary, 0.5.0, gave
    # 0.4.9.post5 to 0.4.10.post2 no flags although they take them).
    assert resolve("sglang", "0.4.9").until == (0, 4, 9, 5)
