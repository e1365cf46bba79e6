"""A Kubernetes service-account issuer for tests: OIDC discovery and a JWKS served over
real HTTP by a small threaded server, RSA keys it can add, publish and withdraw (key
rotation), and tokens shaped like the kubelet's projected service-account tokens."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

AUDIENCE = "switchboard"


class TestIssuer:
    """``url`` is the issuer (the tokens' ``iss``); ``hits`` counts requests by path."""

    __test__ = False  # not a test class, whatever pytest's name rule says

    def __init__(self) -> None:
        self._private: dict[str, rsa.RSAPrivateKey] = {}
        self.published: list[str] = []
        self.hits: Counter[str] = Counter()
        # the JWKS endpoint waits for this gate (a slow or hung issuer) and answers
        # ``jwks_status`` (500: an issuer failing its refreshes)
        self.jwks_gate = threading.Event()
        self.jwks_gate.set()
        self.jwks_status = 200
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                issuer.hits[self.path] += 1
                if self.path == "/.well-known/openid-configuration":
                    body: Any = {
                        "issuer": issuer.url,
                        "jwks_uri": issuer.url + "/openid/v1/jwks",
                        "id_token_signing_alg_values_supported": ["RS256"],
                        # what an OIDC provider's discovery names besides (people's
                        # sign-in reads them; this issuer answers neither)
                        "authorization_endpoint": issuer.url + "/authorize",
                        "token_endpoint": issuer.url + "/token",
                    }
                elif self.path == "/openid/v1/jwks":
                    issuer.jwks_gate.wait(60)
                    if issuer.jwks_status != 200:
                        self.send_error(issuer.jwks_status)
                        return
                    body = issuer.jwks()
                else:
                    self.send_error(404)
                    return
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.jwks_gate.set()
        self._server.shutdown()
        self._server.server_close()

    @classmethod
    def serving(cls) -> Iterator[TestIssuer]:
        """An issuer with one published key, ``k1``, closed after: a fixture's body."""
        served = cls()
        served.add_key("k1")
        yield served
        served.close()

    def add_key(self, kid: str, publish: bool = True) -> str:
        self._private[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if publish:
            self.publish(kid)
        return kid

    def publish(self, kid: str) -> None:
        if kid not in self.published:
            self.published.append(kid)

    def withdraw(self, kid: str) -> None:
        self.published.remove(kid)

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid in self.published:
            jwk = RSAAlgorithm.to_jwk(self._private[kid].public_key(), as_dict=True)
            keys.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": keys}

    def write_jwks(self, path: Path) -> Path:
        path.write_text(json.dumps(self.jwks()))
        return path

    def token(
        self,
        pod: str = "serve-0",
        *,
        kid: str | None = None,
        audience: str = AUDIENCE,
        issuer: str | None = None,
        expires_in: float = 3600,
        not_before_in: float | None = None,
        namespace: str = "inference",
        pod_uid: str | None = None,
        claims: dict[str, Any] | None = None,
        name_kid: bool = True,
    ) -> str:
        """A projected service-account token as the kubelet mounts it, signed by
        ``kid`` (default: the first key); ``name_kid=False``: its header names no kid,
        as some OIDC providers' ID tokens."""
        kid = kid or next(iter(self._private))
        now = int(time.time())
        body: dict[str, Any] = {
            "aud": [audience],
            "exp": int(now + expires_in),
            "iat": now,
            "iss": issuer or self.url,
            "nbf": int(now + not_before_in) if not_before_in is not None else now,
            "sub": f"system:serviceaccount:{namespace}:switchboard-agent",
            "kubernetes.io": {
                "namespace": namespace,
                "node": {"name": "gpu-node-1", "uid": str(uuid.uuid4())},
                "pod": {"name": pod, "uid": pod_uid or str(uuid.uuid4())},
                "serviceaccount": {"name": "switchboard-agent", "uid": str(uuid.uuid4())},
            },
        }
        body.update(claims or {})
        headers = {"kid": kid} if name_kid else None
        return jwt.encode(body, self._private[kid], algorithm="RS256", headers=headers)
