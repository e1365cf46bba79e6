"""A real OpenID provider for the sign-in tests: ``oidc-provider-mock`` as its own
process on a free port, and a real ``switchboard serve`` configured to use it.

The provider signs ID tokens with its own RSA key (published at its JWKS), takes any
client id, and lets a test set each person's claims (``PUT /users/<sub>``) and sign in
as them by posting its authorization form (``sub=<subject>``), as its page does."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx

from tests.conftest import ServiceProcess, free_port

PROVIDER_NAME = "Mock IdP"
MAPPING = [
    {"group": "platform-admins", "role": "admin", "clusters": ["*"]},
    {"group": "team-a", "role": "viewer", "clusters": ["prod-*"]},
]


class Provider:
    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log = (log_dir / f"oidc-provider-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oidc_provider_mock", "-p", str(self.port), "-n", "true"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> Provider:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "oidc-provider-mock exited"
            try:
                if httpx.get(self.url + "/.well-known/openid-configuration").status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("oidc-provider-mock did not start")

    def person(self, sub: str, email: str, groups: list[str]) -> None:
        r = httpx.put(
            f"{self.url}/users/{quote(sub)}",
            json={"email": email, "email_verified": True, "groups": groups},
        )
        assert r.status_code == 204, r.text

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def service_env(service: ServiceProcess, provider: Provider) -> dict[str, str]:
    return {
        "SWITCHBOARD_OIDC_ISSUER": provider.url,
        "SWITCHBOARD_OIDC_CLIENT_ID": "switchboard-console",
        # the mock takes any secret; it offers public clients (PKCE alone) no token
        "SWITCHBOARD_OIDC_CLIENT_SECRET": "console-secret",
        "SWITCHBOARD_OIDC_REDIRECT_URL": service.url + "/auth/callback",
        "SWITCHBOARD_OIDC_PROVIDER_NAME": PROVIDER_NAME,
        "SWITCHBOARD_OIDC_ROLE_MAPPING": json.dumps(MAPPING),
    }


def provider_and_service(log_dir: Path) -> Iterator[tuple[Provider, ServiceProcess]]:
    """Both processes, started at once (the service fetches the provider's discovery
    only at the first sign-in), stopped at the end."""
    provider = Provider(log_dir)
    service = ServiceProcess(f"sqlite:///{log_dir / 'switchboard.db'}")
    service.extra_env.update(service_env(service, provider))
    try:
        service.spawn(log_dir)
        yield provider.wait_ready(), service.wait_ready()
    finally:
        service.stop()
        provider.stop()
