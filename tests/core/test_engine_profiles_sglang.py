"""SGLang's profiles against every committed release table.

``tools/engine_profiles/data/sglang/<version>.json`` is what ``tools/engine_profiles/sglang.py``
found by running that release's own parser and attention dispatch (and reading the
rest, each fact marked "run" or "read"). Per release and situation, the profile's
reasons for a backend are empty exactly when the release runs it (no answer it rejects,
no refusal where it runs one), except the deliberate refusals in ``SGLANG_EXCEPTIONS``
(``core/engine_rules/sglang.py``); the evaluator end to end (our spec with the rules)
never answers a backend the table rejects and never refuses one it runs, those
exceptions aside (each must excuse a refusal in every release it names), and every
flag it gives is one the release's parser accepts, spelt as its range holds it.

Releases whose tables agree give the same answers under the same profile, so the end
to end walk runs once per distinct table (the test asserts they share the profile).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
from mla_switchboard.core.engine_rules.base import DeliberateRefusal, parse_version
from mla_switchboard.core.engine_rules.sglang import (
    SGLANG_EXCEPTIONS,
    SGLANG_NAMES,
    SGLANG_RANGES,
    SGLANG_UNVERIFIED,
    SglangRange,
)
from mla_switchboard.core.engines import resolve
from mla_switchboard.core.evaluator import Decision, DecisionInputs, Refusal, assess, decide
from mla_switchboard.core.schemas import SEED_RULES
from mla_switchboard.core.specs import (
    KERNEL_PACKAGES,
    Backend,
    Capability,
    Dtype,
    MLADims,
    SelectionContext,
)

from tests.core.conftest import ALL, BIG, GLM5, KIMI, NOW, R1, SMALL, override, request
from tools.engine_profiles import TABLES

DATA = TABLES / "sglang"
PREFILL = SGLANG_RANGES[0].prefill_flag.option
DECODE = SGLANG_RANGES[0].decode_flag.option
EVERY_PACKAGE = dict.fromkeys(KERNEL_PACKAGES, "1")


@dataclass(frozen=True)
class Situation:
    release: str
    capability: Capability
    dims: MLADims
    dtype: Dtype
    names: dict[str, dict[str, Any]]  # SGLang name -> {"runs", "reason", "kernel", ...}


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


def excuse(backend: Backend, s: Situation) -> DeliberateRefusal | None:
    version = parse_version(s.release)
    assert version is not None
    return next((e for e in SGLANG_EXCEPTIONS if e.covers(backend, version, ctx_of(s))), None)


def range_of(release: str) -> SglangRange:
    (found,) = [r for r in SGLANG_RANGES if release in r.releases]
    return found


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
            elif runs and excuse(backend, s) is None:
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
        ("0.5.1", "0.5.1.post3", True),
        ("0.5.2", "0.5.2", True),
        ("0.5.3", "0.5.3.post1", True),
        ("0.5.3.post1", "0.5.3.post1", True),
        ("0.5.3.post2", "0.5.9", True),
        ("0.5.10", "0.5.11", True),
        ("0.5.11", "0.5.11", True),
        ("0.5.12", "0.5.12.post1", True),
        ("0.5.13", "0.5.15.post1", True),
        ("0.5.16", "0.5.19", True),
        ("0.5.19", "0.5.19", True),
        ("0.5.20", "0.5.22", True),
        ("0.5.22", "0.5.22", True),
        ("0.5.23", "0.5.23", True),
        ("0.5.24", "0.5.23", True),
        ("0.6.0", "0.5.23", True),
        # no version: the newest rules, but no flags (releases before 0.4.9.post5 have none)
        (None, "0.5.23", False),
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
    assert not profile.reasons(Backend.TRTLLM_RAGGED, small, "0.5.23")


def test_each_range_takes_the_trtllm_head_dims_its_tables_read() -> None:
    """trtllm_mla's head dims are data per range, read by the tool per release: the
    check of FlashInfer's trtllm_ragged_attention_deepseek in the FlashInfer release it
    pins (run over every pair), or, where trtllm_mla has no prefill of its own, its
    parent's CUTLASS kernel's. No range holds a pair of dims the tables do not."""
    for rng in SGLANG_RANGES:
        for release in rng.releases:
            facts = tables()[release]["facts"]
            prefill = facts["trtllm_mla_prefill"]["value"]
            if Backend.TRTLLM_RAGGED not in rng.accepts:
                assert not rng.trtllm_head_dims, release
                continue
            if prefill == "trtllm_ragged_attention_deepseek":
                read = facts["trtllm_ragged_head_dims"]
                assert read["method"] == "run" and "flashinfer/prefill.py" in read["where"]
                pinned = read["where"].split()[1]  # "flashinfer-python X flashinfer/..."
                assert any(f"=={pinned}" in r for r in facts["flashinfer_dependency"]["value"])
                assert {tuple(p) for p in read["value"]} == rng.trtllm_head_dims, release
            else:
                assert prefill == "FlashInferMLAAttnBackend.forward_extend", release
                cutlass = {tuple(p) for p in facts["flashinfer_cutlass_dims"]["value"]}
                assert cutlass == rng.trtllm_head_dims and "CUTLASS" in rng.trtllm_kernel


_TAKES_ALL = "(128, 128), (192, 128), (256, 256) only"
_NO_GLM5 = "(128, 128), (192, 128) only"
_DSR1 = "(192, 128) only"
_CUTLASS = "(64, 64), (128, 128), (192, 128) only"
_TRTLLM = ("--prefill-attention-backend", "trtllm_mla", "--decode-attention-backend")


@pytest.mark.parametrize(
    ("release", "dims", "decode", "refused"),
    [
        # FlashInfer 0.7.2's ragged DeepSeek kernel: (128, 128) and GLM-5's (256, 256) too
        ("0.5.23", SMALL, "flashinfer", None),
        ("0.5.23", GLM5, "flashinfer", None),
        ("0.5.23", KIMI, "flashinfer", None),
        ("0.5.23", R1, "trtllm_mla", None),
        ("0.5.23", BIG, None, _TAKES_ALL),
        ("0.5.23", (128, 64, 256), None, _TAKES_ALL),
        # FlashInfer 0.6.12 (SGLang 0.5.13) added (256, 256)
        ("0.5.13", SMALL, "flashinfer", None),
        ("0.5.13", GLM5, "flashinfer", None),
        ("0.5.12", SMALL, "flashinfer", None),
        ("0.5.12", GLM5, None, _NO_GLM5),
        ("0.5.12", KIMI, None, _NO_GLM5),
        # FlashInfer 0.6.7.post2 (SGLang 0.5.10) added (128, 128)
        ("0.5.10", SMALL, "flashinfer", None),
        ("0.5.9", SMALL, None, _DSR1),
        ("0.5.9", KIMI, None, _DSR1),
        ("0.5.9", R1, "trtllm_mla", None),
        ("0.5.2", KIMI, None, _DSR1),
        ("0.5.2", R1, "flashinfer", None),
        # 0.5.1.x: trtllm_mla prefill is its parent's, FlashInfer's CUTLASS kernel
        ("0.5.1", SMALL, "flashinfer", None),
        ("0.5.1.post3", KIMI, None, _CUTLASS),
    ],
)
def test_strict_trtllm_ragged_on_10x_takes_the_head_dims_of_its_kernel(
    release: str, dims: tuple[int, int, int], decode: str | None, refused: str | None
) -> None:
    """A strict TRTLLM_RAGGED on 10.x: answered with trtllm_mla (decode pinned to SGLang's
    own choice) where the release's trtllm_mla kernel takes the model's (qk, v) head
    dims, else refused with a reason naming the head dims it does take."""
    pod = request(
        (10, 0), dims, engine=("sglang", release), requested_backend="TRTLLM_RAGGED", strict=True
    )
    result = decide(pod, DecisionInputs(rules=SEED_RULES), now=NOW)
    if refused is None:
        assert isinstance(result, Decision) and result.backend is Backend.TRTLLM_RAGGED, result
        assert result.source == "requested"
        assert result.engine_args == (*_TRTLLM, decode)
        return
    assert isinstance(result, Refusal) and result.kind == "requested_invalid", result
    qk_v = (dims[0] + dims[1], dims[2])
    assert f"SGLang {release} runs trtllm_mla prefill as " in result.message
    assert f"takes head dims (qk, v) = {refused} (model: {qk_v}" in result.message


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


# ------------------------------------------------------------------ end to end


def _distinct_releases() -> list[str]:
    """One release per distinct table (releases whose tables agree share a profile and
    get the same answers; test_every_table_is_covered... checks they share a range)."""
    seen: dict[str, str] = {}
    for release, table in tables().items():
        seen.setdefault(_digest(table), release)
    return list(seen.values())


@cache
def _end_to_end(release: str) -> tuple[list[Any], list[Any], dict[int, int]]:
    """Through the evaluator, per situation: answers naming a backend the release does
    not run, refusals of one it runs that no deliberate refusal excuses, and how many
    refusals each exception (by index) excused."""
    table = tables()[release]
    wrong: list[Any] = []
    needless: list[Any] = []
    used = dict.fromkeys(range(len(SGLANG_EXCEPTIONS)), 0)
    for s in situations(table):
        cap = (s.capability.major, s.capability.minor)
        dims = (s.dims.qk_nope_head_dim, s.dims.qk_rope_head_dim, s.dims.v_head_dim)
        pod = functools.partial(
            request, cap, dims, s.dtype.value, EVERY_PACKAGE, engine=("sglang", release)
        )
        reasons = assess(pod(), DecisionInputs(rules=SEED_RULES), NOW).reasons
        for backend in Backend:
            runs = [n for n in names_of(table, backend) if s.names[n]["runs"]]
            if not reasons[backend] and not runs:
                wrong.append((s.capability, s.dims, s.dtype, backend))
            if not runs:
                continue
            result = decide(
                pod(requested_backend=backend.value, strict=True),
                DecisionInputs(rules=SEED_RULES),
                now=NOW,
            )
            if isinstance(result, Decision) and result.backend is backend:
                assert result.engine_args[1] in runs, (release, s, result.engine_args)
                continue
            found = excuse(backend, s)
            if found is None:
                needless.append((s.capability, s.dims, s.dtype, backend, reasons[backend]))
            else:
                used[SGLANG_EXCEPTIONS.index(found)] += 1
    return wrong, needless, used


@pytest.mark.parametrize("release", _distinct_releases())
def test_end_to_end_no_answer_it_rejects_and_no_refusal_where_it_runs(release: str) -> None:
    """Our spec and the release's rules together: 0 answers the release does not run,
    0 refusals of a backend it runs (a strict request for it is honoured, with the name
    it runs), except the deliberate refusals in SGLANG_EXCEPTIONS."""
    wrong, needless, _ = _end_to_end(release)
    assert wrong == [], f"{release}: {len(wrong)} answers the release rejects: {wrong[:5]}"
    assert needless == [], (
        f"{release}: {len(needless)} refusals where the release runs it: {needless[:5]}"
    )


def test_each_deliberate_refusal_is_used_in_every_release_it_names() -> None:
    """No stale exception: each excuses at least one refusal in every distinct table
    inside its range, and says why at length."""
    for i, exception in enumerate(SGLANG_EXCEPTIONS):
        assert len(exception.reason) > 80 and exception.reason.rstrip().endswith(".")
        named = [
            r
            for r in _distinct_releases()
            if (exception.since is None or parse_version(r) >= exception.since)  # type: ignore[operator]
            and (exception.until is None or parse_version(r) < exception.until)  # type: ignore[operator]
        ]
        assert named, exception
        unused = [r for r in named if _end_to_end(r)[2][i] == 0]
        assert unused == [], f"{exception.backend} exception excuses nothing in {unused}"


def test_each_range_spells_the_flags_its_releases_parse() -> None:
    """The flags an answer carries are the range's data, and each release's own parser
    (run) has them; the table records the same spelling."""
    for rng in SGLANG_RANGES:
        for release in rng.releases:
            table = tables()[release]
            parsed = table["facts"]["choices"]
            assert parsed["method"] == "run"
            for flag in (rng.prefill_flag, rng.decode_flag):
                assert flag.option in parsed["value"] and flag.env is None, (release, flag)
            assert table["flags"]["prefill"] == rng.prefill_flag.option
            assert table["flags"]["decode"] == rng.decode_flag.option
            profile = resolve("sglang", release)
            ctx = SelectionContext(Capability(9, 0), MLADims(*R1), Dtype.BFLOAT16, None)
            choice = profile.choice(Backend.FLASH_ATTN, ctx, profile.label(release))
            assert choice.args == (*rng.prefill_flag.args("fa3"), *rng.decode_flag.args("fa3"))


def test_the_name_map_is_the_tables() -> None:
    """The tool asks each release about the core's SGLang names, no other copy."""
    for table in tables().values():
        assert table["grid"]["names"] == {n: b.value for n, b in SGLANG_NAMES.items()}


@pytest.mark.parametrize("version", ["0.5.0rc2", "0.5.4.post4", "0.5.16.post1", "0.5.12rc1"])
def test_an_unread_release_inside_a_range_gets_its_rules_and_is_told(version: str) -> None:
    profile = resolve("sglang", version)
    rng = next(r for r in SGLANG_RANGES if r.verified == profile.verified)
    assert version not in rng.releases
    (note,) = profile.notes(version)
    span = rng.releases[0] if len(rng.releases) == 1 else f"{rng.releases[0]} to {rng.releases[-1]}"
    assert note == (
        f"SGLang {version} was not read itself: the rules read from its release range "
        f"({span}) are assumed"
    )
    result = decide(
        request((9, 0), engine=("sglang", version)), DecisionInputs(rules=SEED_RULES), now=NOW
    )
    assert isinstance(result, Decision) and note in result.messages


def test_releases_before_the_flag_get_no_flags_and_no_unread_note() -> None:
    """Older than the first release with the flag: no flags and why, not a claim that
    some range's rules were read for it."""
    for version in ("0.4.9.post4", "0.4.8"):
        assert resolve("sglang", version) is SGLANG_UNVERIFIED
        assert SGLANG_UNVERIFIED.notes(version) == []


@pytest.mark.parametrize("release", ["0.5.9", "0.5.16", "0.5.23"])
@pytest.mark.parametrize("cap", [(10, 0), (10, 3)])
@pytest.mark.parametrize("dims", [(128, 64, 256), (192, 64, 128)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fa4_is_not_answered_for_head_dims_its_flash_attention_4_refuses(
    release: str, cap: tuple[int, int], dims: tuple[int, int, int], dtype: str
) -> None:
    """FlashAttention 4 on SM100 takes (qk, v) up to 128, (192, 128), (256, 256) (and
    the absorbed 512 shapes): (192, 256) and dots.llm3's (256, 128) assert at the first
    prefill, so fa4 is neither chosen nor honoured when asked for, and the reason says
    why (read from the vendored FA4 from 0.5.16, held to it before)."""
    engine = ("sglang", release)
    chosen = decide(
        request(cap, dims, dtype, engine=engine), DecisionInputs(rules=SEED_RULES), now=NOW
    )
    if isinstance(chosen, Decision):
        assert chosen.backend is not Backend.FLASH_ATTN
        assert "fa4" not in chosen.engine_args
    asked = request(cap, dims, dtype, engine=engine, requested_backend="FLASH_ATTN", strict=True)
    refusal = decide(asked, DecisionInputs(rules=SEED_RULES), now=NOW)
    assert isinstance(refusal, Refusal) and refusal.kind == "requested_invalid"
    qk_v = (dims[0] + dims[1], dims[2])
    assert f"SGLang {release} runs FLASH_ATTN prefill on 10.x as fa4" in refusal.message
    assert f"(model: {qk_v}" in refusal.message


def test_each_range_takes_the_fa4_head_dims_its_tables_read() -> None:
    """A range holds fa4 to the FA4 its releases vendor (the tables' ``fa4_head_dims``,
    run from ``_validate_head_dims``), or has none where they vendor none."""
    for rng in SGLANG_RANGES:
        for release in rng.releases:
            fact = tables()[release]["facts"]["fa4_head_dims"]
            if fact["value"] is None:
                assert rng.fa4_head_dims is None, release
                continue
            sm100 = fact["value"]["10"]
            assert rng.fa4_head_dims is not None, release
            assert sm100["up_to"] == rng.fa4_head_dims.up_to, release
            assert {tuple(p) for p in sm100["also"]} == rng.fa4_head_dims.also, release
