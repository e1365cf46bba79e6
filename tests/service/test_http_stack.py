"""What every request through the FastAPI stack is spared.

FastAPI's native OpenTelemetry looks up the global tracer, meter and logger providers
(environment reads) on every request; the service's metrics are Prometheus, so the app
turns it off (service/api/app.py) and no request may consult them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from opentelemetry import _logs, metrics, trace

from tests.conftest import make_inprocess_client


def _counting(original: Callable[[], object], name: str, asked: list[str]) -> Callable[[], object]:
    def counting() -> object:
        asked.append(name)
        return original()

    return counting


def test_no_request_consults_opentelemetry(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    for module, name in (
        (trace, "get_tracer_provider"),
        (metrics, "get_meter_provider"),
        (_logs, "get_logger_provider"),
    ):
        monkeypatch.setattr(module, name, _counting(getattr(module, name), name, asked))
    with make_inprocess_client(sqlite_url) as client:  # type: ignore[attr-defined]
        asked.clear()  # what the start-up does is not per request
        assert client.get("/healthz").status_code == 200
        assert client.get("/v1/pods").status_code == 200
    assert asked == []
