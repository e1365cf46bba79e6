"""Every (backend, dims class, dtype) the spec accepts has run: on the capability the
project's GPU has, a passing result committed by ``bench/shape_sweep.py``
(``bench/results/h200/shapes.json``); on every other capability the spec accepts it
on, a written reason why no machine here can run it (``UNTESTED_MAJORS``). A spec
change that accepts a new shape, or a result that no longer matches the spec, fails
here, on a machine without a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.core.specs import SPECS, Backend, Capability, Dtype

from bench.shape_sweep import DIMS_CLASSES, DTYPES, UNTESTED_MAJORS, accepted, load

RESULTS = Path(__file__).resolve().parents[2] / "bench/results/h200/shapes.json"
MAJORS = (8, 9, 10, 11, 12)


@pytest.fixture(scope="module")
def sweep() -> dict[str, Any]:
    return load(RESULTS)


def _rows(sweep: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(r["backend"], r["dims_class"], r["dtype"]): r for r in sweep["rows"]}


def _accepted_everywhere() -> list[tuple[int, Backend, str, Dtype]]:
    return [
        (major, backend, name, dtype)
        for major in MAJORS
        for name, dims in DIMS_CLASSES.items()
        for dtype in DTYPES
        for backend in SPECS
        if not accepted(backend, Capability(major, 0), dims, dtype)
    ]


def test_the_sweep_ran_on_a_named_machine(sweep: dict[str, Any]) -> None:
    assert "H200" in sweep["machine"]["gpu"]
    assert sweep["machine"]["capability"] == "9.0"


def test_every_shape_accepted_on_the_tested_gpu_passed_there(sweep: dict[str, Any]) -> None:
    tested = int(sweep["machine"]["capability"].split(".")[0])
    rows = _rows(sweep)
    missing = [
        f"{backend} {name} {dtype}: "
        + str(rows.get((backend.value, name, dtype.value), {}).get("status", "no result"))
        for major, backend, name, dtype in _accepted_everywhere()
        if major == tested
        and rows.get((backend.value, name, dtype.value), {}).get("status") != "passed"
    ]
    assert not missing, "accepted by the spec on the GPU but not passed there: " + "; ".join(
        missing
    )


def test_every_other_capability_the_spec_accepts_on_says_why_it_is_untested(
    sweep: dict[str, Any],
) -> None:
    tested = int(sweep["machine"]["capability"].split(".")[0])
    unexplained = sorted(
        {major for major, *_ in _accepted_everywhere() if major != tested} - set(UNTESTED_MAJORS)
    )
    assert not unexplained, f"accepted on {unexplained}.x with no result and no reason"


def test_what_the_sweep_saw_refused_the_spec_still_refuses(sweep: dict[str, Any]) -> None:
    """The recorded refusals' words may change with the spec; a refusal that became an
    acceptance needs a passing result (the test above), and what ran must still be
    accepted, or the committed result no longer speaks for an answer."""
    cap = Capability(*map(int, sweep["machine"]["capability"].split(".")))
    for r in sweep["rows"]:
        dims = DIMS_CLASSES[r["dims_class"]]
        reasons = accepted(Backend(r["backend"]), cap, dims, Dtype(r["dtype"]))
        if r["status"] == "refused":
            assert reasons, f"accepted now, refused when the GPU ran: {r}"
        else:
            assert not reasons, f"the spec now refuses what ran: {r} ({reasons})"


def test_no_committed_result_failed(sweep: dict[str, Any]) -> None:
    failed = [r for r in sweep["rows"] if r["status"] not in ("passed", "refused")]
    assert not failed, failed
