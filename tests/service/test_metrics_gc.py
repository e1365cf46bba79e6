"""The collector's pauses are timed: an operator reading a loop stall in
``switchboard_event_loop_lag_seconds`` can tell whether the garbage collector held the
process then, without a profiler."""

from __future__ import annotations

import gc

from mla_switchboard.service.metrics import Metrics


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
