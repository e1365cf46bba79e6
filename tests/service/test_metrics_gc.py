"""The collector's pauses are timed: an operator reading a loop stall in
``switchboard_event_loop_lag_seconds`` can tell whether the garbage collector held the
process then, without a profiler."""

from __future__ import annotations

import gc
from datetime import UTC, datetime
from pathlib import Path

from mla_switchboard.core.schemas import Override
from mla_switchboard.service.config import Settings
from mla_switchboard.service.fleet.reads import Proposal
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.runtime import Runtime

from bench.scale import (
    cluster_names,
    fill_decisions,
    make_fleet,
    open_store,
    scenario_overrides,
)
from tests.spill_paths import default_spill_path


def _collections(metrics: Metrics, generation: str) -> float:
    value = metrics.registry.get_sample_value(
        "switchboard_gc_pause_seconds_count", {"generation": generation}
    )
    return value or 0.0


def test_every_collection_is_timed_by_generation_until_stopped() -> None:
    metrics = Metrics()
    stop = metrics.watch_gc()
    try:
        gc.collect(0)
        gc.collect(2)
        assert _collections(metrics, "0") >= 1
        assert _collections(metrics, "2") >= 1
        total = metrics.registry.get_sample_value(
            "switchboard_gc_pause_seconds_sum", {"generation": "2"}
        )
        assert total is not None and 0 < total < 5
    finally:
        stop()
    seen = _collections(metrics, "2")
    gc.collect(2)
    assert _collections(metrics, "2") == seen
    stop()  # stopping twice is harmless


def test_the_family_is_in_the_exposition() -> None:
    metrics = Metrics()
    stop = metrics.watch_gc()
    try:
        gc.collect(1)
        text = metrics.render(None).decode()
    finally:
        stop()
    assert 'switchboard_gc_pause_seconds_count{generation="1"}' in text


def test_fleet_reads_set_off_few_collections(tmp_path: Path) -> None:
    """A preview makes and frees thousands of objects; a replica's collector must not
    run for each burst (at CPython's default threshold, about 8 collections a preview,
    each holding the event loop too)."""
    url = f"sqlite:///{tmp_path / 'sb.db'}"
    store = open_store(url)
    for cluster, spec in scenario_overrides(cluster_names(10)).items():
        store.config.put_override(cluster, spec, actor="t", if_match=None, preview=None)
    fleet = make_fleet(300, 10)
    fill_decisions(store, fleet, 2)
    store.engine.dispose()
    runtime = Runtime(Settings(database_url=url, spill_path=default_spill_path(url)))
    runtime.start()
    counted = [0]

    def count(phase: str, _info: dict[str, int]) -> None:
        counted[0] += phase == "start"

    gc.callbacks.append(count)
    try:
        for i in range(30):
            override = Override.model_validate(
                {"cluster": "*", "deny": ["FLASHINFER"], "note": f"n{i}", "revision": 0,
                 "created_at": datetime.now(UTC), "created_by": "t"}
            )  # fmt: skip
            runtime.reads.preview(Proposal(override_scope="*", override=override), None, None)
    finally:
        gc.callbacks.remove(count)
        runtime.stop()
    assert counted[0] < 30, counted[0]
