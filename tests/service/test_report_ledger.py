"""The ledger that keeps a replica from counting a report twice: once applied by its
own route, once returned by a store read, in either order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mla_switchboard.core.evidence import Observation
from mla_switchboard.core.evidence.situations import Situation
from mla_switchboard.service.evidence.ledger import RECENT_S, ReportLedger

S = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", "{}", "switchboard")
NOW = datetime(2026, 12, 5, 12, tzinfo=UTC)


def _obs(source: str, backend: str = "FLASH_ATTN") -> Observation:
    return Observation(S, backend, "pod-1", 500.0, ok=True, at=NOW, source=source)


def test_a_report_applied_here_is_not_applied_again_when_a_read_returns_it() -> None:
    ledger = ReportLedger(lambda: NOW)
    mine = [_obs("m:r1:0"), _obs("m:r1:1", "FLASHINFER")]
    assert ledger.apply_here(mine) == mine
    assert ledger.local_report_ids() == {"r1"}
    read = [*mine, _obs("m:r2:0")]
    assert ledger.not_applied_here(read) == [read[2]]  # the other replica's only
    ledger.met({"m:r1": NOW, "m:r2": NOW})
    assert ledger.local_report_ids() == set()


def test_a_report_a_read_returned_is_not_applied_again_by_a_late_route() -> None:
    ledger = ReportLedger(lambda: NOW)
    ledger.met({"m:r3": NOW})
    assert ledger.apply_here([_obs("m:r3:0")]) == []
    assert ledger.local_report_ids() == set()


def test_an_old_read_is_not_remembered_and_sourceless_observations_always_count() -> None:
    ledger = ReportLedger(lambda: NOW)
    ledger.met({"m:old": NOW - timedelta(seconds=RECENT_S + 1), "m:undated": None})
    assert ledger.apply_here([_obs("m:old:0")]) != []  # stored long ago: not a late route
    assert ledger.apply_here([_obs("m:undated:0")]) == []  # no time: remembered
    anonymous = [_obs(""), _obs("")]
    assert ledger.apply_here(anonymous) == anonymous
    assert ledger.not_applied_here(anonymous) == anonymous
