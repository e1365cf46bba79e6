"""SGLang's profiles against every committed release table.

``core/data/engines/sglang/<version>.json`` is what ``tools/engine_profiles/sglang.py``
found by running that release's own parser and attention dispatch (and reading the
rest, each fact marked "run" or "read"). Per release and situation, the profile's
reasons for a backend are empty exactly when the release runs it (no answer it rejects,
no refusal where it runs one), except the deliberate ``EXCEPTIONS`` below; the
evaluator end to end never answers a backend the table rejects, and every flag it gives
is one the release's parser accepts.

Releases whose tables agree give the same answers under the same profile, so the end
to end walk runs once per distinct table (the test asserts they share the profile).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.core.engine_rules.base import parse_version
from mla_switchboard.core.engine_rules.sglang import SGLANG_RANGES, SGLANG_UNVERIFIED
from mla_switchboard.core.engines import resolve
from mla_switchboard.core.evaluator import Decision, DecisionInputs, Refusal, decide
from mla_switchboard.core.schemas import SEED_RULES
from mla_switchboard.core.specs import Backend, Capability, Dtype, MLADims, SelectionContext

from tests.core.conftest import ALL, KIMI, NOW, R1, override, request

DATA = Path(__file__).resolve().parents[2] / "core" / "data" / "engines" / "sglang"
PREFILL = "--prefill-attention-backend"
DECODE = "--decode-attention-backend"


@dataclass(frozen=True)
class Situation:
    release: str
    capability: Capability
    dims: MLADims
    dtype: Dtype
    names: dict[str, dict[str, Any]]  # SGLang name -> {"runs", "reason", "kernel", ...}


@dataclass(frozen=True)
class Deliberate:
    """A deliberate difference: the profile refuses ``backend`` although the table says
    the release runs it, where ``applies`` holds."""

    backend: Backend
    applies: Callable[[Situation], bool]
    reason: str


EXCEPTIONS = (
    Deliberate(
        Backend.FLASH_ATTN,
        lambda s: (
            s.capability.major not in (9, 10)
            and s.names["fa4"]["runs"]
            and not s.names["fa3"]["runs"]
        ),
        "fa4 off 10.x: SGLang's code refuses nothing there (its dispatch sends prefill to "
        "FlashAttention 4's MHA path), but FlashAttention 4 (flash_attn.cute) is built "
        "for Hopper and datacenter Blackwell and nothing here verifies it on 7.5, 8.x, "
        "11.x or 12.x, so the profile passes fa3 on 9.x and fa4 on 10.x only",
    ),
)


@cache
def tables() -> dict[str, dict[str, Any]]:
    found = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}
    assert found, f"no SGLang tables under {DATA}"
    return found


def situations(table: dict[str, Any]) -> list[Situation]:
    return [
        Situation(
            table["release"],
            Capability(*map(int, row["capability"].split("."))),
            MLADims(*row["dims"]),
            Dtype(row["dtype"]),
            row["names"],
        )
        for row in table["situations"]
    ]


def names_of(table: dict[str, Any], backend: Backend) -> list[str]:
    return [n for n, b in table["grid"]["names"].items() if b == backend.value]


def ctx_of(s: Situation) -> SelectionContext:
    return SelectionContext(s.capability, s.dims, s.dtype, None)


def excepted(backend: Backend, s: Situation) -> bool:
    return any(e.backend is backend and e.applies(s) for e in EXCEPTIONS)


@pytest.mark.parametrize("release", sorted(tables()))
def test_profile_agrees_with_the_release_table(release: str) -> None:
    table = tables()[release]
    profile = resolve("sglang", release)
    assert profile is not SGLANG_UNVERIFIED
    prefill = table["facts"]["choices"]["value"][PREFILL]
    decode = table["facts"]["choices"]["value"][DECODE]
    wrong, needless = [], []
    for s in situations(table):
        ctx = ctx_of(s)
        for backend in Backend:
            names = names_of(table, backend)
            runs = [n for n in names if s.names[n]["runs"]]
            if not profile.reasons(backend, ctx, release):
                args = profile.choice(backend, ctx, profile.label(release)).args
                assert args[0] == PREFILL and args[2] == DECODE
                assert args[1] in prefill and args[3] in decode, (s, args)
                if args[1] not in runs:
                    wrong.append((s.capability, s.dims, s.dtype, backend, args[1]))
            elif runs and not excepted(backend, s):
                needless.append((s.capability, s.dims, s.dtype, backend, runs))
    assert wrong == [], f"{release}: answers the release rejects: {wrong[:5]}"
    assert needless == [], f"{release}: refusals where the release runs it: {needless[:5]}"


def test_every_table_is_covered_by_its_range_and_every_range_by_tables() -> None:
    listed = {r: rng for rng in SGLANG_RANGES for r in rng.releases}
    assert sorted(listed) == sorted(tables())
    for release, rng in listed.items():
        assert resolve("sglang", release).verified == rng.verified
    # releases in one range have tables that agree
    for rng in SGLANG_RANGES:
        digests = {_digest(tables()[r]) for r in rng.releases}
        assert len(digests) == 1, rng.releases


def _digest(table: dict[str, Any]) -> str:
    rows = [
        (r["capability"], r["dims"], r["dtype"], r["automatic"], _verdicts(r["names"]))
        for r in table["situations"]
    ]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _verdicts(names: dict[str, Any]) -> dict[str, Any]:
    return {n: [v["runs"], v.get("reason"), v.get("kernel")] for n, v in names.items()}


def _inputs() -> list[DecisionInputs]:
    return [
        DecisionInputs(rules=SEED_RULES),
        DecisionInputs(rules=SEED_RULES, overrides=(override("*", policy="engine-default"),)),
    ]


def test_no_evaluator_answer_names_a_backend_the_release_rejects() -> None:
    checked = 0
    seen: dict[str, str] = {}
    for release, table in tables().items():
        digest = _digest(table)
        verified = resolve("sglang", release).verified
        if digest in seen:  # same table, same profile: same answers
            assert seen[digest] == verified
            continue
        seen[digest] = verified
        prefill = table["facts"]["choices"]["value"][PREFILL]
        decode = table["facts"]["choices"]["value"][DECODE]
        for s in situations(table):
            dims = (s.dims.qk_nope_head_dim, s.dims.qk_rope_head_dim, s.dims.v_head_dim)
            cap = (s.capability.major, s.capability.minor)
            asks: list[dict[str, Any]] = [{}]
            asks += [{"requested_backend": b.value, "strict": True} for b in Backend]
            for extra in asks:
                for given in _inputs() if not extra else _inputs()[:1]:
                    result = decide(
                        request(cap, dims, s.dtype.value, engine=("sglang", release), **extra),
                        given,
                        now=NOW,
                    )
                    checked += 1
                    if isinstance(result, Refusal):
                        continue
                    args = result.engine_args
                    assert args[0] == PREFILL and args[1] in prefill, (release, s, args)
                    assert args[2] == DECODE and args[3] in decode, (release, s, args)
                    assert s.names[args[1]]["runs"], (release, s, result.backend, args)
    assert checked > 5_000


@pytest.mark.parametrize(
    ("version", "verified", "flags"),
    [
        ("0.4.8.post1", "0.4.9.post4", False),
        ("0.4.9", "0.4.9.post4", False),
        ("0.4.9.post4", "0.4.9.post4", False),
        ("0.4.9.post5", "0.4.10.post2", True),
        ("0.4.10.post2", "0.4.10.post2", True),
        ("0.5.0rc2", "0.4.10.post2", True),
        ("0.5.1", "0.5.2", True),
        ("0.5.2", "0.5.2", True),
        ("0.5.3", "0.5.3.post1", True),
        ("0.5.3.post1", "0.5.3.post1", True),
        ("0.5.3.post2", "0.5.11", True),
        ("0.5.11", "0.5.11", True),
        ("0.5.12", "0.5.19", True),
        ("0.5.19", "0.5.19", True),
        ("0.5.20", "0.5.22", True),
        ("0.5.22", "0.5.22", True),
        ("0.5.23", "0.5.23", True),
        ("0.5.24", "0.5.23", True),
        ("0.6.0", "0.5.23", True),
        (None, "0.5.23", True),
    ],
)
def test_version_to_profile(version: str | None, verified: str, flags: bool) -> None:
    profile = resolve("sglang", version)
    assert profile.verified == verified
    result = decide(
        request((9, 0), engine=("sglang", version)), DecisionInputs(rules=SEED_RULES), now=NOW
    )
    assert isinstance(result, Decision)
    assert bool(result.engine_args) is flags
    if not flags:
        assert any("has no --prefill-attention-backend" in m for m in result.messages)


def test_post_releases_sort_between_their_neighbours() -> None:
    assert parse_version("0.4.9") < parse_version("0.4.9.post5") < parse_version("0.4.10")  # type: ignore[operator]


def test_a_pod_that_did_not_report_flashinfer_is_not_refused_it_under_sglang() -> None:
    no_flashinfer = {k: v for k, v in ALL.items() if k != "flashinfer"}
    pod = request(
        (9, 0),
        R1,
        packages=no_flashinfer,
        engine=("sglang", "0.5.23"),
        requested_backend="FLASHINFER",
        strict=True,
    )
    result = decide(pod, DecisionInputs(rules=SEED_RULES), now=NOW)
    assert isinstance(result, Decision) and result.backend is Backend.FLASHINFER
    flashinfer = next(c for c in result.candidates if c.backend is Backend.FLASHINFER)
    assert flashinfer.valid and not any("package" in r for r in flashinfer.reasons)
    # the packages SGLang does not bring are still checked
    no_torch = {k: v for k, v in ALL.items() if k != "torch"}
    pod = request((9, 0), R1, packages=no_torch, engine=("sglang", "0.5.23"))
    result = decide(pod, DecisionInputs(rules=SEED_RULES), now=NOW)
    assert isinstance(result, Refusal)
    assert any(
        "required package torch not installed" in r for c in result.candidates for r in c.reasons
    )


def test_rtx_5090_gets_flashinfer_under_sglang() -> None:
    """Compute capability 12.0 with DeepSeek dims: SGLang runs FlashInfer's ragged
    prefill there (FA2), and decodes with triton, its own choice there."""
    for version in ("0.4.9.post5", "0.5.12", "0.5.23"):
        result = decide(
            request((12, 0), R1, device="NVIDIA GeForce RTX 5090", engine=("sglang", version)),
            DecisionInputs(rules=SEED_RULES),
            now=NOW,
        )
        assert isinstance(result, Decision) and result.backend is Backend.FLASHINFER, version
        assert result.engine_args == (PREFILL, "flashinfer", DECODE, "triton")


def test_flashinfer_on_10x_only_for_the_cutlass_kernels_dims() -> None:
    profile = resolve("sglang", "0.5.23")
    ctx = SelectionContext(Capability(10, 0), MLADims(*KIMI), Dtype.BFLOAT16, None)
    (why,) = profile.reasons(Backend.FLASHINFER, ctx, "0.5.23")
    assert "SGLang 0.5.23" in why and "CUTLASS" in why and "(256, 256)" in why
    assert not profile.reasons(Backend.TRTLLM_RAGGED, ctx, "0.5.23")
    small = SelectionContext(Capability(10, 0), MLADims(64, 64, 128), Dtype.BFLOAT16, None)
    assert not profile.reasons(Backend.FLASHINFER, small, "0.5.23")
    assert profile.reasons(Backend.TRTLLM_RAGGED, small, "0.5.23")


def test_every_reason_names_the_engine_and_release() -> None:
    for release in ("0.4.10", "0.5.3", "0.5.23"):
        profile = resolve("sglang", release)
        for cap in ((7, 5), (8, 0), (10, 0), (12, 0)):
            for dims in (R1, KIMI, (256, 0, 256)):
                for dtype in Dtype:
                    ctx = SelectionContext(Capability(*cap), MLADims(*dims), dtype, None)
                    for backend in Backend:
                        for why in profile.reasons(backend, ctx, release):
                            assert f"SGLang {release}" in why, why


def test_exceptions_are_documented_and_used() -> None:
    used = {id(e): 0 for e in EXCEPTIONS}
    for table in tables().values():
        for s in situations(table):
            for e in EXCEPTIONS:
                if e.applies(s):
                    used[id(e)] += 1
    assert all(used.values()) and all(len(e.reason) > 40 for e in EXCEPTIONS)
