"""The signing keys of one token issuer, kept and refreshed: a Kubernetes
service-account issuer (``WorkloadIssuer``) or the OIDC provider people sign in with
(service/identity/oidc.py).

Where the keys come from (``WorkloadIssuer``): a JWKS file (an air-gapped cluster; it
is read again whenever its modification time changes), a JWKS URL, or the URL that
OIDC discovery at ``<issuer>/.well-known/openid-configuration`` names.

A fetch is never on the path of a token whose key is known. Keys are fetched on first
use, again when a token names a ``kid`` they lack (the API server rotated its key), and
in the background once they are ``max_age_s`` old. At most one fetch per issuer runs at
a time, in a thread of its own; the next may start ``refetch_s`` after the last one
(doubling after each failure, up to ``backoff_max_s``), so tokens naming made-up kids
cannot make the service hammer the issuer, and a slow issuer cannot hold up pods whose
key is known. A token that needs the fetch waits for it (``wait_s``); only a few such
waiters are let in per issuer, so a flood of unknown kids cannot take every worker
thread. A failed refresh keeps the keys held (an issuer's hiccup must not refuse every
pod) and says so in :meth:`IssuerKeys.status` (``/readyz``) and ``/metrics``
until a fetch succeeds.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import jwt

log = logging.getLogger("switchboard.keys")

MAX_DOCUMENT_BYTES = 1024 * 1024
FETCH_TIMEOUT_S = 5.0
BACKOFF_MAX_S = 300.0
MIN_BACKOFF_S = 1.0
"""After a failed fetch, the next waits at least this (a zero refetch interval too)."""
MAX_WAITERS = 4
"""Tokens per issuer that may wait for a fetch at once; more answer 503 at once."""
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
    """GET ``url`` as JSON (at most 1 MiB, 5 s, redirects followed); raises OSError
    or ValueError. httpx, the client the rest of the service uses."""
    try:
        with (
            httpx.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=True) as client,
            client.stream("GET", url, headers={"Accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise ValueError(f"{url}: HTTP {response.status_code}")
            raw = b""
            for chunk in response.iter_bytes():
                raw += chunk
                if len(raw) > MAX_DOCUMENT_BYTES:
                    raise ValueError(f"{url}: document over {MAX_DOCUMENT_BYTES} bytes")
    except httpx.HTTPError as exc:
        raise OSError(f"{url}: {type(exc).__name__}") from exc
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
        backoff_max_s: float = BACKOFF_MAX_S,
        wait_s: float = FETCH_TIMEOUT_S + 1.0,
        fetch: Callable[[str], Any] = fetch_json,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.entry = entry
        self.algorithms = algorithms
        self.refetch_s = refetch_s
        self.max_age_s = max_age_s
        self.backoff_max_s = backoff_max_s
        self.wait_s = wait_s
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()  # bookkeeping only: never held across a fetch
        self._waiters = threading.BoundedSemaphore(MAX_WAITERS)
        self._keys: dict[str | None, jwt.PyJWK] | None = None  # replaced whole
        self._loaded_at = 0.0
        self._next_fetch_at = 0.0  # when the next fetch may start
        self._failures = 0  # fetches failed in a row
        self._inflight: threading.Event | None = None
        self._file_stamp: tuple[int, int] | None = None
        self._jwks_uri = entry.jwks_uri
        self.failing_since: float | None = None  # clock() of the first failure in a row
        self.last_error: str | None = None
        self.fetches = 0  # how many times the keys were read (tests, metrics)

    def key(self, kid: str | None) -> jwt.PyJWK | KeyProblem:
        """The key a token's ``kid`` names (a token without one: the only key)."""
        if self.entry.jwks_file is not None:
            with self._lock:
                problem = self._read_file()
            found = _lookup(self._keys, kid)
            if found is not None:
                return found
            return problem or KeyProblem("unknown kid")
        found = _lookup(self._keys, kid)
        if found is not None:
            if self._clock() - self._loaded_at >= self.max_age_s:
                self._start_fetch()  # in the background: the held key still serves
            return found
        return self._wait_for_fetch(kid)

    def refresh(self, *, wait: bool = False) -> None:
        """Fetch again when the rate limit allows (an ID token without a ``kid`` failed
        its signature check: the provider may have rotated its only key); ``wait``: until
        that fetch is done (``wait_s`` at most)."""
        event = self._start_fetch()
        if wait and event is not None:
            event.wait(self.wait_s)

    def status(self) -> dict[str, Any]:
        """What ``/readyz`` says of these keys: how many are held and whether the last
        refresh failed (since when, why: the kind of error, never a key)."""
        failing = self.failing_since
        return {
            "keys": len(self._keys or ()),
            "refresh_failing": failing is not None,
            "refresh_failing_for_s": None if failing is None else round(self._clock() - failing, 1),
            "refresh_error": self.last_error,
        }

    def _wait_for_fetch(self, kid: str | None) -> jwt.PyJWK | KeyProblem:
        """A key not held: wait for a fetch (started here, or one in flight) unless the
        last fetch was too recent; a few waiters at most per issuer."""
        event = self._start_fetch()
        if event is not None:
            if not self._waiters.acquire(blocking=False):
                return KeyProblem("issuer keys are being fetched; retry", 503)
            try:
                event.wait(self.wait_s)
            finally:
                self._waiters.release()
        keys = self._keys
        found = _lookup(keys, kid)
        if found is not None:
            return found
        if keys is None:
            return KeyProblem("issuer keys unavailable", 503)
        return KeyProblem("unknown kid")

    def _start_fetch(self) -> threading.Event | None:
        """The fetch in flight, or a new one when one may start now; None when the
        last one was too recent (rate limit, backoff)."""
        with self._lock:
            if self._inflight is not None:
                return self._inflight
            if self._clock() < self._next_fetch_at:
                return None
            event = self._inflight = threading.Event()
        name = f"jwks-fetch {self.entry.issuer}"[:60]
        threading.Thread(target=self._fetch_once, args=(event,), name=name, daemon=True).start()
        return event

    def _fetch_once(self, event: threading.Event) -> None:
        try:
            if self._jwks_uri is None:
                self._jwks_uri = self._discover()
            keys = parse_jwks(self._fetch(self._jwks_uri), self.algorithms)
        except (OSError, ValueError) as exc:
            self._failed(exc)
        else:
            with self._lock:
                self._keys = keys
                self._loaded_at = self._clock()
                self._failures = 0
                self.failing_since = self.last_error = None
                self._next_fetch_at = self._loaded_at + self.refetch_s
                self.fetches += 1
        finally:
            with self._lock:
                self._inflight = None
            event.set()

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            now = self._clock()
            self._failures += 1
            delay = min(self.refetch_s * 2 ** (self._failures - 1), self.backoff_max_s)
            self._next_fetch_at = now + max(delay, self.refetch_s, MIN_BACKOFF_S)
            if self.failing_since is None:
                self.failing_since = now
            self.last_error = type(exc).__name__
        log.warning(
            "keys of issuer %s could not be refreshed (%s, %d in a row); %s",
            self.entry.issuer,
            type(exc).__name__,
            self._failures,
            "serving the keys held" if self._keys else "none held",
        )

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


def _lookup(keys: dict[str | None, jwt.PyJWK] | None, kid: str | None) -> jwt.PyJWK | None:
    if keys is None:
        return None
    found = keys.get(kid)
    if found is None and kid is None and len(keys) == 1:
        found = next(iter(keys.values()))
    return found
