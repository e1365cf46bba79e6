"""A fleet read's budget (``SWITCHBOARD_FLEET_READ_BUDGET_S``) is CPU time, as its
setting says: the fleet-read thread runs at a lower priority than the event loop and
hands it the interpreter between groups, so on a busy replica a read can take several
times its CPU in wall time, and that wait is not the read's cost."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import pytest
from mla_switchboard.core.evaluator import DecisionInputs
from mla_switchboard.core.evidence import EvidenceIndex
from mla_switchboard.core.schemas import SEED_RULES, SelectRequest
from mla_switchboard.service.fleet.groups import Deadline, FleetSnapshot, OverBudget
from mla_switchboard.service.fleet.reads import FleetReads, ReadSettings
from mla_switchboard.service.state import PodState

from tests.service.test_select_decisions import body


def burn(cpu_s: float) -> None:
    """Spend ``cpu_s`` of this thread's CPU time."""
    until = time.thread_time() + cpu_s
    while time.thread_time() < until:
        pass


def test_a_deadline_counts_the_threads_cpu_not_the_wall_clock() -> None:
    deadline = Deadline(0.2)
    time.sleep(0.4)  # twice the budget of wall time, no CPU
    deadline.check()
    burn(0.25)
    with pytest.raises(OverBudget, match="CPU time"):
        deadline.check()


def test_no_budget_is_no_limit() -> None:
    deadline = Deadline(None)
    burn(0.01)
    deadline.check()


class Trusted:
    """The evidence hook of a read: waits (a slow, busy replica) or works (CPU)."""

    def __init__(self, wait_s: float = 0.0, work_s: float = 0.0) -> None:
        self.wait_s, self.work_s = wait_s, work_s
        self.index = EvidenceIndex()
        self.waited_s = 0.0  # what the read spent waiting here, all clusters together

    def inputs_for(
        self, request: SelectRequest, inputs: DecisionInputs, now: datetime
    ) -> DecisionInputs:
        time.sleep(self.wait_s)
        self.waited_s += self.wait_s
        burn(self.work_s)
        return replace(inputs, evidence=self.index)

    def of_cluster(self, cluster: str) -> EvidenceIndex:
        return self.index


@dataclass
class Snapshots:
    snap: FleetSnapshot

    def current(self) -> FleetSnapshot:
        return self.snap

    def kept(self) -> FleetSnapshot:
        return self.snap


class Quiet:
    pending = 0


def reads(trusted: Trusted, budget_s: float) -> FleetReads:
    pods = [
        PodState(f"c{i}", "n", f"p{i}", f"d{i}", "FLASH_ATTN", "priority", _json(f"c{i}"))
        for i in range(12)
    ]
    inputs = DecisionInputs(SEED_RULES)
    return FleetReads(
        Snapshots(FleetSnapshot.of_pods(pods, version=1)),  # type: ignore[arg-type]
        Quiet(),  # type: ignore[arg-type]
        trusted,  # type: ignore[arg-type]
        lambda: inputs,
        ReadSettings(budget_s, 3, 2),
    )


def _json(cluster: str) -> str:
    return SelectRequest.model_validate(body(cluster=cluster, pod="p")).model_dump_json()


def test_a_read_that_waits_past_its_budget_but_works_within_it_answers() -> None:
    """12 clusters, 0.1 s of waiting each: 1.2 s of wall time against a 0.5 s budget."""
    trusted = Trusted(wait_s=0.1)
    r = reads(trusted, budget_s=0.5)
    try:
        answer: Any = r.summary(None, None)
        assert trusted.waited_s > 0.5  # past the budget, and still answered
        assert sorted(answer.body["clusters"]) == sorted(f"c{i}" for i in range(12))
    finally:
        r.close()


def test_a_read_that_works_past_its_budget_is_over_budget() -> None:
    """12 clusters, 0.1 s of CPU each, against a 0.5 s budget."""
    r = reads(Trusted(work_s=0.1), budget_s=0.5)
    try:
        with pytest.raises(OverBudget, match="CPU time"):
            r.summary(None, None)
    finally:
        r.close()
