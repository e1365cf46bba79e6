"""Whether the token issuers' keys are current: what ``/readyz`` and ``/metrics`` say
of them. A refresh that fails keeps the keys held in service (pods whose key is known
still boot), so the failure would otherwise be silent until a rotation: here it is a
gauge per issuer and a section of ``/readyz`` until a fetch succeeds."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mla_switchboard.service.identity.issuer_keys import IssuerKeys
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class IssuerKeysHealth(Collector):
    """``keys``: every issuer's keys by issuer URL, asked at each read (the OIDC
    provider's exist once discovery named them)."""

    def __init__(self, keys: Callable[[], Mapping[str, IssuerKeys]]) -> None:
        self._keys = keys

    def register(self, registry: CollectorRegistry) -> IssuerKeysHealth:
        registry.register(self)
        return self

    def readiness(self) -> dict[str, Any]:
        """``/readyz``'s ``issuer_keys`` section: per issuer, the keys held and whether
        the last refresh failed (since when, the kind of error)."""
        return {"issuer_keys": {issuer: keys.status() for issuer, keys in self._keys().items()}}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        failing = GaugeMetricFamily(
            "switchboard_issuer_keys_refresh_failing",
            "1 while the last fetch of a token issuer's keys failed (the keys held still serve)",
            labels=["issuer"],
        )
        held = GaugeMetricFamily(
            "switchboard_issuer_keys_held", "Signing keys held per token issuer", labels=["issuer"]
        )
        for issuer, keys in self._keys().items():
            status = keys.status()
            failing.add_metric([issuer], 1.0 if status["refresh_failing"] else 0.0)
            held.add_metric([issuer], float(status["keys"]))
        yield failing
        yield held
