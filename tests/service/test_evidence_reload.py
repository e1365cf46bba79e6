"""A report this replica applies while it rebuilds the evidence from the store is not
lost by the rebuild (it used to vanish until the next poll: "this replica at once")."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from mla_switchboard.core.evidence import Observation, Situation
from mla_switchboard.core.specs import Backend
from mla_switchboard.service.config import Settings
from mla_switchboard.service.runtime import Runtime

SITUATION = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", "{}", "switchboard")


def test_a_report_applied_during_a_reload_is_kept(tmp_path: Path) -> None:
    runtime = Runtime(Settings(database_url=f"sqlite:///{tmp_path / 'sb.db'}"))
    runtime.start()
    try:
        late = Observation(
            SITUATION, "FLASHINFER", "pod-a", 600.0, ok=True, cluster="c", at=datetime.now(UTC),
            source="m:late-report:0",
        )  # fmt: skip
        read = runtime.store.evidence

        def racing(since: datetime) -> list[Observation]:
            rows = read(since)  # the read's snapshot predates the report's commit
            runtime.add_evidence([late])  # ...which this replica applies meanwhile
            return rows

        runtime.store.evidence = racing  # type: ignore[method-assign]
        runtime.reload_evidence()
        stats = runtime.inputs.evidence.group(SITUATION)[Backend.FLASHINFER]
        assert stats.tflops == (600.0,)
        # and a report the read already has is not counted twice
        runtime.store.evidence = lambda since: [late]  # type: ignore[method-assign]
        runtime.add_evidence([late])
        runtime.reload_evidence()
        assert runtime.inputs.evidence.group(SITUATION)[Backend.FLASHINFER].tflops == (600.0,)
    finally:
        runtime.stop()
