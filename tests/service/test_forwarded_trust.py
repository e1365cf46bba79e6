"""Whose ``X-Forwarded-For`` names the client is the service's own setting
(``SWITCHBOARD_FORWARDED_ALLOW_IPS``), handed to uvicorn explicitly: never uvicorn's
default (which trusts ``::1`` too since 0.3x) nor its ``FORWARDED_ALLOW_IPS``
variable. The failure throttle counts wrong tokens by that address, so a peer that
is trusted by accident can spread its failures over forged addresses."""

from __future__ import annotations

import pytest
import uvicorn
from mla_switchboard.service.cli import proxy_options
from mla_switchboard.service.config import Settings


def _trusted(settings: Settings) -> list[str]:
    async def app(scope: object, receive: object, send: object) -> None:
        return None

    config = uvicorn.Config(app, **proxy_options(settings))
    return list(config.forwarded_allow_ips)


def test_only_ipv4_loopback_is_trusted_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")  # uvicorn's own variable: ignored
    assert _trusted(Settings()) == ["127.0.0.1"]


def test_the_setting_names_the_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_FORWARDED_ALLOW_IPS", "10.0.0.0/8, 192.168.1.7")
    assert _trusted(Settings()) == ["10.0.0.0/8", "192.168.1.7"]
