"""The core's vLLM rules against every release's own answers.

Each ``tools/engine_profiles/data/vllm/<release>.json`` was produced by running that release's
own selection code (``python -m tools.engine_profiles.vllm``). For every release and
every situation of its grid this checks that the core's profile for that release:

- gives no reason against a backend exactly when the release accepts it (no answer the
  release rejects, no refusal where it accepts);
- end to end through the evaluator (our own spec with the release's rules), never
  answers a backend the release rejects and never refuses one it accepts, except the
  deliberate refusals in ``VLLM_EXCEPTIONS``, each of which must excuse at least one
  refusal in every release it names; honours a request the release and our own spec
  both accept, and under policy ``engine-default`` picks what the release itself would
  (where our spec allows it);
- passes the flag its range holds, which is the spelling the release's own argument
  parser took (and 0.20.2's refused).

The tables are read once per module and the decisions are pure function calls, so the
whole file runs in seconds.
"""

from __future__ import annotations

import itertools
import json
from functools import cache
from typing import Any

import pytest
from mla_switchboard.core.engine_rules.base import DeliberateRefusal, parse_version
from mla_switchboard.core.engine_rules.vllm import (
    VLLM_EXCEPTIONS,
    VLLM_LEGACY,
    VLLM_PROFILES,
    VLLM_RANGES,
    VllmRange,
)
from mla_switchboard.core.engines import ENGINES, resolve
from mla_switchboard.core.evaluator import Decision, DecisionInputs, Refusal, assess, decide
from mla_switchboard.core.schemas import SEED_RULES
from mla_switchboard.core.specs import (
    SPECS,
    Backend,
    Capability,
    Dtype,
    MLADims,
    SelectionContext,
)

from tests.core.conftest import NOW, override, request
from tools.engine_profiles import TABLES

TABLES_DIR = TABLES / "vllm"

PRIORITY = DecisionInputs(rules=SEED_RULES)
ENGINE_DEFAULT = DecisionInputs(
    rules=SEED_RULES, overrides=(override("*", policy="engine-default"),)
)


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def _range(release: str) -> VllmRange:
    (found,) = [r for r in VLLM_RANGES if release in r.releases]
    return found


@cache
def tables() -> dict[str, dict[str, Any]]:
    found = {}
    for path in TABLES_DIR.glob("*.json"):
        table = json.loads(path.read_text())
        found[table["release"]] = table
    return dict(sorted(found.items(), key=lambda kv: _key(kv[0])))


RELEASES = list(tables())


def _package_sets() -> dict[str, dict[str, str]]:
    """The tables' package sets as a request's ``packages``: torch (every spec needs it)
    and the kernel packages the set says are present."""
    (grid,) = {json.dumps(t["grid"]["packages"], sort_keys=True) for t in tables().values()}
    return {
        name: dict.fromkeys(("torch", *present), "1") for name, present in json.loads(grid).items()
    }


PACKAGES = _package_sets()


def _ctx(situation: dict[str, Any]) -> SelectionContext:
    major, minor = situation["capability"].split(".")
    return SelectionContext(
        capability=Capability(int(major), int(minor)),
        dims=MLADims(*situation["dims"]),
        dtype=Dtype(situation["dtype"]),
        packages=PACKAGES[situation["packages"]],
    )


def _accepts(situation: dict[str, Any], backend: Backend) -> bool:
    reasons = situation["backends"].get(backend.value)
    return reasons is not None and not reasons  # absent: the release's config rejects the name


def _request(situation: dict[str, Any], release: str, **extra: Any):  # type: ignore[no-untyped-def]
    major, minor = situation["capability"].split(".")
    return request(
        (int(major), int(minor)),
        tuple(situation["dims"]),
        situation["dtype"],
        PACKAGES[situation["packages"]],
        engine=("vllm", release),
        **extra,
    )


def test_every_release_from_0_21_has_a_table_and_one_range() -> None:
    assert RELEASES[0] == "0.21.0" and len(RELEASES) >= 2
    in_ranges = [r for vrange in VLLM_RANGES for r in vrange.releases]
    assert sorted(in_ranges, key=_key) == RELEASES, "every table in exactly one range"
    for newer, older in itertools.pairwise(VLLM_RANGES):
        assert older.until == newer.since  # contiguous, newest first
    assert VLLM_RANGES[0].until is None and VLLM_RANGES[-1].since == (0, 21, 0)
    for vrange in VLLM_RANGES:
        for release in vrange.releases:
            assert resolve("vllm", release).since == vrange.since


def test_each_table_is_the_releases_own_and_complete() -> None:
    for release, table in tables().items():
        assert table["engine"] == "vllm"
        assert table["sources"] and all(len(s["sha256"]) == 64 for s in table["sources"])
        grid = table["grid"]
        want = (
            len(grid["capabilities"]) * len(grid["dims"]) * len(grid["dtypes"])
            * len(grid["packages"])
        )  # fmt: skip
        assert len(table["situations"]) == want >= 500, release
        assert {"7.5", "9.0", "10.0", "12.1"} <= {s["capability"] for s in table["situations"]}


@pytest.mark.parametrize("release", RELEASES)
def test_profile_reasons_are_empty_exactly_when_the_release_accepts(release: str) -> None:
    table = tables()[release]
    profile = resolve("vllm", release)
    assert profile.notes(release) == []
    wrong_accepts: list[tuple[Any, ...]] = []
    wrong_refusals: list[tuple[Any, ...]] = []
    for s in table["situations"]:
        ctx = _ctx(s)
        for backend in Backend:
            ours = not profile.reasons(backend, ctx, release)
            theirs = _accepts(s, backend)
            where = (s["capability"], tuple(s["dims"]), s["dtype"], s["packages"], backend.value)
            if ours and not theirs:
                wrong_accepts.append((*where, s["backends"].get(backend.value)))
            elif theirs and not ours:
                wrong_refusals.append((*where, profile.reasons(backend, ctx, release)))
    assert not wrong_accepts, (
        f"{len(wrong_accepts)} answers vLLM {release} rejects: {wrong_accepts[:5]}"
    )
    assert not wrong_refusals, (
        f"{len(wrong_refusals)} refusals where vLLM {release} accepts: {wrong_refusals[:5]}"
    )


def _answers(release: str) -> list[tuple[Any, ...]]:
    """What a table says, without the release's own reason texts: the situations, which
    backends the release accepts in each and its automatic choice."""
    return [
        (
            s["capability"],
            tuple(s["dims"]),
            s["dtype"],
            s["packages"],
            tuple(sorted(b for b, r in s["backends"].items() if not r)),
            s["auto"],
        )
        for s in tables()[release]["situations"]
    ]


def _checked_twin(release: str) -> str | None:
    """An older release in the same range whose table gives the same answers: the
    evaluator is run end to end once per distinct table, which keeps this file fast."""
    since = resolve("vllm", release).since
    for older in RELEASES[: RELEASES.index(release)]:
        if resolve("vllm", older).since == since and _answers(older) == _answers(release):
            return older
    return None


@pytest.mark.parametrize("release", RELEASES)
def test_the_evaluator_answers_only_what_the_release_runs(release: str) -> None:
    """End to end, per situation: the priority policy, the engine's own default order,
    and a request for each backend the evaluator finds valid (a request it finds
    invalid falls back to the priority answer, which is already checked)."""
    table = tables()[release]
    flag = _range(release).flag
    profile = resolve("vllm", release)
    twin = _checked_twin(release)
    if twin is not None:
        # Same profile, same answers in every situation: the decisions are the twin's,
        # word for word but for the release in the labels, and were checked there.
        return
    for s in table["situations"]:
        ctx = _ctx(s)
        spec_ok = {b for b in Backend if not SPECS[b].validate(ctx)}
        valid = [b for b in spec_ok if not profile.reasons(b, ctx, release)]
        # A backend the release and our spec both accept is honoured when requested.
        assert set(valid) == {b for b in spec_ok if _accepts(s, b)}, (release, s)
        auto = s["auto"]
        for inputs, extra in (
            (PRIORITY, {}),
            (ENGINE_DEFAULT, {}),
            *((PRIORITY, {"requested_backend": b.value, "strict": True}) for b in valid),
        ):
            result = decide(_request(s, release, **extra), inputs, now=NOW)
            if isinstance(result, Refusal):
                assert not valid, (release, s, extra, result.message)
                assert not any(c.valid for c in result.candidates)
                continue
            name = result.backend.value
            assert _accepts(s, result.backend), (release, s, extra, name)
            assert result.engine_args == flag.args(name)
            assert dict(result.engine_env) == flag.environ(name)
            assert all(_accepts(s, c.backend) for c in result.candidates if c.valid)
            if "requested_backend" in extra:
                assert name == extra["requested_backend"], (release, s, result.messages)
            if inputs is ENGINE_DEFAULT and auto is not None and Backend(auto) in spec_ok:
                # the release's own automatic choice, where our spec lets it run here
                assert name == auto, (release, s, result.messages)
        if auto is None:  # the release starts with nothing here: neither do we answer
            assert not valid, (release, s)


# ------------------------------------------------------------------ end to end


def _excuse(release: str, backend: Backend, ctx: SelectionContext) -> DeliberateRefusal | None:
    version = parse_version(release)
    assert version is not None
    return next((e for e in VLLM_EXCEPTIONS if e.covers(backend, version, ctx)), None)


@cache
def _end_to_end(release: str) -> tuple[list[Any], list[Any], dict[int, int]]:
    """Through the evaluator, per situation of the release's table: the answers naming a
    backend the release rejects, the refusals of one it accepts that no deliberate
    refusal excuses, and how many refusals each exception (by index) excused."""
    twin = _checked_twin(release)
    if twin is not None:  # same profile, same table answers: the same verdicts
        return _end_to_end(twin)
    wrong: list[Any] = []
    needless: list[Any] = []
    used = dict.fromkeys(range(len(VLLM_EXCEPTIONS)), 0)
    for s in tables()[release]["situations"]:
        ctx = _ctx(s)
        where = (s["capability"], tuple(s["dims"]), s["dtype"], s["packages"])
        reasons = assess(_request(s, release), PRIORITY, NOW).reasons
        for backend in Backend:
            accepted = _accepts(s, backend)
            if not reasons[backend] and not accepted:
                wrong.append((*where, backend.value))
            if not accepted:
                continue
            result = decide(
                _request(s, release, requested_backend=backend.value, strict=True),
                PRIORITY,
                now=NOW,
            )
            honoured = isinstance(result, Decision) and result.backend is backend
            assert honoured is not bool(reasons[backend]), (release, s, backend)
            if honoured:
                continue
            excuse = _excuse(release, backend, ctx)
            if excuse is None:
                needless.append((*where, backend.value, reasons[backend]))
            else:
                used[VLLM_EXCEPTIONS.index(excuse)] += 1
    return wrong, needless, used


@pytest.mark.parametrize("release", RELEASES)
def test_end_to_end_no_answer_it_rejects_and_no_refusal_where_it_accepts(release: str) -> None:
    """Our spec and the release's rules together: 0 answers the release rejects, 0
    refusals of a backend it accepts (a strict request for it is honoured) except the
    deliberate refusals listed in VLLM_EXCEPTIONS."""
    wrong, needless, _ = _end_to_end(release)
    assert wrong == [], f"{len(wrong)} answers vLLM {release} rejects: {wrong[:5]}"
    assert needless == [], f"{len(needless)} refusals where vLLM {release} accepts: {needless[:5]}"


def test_each_deliberate_refusal_is_used_in_every_release_it_names() -> None:
    """No stale exception: each excuses at least one refusal in every release table
    inside its range, and says why at length."""
    for i, exception in enumerate(VLLM_EXCEPTIONS):
        assert len(exception.reason) > 80 and exception.reason.rstrip().endswith(".")
        named = [
            r
            for r in RELEASES
            if (exception.since is None or _key(r) >= exception.since)
            and (exception.until is None or _key(r) < exception.until)
        ]
        assert named, exception
        unused = [r for r in named if _end_to_end(r)[2][i] == 0]
        assert unused == [], f"{exception.backend} exception excuses nothing in {unused}"


# ---------------------------------------------------------------- the flag


@pytest.mark.parametrize("release", RELEASES)
def test_the_flag_is_what_the_releases_own_parser_takes(release: str) -> None:
    """The table's flag section is the release's EngineArgs parser, run: it takes the
    range's spelling for every name the release accepts, and parses it into that name;
    the names its config refuses it refuses too."""
    table = tables()[release]
    flag = _range(release).flag
    recorded = table["flag"]
    assert recorded["method"].startswith("run:")
    assert (recorded["option"], recorded["joined"], recorded["env"]) == (
        flag.option,
        flag.joined,
        flag.env,
    )
    assert recorded["spelling"] == flag.spelling == f"{flag.option}=NAME"
    for name, parsed in recorded["parsed"].items():
        if name in table["names"]["accepted"]:
            assert parsed == {"accepted": True, "value": name}, (release, name)
        else:
            assert not parsed["accepted"] and name in parsed["error"], (release, name)


def test_the_first_release_is_proven_by_the_one_before() -> None:
    """0.21.0's table holds the release before it, whose own parser refuses the flag for
    every name: the legacy profile (no flags) covers exactly the releases up to it."""
    first = tables()[RELEASES[0]]["flag"]["before"]
    assert _key(first["release"]) < VLLM_RANGES[-1].since
    assert first["parsed"] and not any(p["accepted"] for p in first["parsed"].values())
    assert all("mla_prefill_backend" in p["error"] for p in first["parsed"].values())
    assert VLLM_LEGACY.until == VLLM_RANGES[-1].since
    assert resolve("vllm", first["release"]) is VLLM_LEGACY


@pytest.mark.parametrize(
    ("version", "since", "flags"),
    [
        ("0.11.0", None, False),
        ("0.20.0", None, False),
        ("0.20.2", None, False),
        ("0.21.0", (0, 21, 0), True),
    ],
)
def test_old_releases_resolve_to_their_profile(version: str, since, flags: bool) -> None:  # type: ignore[no-untyped-def]
    profile = resolve("vllm", version)
    assert profile.since == since
    result = decide(request((9, 0), engine=("vllm", version)), PRIORITY, now=NOW)
    assert isinstance(result, Decision)
    assert bool(result.engine_args) is flags
    if not flags:
        option = VLLM_RANGES[-1].flag.option
        assert any(f"has no {option} (added in vLLM 0.21.0)" in m for m in result.messages)


def test_each_range_resolves_from_its_first_to_its_last_release() -> None:
    for vrange in VLLM_RANGES:
        first = ".".join(str(p) for p in vrange.since)
        for version in (first, *vrange.releases):
            profile = resolve("vllm", version)
            assert profile.since == vrange.since and profile.until == vrange.until
            assert profile.verified == vrange.releases[-1]
            assert profile.notes(version) == []


@pytest.mark.parametrize("version", ["0.35.0", "0.40.0", "1.0", "0.33.1"])
def test_an_unknown_newer_release_gets_the_newest_rules_and_is_told(version: str) -> None:
    """A release newer than every table is answered, with the newest range's rules and
    flags, and the answer says whose rules they are (a note, not a refusal)."""
    newest = VLLM_PROFILES[0]
    parsed = parse_version(version)
    if parsed is not None and parsed <= parse_version(newest.verified):  # type: ignore[operator]
        pytest.skip(f"{version} has been read since")
    assert resolve("vllm", version) is newest
    result = decide(request((9, 0), engine=("vllm", version)), PRIORITY, now=NOW)
    assert isinstance(result, Decision)
    want = (
        f"vLLM {version} is newer than the newest release whose rules were read "
        f"({newest.verified}): its rules are assumed"
    )
    assert want in result.messages
    assert result.engine_args == VLLM_RANGES[0].flag.args(result.backend.value)
    refusal = decide(request((9, 0), dtype="float32", engine=("vllm", version)), PRIORITY, now=NOW)
    assert isinstance(refusal, Refusal) and want in refusal.message


@pytest.mark.parametrize("version", ["0.28.1", "0.27.0.post1", "0.27.0.1", "0.22.0rc1", "0.31.1"])
def test_an_unread_release_inside_a_range_gets_its_rules_and_is_told(version: str) -> None:
    """A release that was never read (not a real one, or published since) but falls in
    a covered range gets that range's rules, and the answer says it was not read."""
    parsed = parse_version(version)
    assert parsed is not None
    (vrange,) = [
        r for r in VLLM_RANGES if parsed >= r.since and (r.until is None or parsed < r.until)
    ]
    assert version not in vrange.releases
    profile = resolve("vllm", version)
    assert profile.since == vrange.since and profile.until == vrange.until
    want = (
        f"vLLM {version} was not read itself: the rules read from its release range "
        f"({vrange.releases[0]} to {vrange.releases[-1]}) are assumed"
    )
    assert profile.notes(version) == [want]
    result = decide(request((9, 0), engine=("vllm", version)), PRIORITY, now=NOW)
    assert isinstance(result, Decision) and want in result.messages
    assert result.engine_args == vrange.flag.args(result.backend.value)
    refusal = decide(request((9, 0), dtype="float32", engine=("vllm", version)), PRIORITY, now=NOW)
    assert isinstance(refusal, Refusal) and want in refusal.message


def test_a_read_release_and_its_local_builds_get_no_note() -> None:
    for vrange in VLLM_RANGES:
        for release in vrange.releases:
            profile = resolve("vllm", release)
            assert profile.notes(release) == profile.notes(release + "+cu130") == []


def test_an_unreadable_version_gets_the_newest_rules_and_is_told() -> None:
    newest = VLLM_PROFILES[0]
    assert resolve("vllm", "x") is newest and resolve("vllm", None) is newest
    assert newest.notes(None) == [
        f"No vLLM version was given: the rules of vLLM {newest.verified}, the newest "
        "release read, are assumed"
    ]
    (note,) = newest.notes("x")
    assert "'x' cannot be read" in note and newest.verified in note


def test_reasons_name_the_engine_and_the_release() -> None:
    for vrange in VLLM_RANGES:
        release = vrange.releases[0]
        profile = resolve("vllm", release)
        ctx = SelectionContext(Capability(9, 0), MLADims(256, 64, 128), Dtype.FLOAT32, {})
        for backend in Backend:
            for reason in profile.reasons(backend, ctx, release):
                assert reason.startswith(f"vLLM {release} "), reason


def test_the_newer_release_note_is_generic() -> None:
    """Any engine's open-ended profile says when a release is newer than the one read."""
    for name, profiles in ENGINES.items():
        newest = profiles[0]
        newer = parse_version(newest.verified)
        if newer is None:  # switchboard's own kernels have no releases
            assert newest.notes("99.0.0") == []
            continue
        version = f"{newer[0]}.{newer[1] + 1}.0"
        assert resolve(name, version) is newest
        (note,) = newest.notes(version)
        assert note == (
            f"{newest.display} {version} is newer than the newest release whose rules were "
            f"read ({newest.verified}): its rules are assumed"
        )
        for older in profiles[1:]:
            assert older.notes(version) == []


@pytest.mark.parametrize("version", ["0.20.2", "0.23.0", "0.26.0", "0.33.0", "0.34.0", None])
@pytest.mark.parametrize("cap", [(9, 0), (10, 0)])
def test_minicpm3_is_built_without_mla_so_no_flag_is_named(
    version: str | None, cap: tuple[int, int]
) -> None:
    """vLLM builds MiniCPM3 (64, 32, 64) with plain Attention: no MLA prefill flag is
    read, so the answer names none and says why, instead of refusing every backend."""
    engine = ("vllm", version)
    result = decide(request(cap, (64, 32, 64), engine=engine), PRIORITY, now=NOW)
    assert isinstance(result, Decision), result
    assert result.engine_args == () and result.engine_env == ()
    assert any(
        "builds MiniCPM3 (MLA dims" in m and "with plain attention" in m and "no flag needed" in m
        for m in result.messages
    ), result.messages
    asked = request(cap, (64, 32, 64), engine=engine, requested_backend="FLASH_ATTN", strict=True)
    refusal = decide(asked, PRIORITY, now=NOW)
    assert isinstance(refusal, Refusal) and refusal.kind == "requested_invalid"
    assert "cannot be passed to the engine" in refusal.message


@pytest.mark.parametrize("version", ["garbage", "main", "", "1!0.34.0"])
def test_an_unreadable_version_is_answered_as_documented(version: str) -> None:
    """The wire contract carries it; the answer has the newest rules, says the version
    could not be read, and gives only the flags every release takes (none today)."""
    newest = VLLM_PROFILES[0]
    assert resolve("vllm", version) is newest
    result = decide(request((10, 0), engine=("vllm", version)), PRIORITY, now=NOW)
    assert isinstance(result, Decision), result
    assert result.engine_args == () and result.engine_env == ()
    note = (
        f"vLLM version {version!r} cannot be read: the rules of vLLM {newest.verified}, "
        "the newest release read, are assumed"
    )
    assert note in result.messages
    assert any(
        m.startswith(f"No engine flags are given: the vLLM version {version!r} cannot be read")
        for m in result.messages
    ), result.messages
    assert all("vLLM garbage" not in m and "vLLM main" not in m for m in result.messages)


def test_a_tagged_version_is_that_release() -> None:
    """``v0.34.0`` is how a git tag spells 0.34.0 (PEP 440 reads it so): its rules and
    flags, no note."""
    tagged = decide(request((10, 0), engine=("vllm", "v0.34.0")), PRIORITY, now=NOW)
    plain = decide(request((10, 0), engine=("vllm", "0.34.0")), PRIORITY, now=NOW)
    assert isinstance(tagged, Decision) and isinstance(plain, Decision)
    assert tagged.engine_args == plain.engine_args != ()
    assert tagged.messages == plain.messages
