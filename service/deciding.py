"""``/v1/select``'s work once the caller is authorised: decide from the inputs in
force, hand the decision to the writer, count it. Both the FastAPI route and the lean
ASGI handler in front of it (``service/api/select_asgi.py``) call it and only format
its result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from mla_switchboard.core.evaluator import DecisionInputs, Refusal
from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.service.ids import new_id
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.selector import Rendered, Selector
from mla_switchboard.service.state import UNKNOWN_ASKER, Asker
from mla_switchboard.service.store.decisions import decision_row
from mla_switchboard.service.store.recorder import DecisionRecorder


@dataclass(eq=False)
class Decider:
    """``inputs``: the decision inputs in force."""

    selector: Selector
    inputs: Callable[[], DecisionInputs]
    recorder: DecisionRecorder
    metrics: Metrics

    def decide(
        self, body: SelectRequest, dry_run: bool = False, asker: Asker = UNKNOWN_ASKER
    ) -> tuple[Rendered | Refusal, str | None]:
        """The decision (or refusal) and the id it is recorded under. A dry run decides
        and records and counts nothing (id None): a laptop trying a flag is not a pod
        of the fleet. A decision the recorder could not keep (memory at its budget
        and the spill file full or unwritable) has no id either: its answer says
        ``recorded: false`` rather than give an id a failure report would not find."""
        inputs = self.inputs()
        result = self.selector.select(body, inputs)
        if isinstance(result, Refusal):
            if not dry_run:
                self.metrics.refusals_of(result.kind).inc()
            return result, None
        if dry_run:
            return result, None
        decision_id = new_id()
        decision = result.decision
        kept = self.recorder.submit(
            decision_row(
                decision_id,
                datetime.now(UTC),
                body,
                result.backend,
                decision.source,
                inputs.rules.revision or 0,
                result.shape,
                result.answer_id,
                result.answer_json,
                asker.principal,
                asker.verified,
            )
        )
        self.metrics.decisions.labels(result.backend, decision.source, body.cluster).inc()
        # not kept: no id that a failure report would find missing (``recorded: false``)
        return result, decision_id if kept else None
