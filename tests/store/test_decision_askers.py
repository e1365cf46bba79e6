"""Each decision keeps who asked for it, on both backends and through the decision log:
what the rollout guards count a report under (service/rollouts.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.decisions import decision_row
from mla_switchboard.service.store.recording.segments import Encoder, Reader, segment_name
from mla_switchboard.service.store.shapes import shape_of

REQUEST = {
    "device": {"name": "NVIDIA H200", "capability": [9, 0]},
    "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
    "dtype": "bfloat16",
}


def row(decision_id: str, pod: str, principal: str | None, verified: bool, at: datetime):  # type: ignore[no-untyped-def]
    request = SelectRequest.model_validate({**REQUEST, "cluster": "prod-east", "pod": pod})
    return decision_row(
        decision_id, at, request, "FLASHINFER", "priority", 1, shape_of(request), "a1", "{}",
        principal, verified,
    )  # fmt: skip


def test_the_asker_is_stored_read_back_and_logged(store: Store, tmp_path: Path) -> None:
    now = datetime.now(UTC)
    rows = [
        row("01AAAAAAAAAAAAAAAAAAAAAAA1", "serve-0", "workload:uid-0", True, now),
        row("01AAAAAAAAAAAAAAAAAAAAAAA2", "serve-1", "3fa2c1d0e9b8", False, now),
        row("01AAAAAAAAAAAAAAAAAAAAAAA3", "serve-1", "workload:uid-1", True, now + timedelta(1)),
        row("01AAAAAAAAAAAAAAAAAAAAAAA4", "serve-2", None, False, now),
    ]
    store.decisions.record_rows(rows)
    got = store.decisions.get_decision("01AAAAAAAAAAAAAAAAAAAAAAA1")
    assert got is not None and (got.principal, got.verified) == ("workload:uid-0", True)
    old = store.decisions.get_decision("01AAAAAAAAAAAAAAAAAAAAAAA4")
    assert old is not None and (old.principal, old.verified) == (None, False)
    # each pod's newest decision's asker: what a pod's samples count under
    assert store.decisions.askers("prod-east", ["serve-0", "serve-1", "serve-2", "gone"]) == {
        "serve-0": ("workload:uid-0", True),
        "serve-1": ("workload:uid-1", True),
        "serve-2": (None, False),
    }
    # the decision log keeps it: read back, each row is the one written
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    encoder = Encoder()
    data = encoder.new_segment(1) + b"".join(encoder.decision(i + 1, r) for i, r in enumerate(rows))
    (log_dir / segment_name(1)).write_bytes(data)
    assert [r for _, r in Reader(log_dir).read(1, 4, 10)] == rows
