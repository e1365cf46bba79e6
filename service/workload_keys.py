"""The signing keys of one token issuer, kept and refreshed: a Kubernetes
service-account issuer (``WorkloadIssuer``) or the OIDC provider people sign in with
(service/oidc.py).

Where the keys come from (``WorkloadIssuer``): a JWKS file (an air-gapped cluster; it
is read again whenever its modification time changes), a JWKS URL, or the URL that
OIDC discovery at ``<issuer>/.well-known/openid-configuration`` names. A URL's keys are
fetched on first use and again when a token names a ``kid`` they lack (the API server
rotated its key), at most once per ``refetch_s`` so that tokens naming made-up kids
cannot make the service hammer the issuer, and once they are ``max_age_s`` old (a key
the issuer dropped stops being trusted).

Lookups run on worker threads (service/auth_workload.py): one lock per issuer, so a
burst of new pods makes one fetch, not one each.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jwt

MAX_DOCUMENT_BYTES = 1024 * 1024
FETCH_TIMEOUT_S = 5.0
WORKLOAD_ALGORITHMS = ("RS256", "ES256")
"""What a Kubernetes API server signs service-account tokens with."""


class KeySource(Protocol):
    """Where an issuer's keys are: a JWKS file, a JWKS URL, or OIDC discovery."""

    @property
    def issuer(self) -> str: ...
    @property
    def jwks_file(self) -> Path | None: ...
    @property
    def jwks_uri(self) -> str | None: ...
    @property
    def discovery_url(self) -> str: ...


@dataclass(frozen=True)
class KeyProblem:
    """Why no key could be found: ``status`` 401 (the token's fault) or 503 (the
    issuer's keys could not be had; the caller may retry)."""

    reason: str
    status: int = 401


def fetch_json(url: str) -> Any:
    """GET ``url`` as JSON (at most 1 MiB, 5 s); raises OSError or ValueError."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
        raw = response.read(MAX_DOCUMENT_BYTES + 1)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{url}: document over {MAX_DOCUMENT_BYTES} bytes")
    return json.loads(raw)


def parse_jwks(
    document: Any, algorithms: tuple[str, ...] = WORKLOAD_ALGORITHMS
) -> dict[str | None, jwt.PyJWK]:
    """The usable signing keys of a JWKS document by ``kid``: keys of ``algorithms``
    only (RS256 and ES256 by default); keys for other uses or algorithms are left out."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("not a JWKS document (no 'keys' list)")
    keys: dict[str | None, jwt.PyJWK] = {}
    for entry in document["keys"]:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        try:
            key = jwt.PyJWK(entry)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            continue
        if key.algorithm_name in algorithms:
            keys[entry.get("kid")] = key
    return keys


class IssuerKeys:
    """The keys of one issuer (``entry``: a ``WorkloadIssuer``, or any
    :class:`KeySource`). ``fetch``: how a URL's JSON is read (tests hand the real
    one a local server); ``clock``: monotonic seconds."""

    def __init__(
        self,
        entry: KeySource,
        *,
        algorithms: tuple[str, ...] = WORKLOAD_ALGORITHMS,
        refetch_s: float = 30.0,
        max_age_s: float = 3600.0,
        fetch: Callable[[str], Any] = fetch_json,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.entry = entry
        self.algorithms = algorithms
        self.refetch_s = refetch_s
        self.max_age_s = max_age_s
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str | None, jwt.PyJWK] | None = None
        self._loaded_at = 0.0
        self._fetched_at: float | None = None  # last attempt, successful or not
        self._file_stamp: tuple[int, int] | None = None
        self._jwks_uri = entry.jwks_uri
        self.fetches = 0  # how many times the keys were read (tests, metrics)

    def key(self, kid: str | None) -> jwt.PyJWK | KeyProblem:
        """The key a token's ``kid`` names (a token without one: the only key)."""
        with self._lock:
            if self.entry.jwks_file is not None:
                problem = self._read_file()
            else:
                problem = self._refresh_url(kid)
            keys = self._keys
            if keys is None:
                return problem or KeyProblem("issuer keys unavailable", 503)
            found = keys.get(kid)
            if found is None and kid is None and len(keys) == 1:
                found = next(iter(keys.values()))
            return found if found is not None else KeyProblem("unknown kid")

    def _read_file(self) -> KeyProblem | None:
        path = self.entry.jwks_file
        assert path is not None
        try:
            stat = path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp != self._file_stamp:
                self._keys = parse_jwks(json.loads(path.read_bytes()), self.algorithms)
                self._file_stamp = stamp
                self.fetches += 1
        except (OSError, ValueError):
            # keep the keys read before (a file being rewritten); none: unavailable
            return KeyProblem("issuer keys unavailable", 503)
        return None

    def _refresh_url(self, kid: str | None) -> KeyProblem | None:
        now = self._clock()
        keys = self._keys
        stale = keys is not None and now - self._loaded_at >= self.max_age_s
        unknown = keys is None or (kid not in keys and not (kid is None and len(keys) == 1))
        if not (stale or unknown):
            return None
        if self._fetched_at is not None and now - self._fetched_at < self.refetch_s:
            return None  # rate-limited: answer from what is held
        self._fetched_at = now
        try:
            if self._jwks_uri is None:
                self._jwks_uri = self._discover()
            self._keys = parse_jwks(self._fetch(self._jwks_uri), self.algorithms)
            self._loaded_at = now
            self.fetches += 1
        except (OSError, ValueError) as exc:
            if self._keys is None:
                return KeyProblem("issuer keys unavailable", 503)
            del exc  # keep the keys held: an issuer's hiccup must not refuse every pod
        return None

    def _discover(self) -> str:
        """The JWKS URL of OIDC discovery; its ``issuer`` must be ours (OIDC discovery
        1.0, section 4.3), else a redirect could hand us another issuer's keys."""
        document = self._fetch(self.entry.discovery_url)
        if not isinstance(document, dict):
            raise ValueError("discovery document is not an object")
        if document.get("issuer") != self.entry.issuer:
            raise ValueError("discovery document names another issuer")
        uri = document.get("jwks_uri")
        if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
            raise ValueError("discovery document has no jwks_uri")
        return uri
