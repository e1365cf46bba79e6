"""Talk to the Switchboard service within a hard deadline.

A pod must never wait on the service longer than its deadline, whatever the
network does: DNS that hangs, a SYN that is dropped, a server that accepts and
never answers. httpx's timeouts cover each socket operation but not DNS and not
the sum of them, so the whole exchange runs in a daemon thread and the caller
stops waiting when the deadline passes (the thread ends on its own timeouts and
its late answer is dropped).

Retries: connection and transport errors, 429 and 5xx are retried with exponential
backoff and full jitter (honouring ``Retry-After``); the service URLs are tried in
turn within each round, so a dead first replica costs one refused connection. A 4xx
is an answer, not an outage, and is never retried.
"""

from __future__ import annotations

import email.utils
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
from mla_switchboard.agent.settings import URL, BearerToken, bearer_of
from mla_switchboard.core.schemas import SelectRequest, SelectResponse
from mla_switchboard.core.version import __version__
from pydantic import ValidationError

__all__ = [
    "AskResult",
    "PostResult",
    "ServiceRefused",
    "ServiceUnavailable",
    "ask_service",
    "parse_urls",
    "post_json",
    "report_failure",
]

BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 0.5
FIRST_TRY_S = 0.1
"""The least time one attempt gets, so that every call tries the service at least once."""
USER_AGENT = f"switchboard-agent/{__version__}"

T = TypeVar("T")


class ServiceUnavailable(Exception):
    """No usable answer from any service URL before the deadline."""

    def __init__(self, message: str, attempts: list[str] | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts or []


class ServiceRefused(Exception):
    """The service answered with a 4xx: an answer about the request, not an outage."""

    def __init__(self, status: int, detail: Any, url: str) -> None:
        self.status = status
        self.detail = detail
        self.url = url
        super().__init__(f"{url} answered HTTP {status}: {_detail_text(detail)}")

    @property
    def message(self) -> str:
        return _detail_text(self.detail)

    @property
    def about_the_token(self) -> bool:
        """401/403: the pod's token is missing, unknown, revoked, of the wrong role or
        limited to other clusters: a configuration error, not an answer."""
        return self.status in (401, 403)

    @property
    def candidates(self) -> list[dict[str, Any]]:
        if isinstance(self.detail, dict) and isinstance(self.detail.get("candidates"), list):
            return self.detail["candidates"]
        return []

    @property
    def kind(self) -> str:
        """A 409's kind: ``requested_invalid`` or ``no_valid_backend``."""
        if isinstance(self.detail, dict) and isinstance(self.detail.get("kind"), str):
            return self.detail["kind"]
        return "no_valid_backend"


@dataclass
class AskResult:
    """The service's answer. ``response`` is None for 304 (the cached answer holds)."""

    url: str
    response: SelectResponse | None
    etag: str | None
    decision_id: str | None
    attempts: list[str] = field(default_factory=list)


def parse_urls(value: str, source: str = "--url") -> list[str]:
    """``http://a,http://b`` (``--url``, or ``source`` such as ``$SWITCHBOARD_URL``) as
    a list, trailing slashes dropped.

    Raises ValueError for a URL that is not ``http(s)://host[:port][/path]``: httpx
    would reject ``127.0.0.1:18000`` on every attempt, and the pod would spend its
    whole deadline retrying a typo before falling back.
    """
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    for url in urls:
        problem = _url_problem(url)
        if problem:
            raise ValueError(f"{source}: {url!r} {problem}")
    return urls


def _url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a service URL, or None."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return "has no http:// or https:// scheme (e.g. http://127.0.0.1:8000)"
    host = rest.split("/", 1)[0]
    if not host or host.startswith(":") or any(c.isspace() for c in url):
        return "names no host (e.g. http://switchboard:8000)"
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        return f"is not a valid URL ({exc})"
    return None


def _detail_text(detail: Any) -> str:
    if isinstance(detail, dict) and "message" in detail:
        return str(detail["message"])
    return str(detail)[:500]


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` as seconds, from either of its forms (delta or HTTP date)."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _headers(source: BearerToken, etag: str | None = None) -> dict[str, str]:
    """One request's headers; a token file is read now (the kubelet rotates it)."""
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    token = bearer_of(source)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if etag:
        headers["If-None-Match"] = etag
    return headers


def _verify(urls: Sequence[str]) -> bool:
    """TLS verification only when some URL is https.

    Building httpx's default SSL context (certifi's bundle) costs about 60 ms here,
    more than the whole exchange with a service on the LAN; a plain-http URL list
    never uses it, and redirects (the only way to reach https from there) are not
    followed. An https URL gets full verification.
    """
    return any(u.lower().startswith("https:") for u in urls)


def run_within(fn: Callable[[threading.Event], T], timeout: float) -> tuple[bool, T | None]:
    """Run ``fn`` in a daemon thread; (finished, result). The event tells ``fn`` that
    nobody waits any more, so that it stops retrying. Exceptions propagate."""
    box: dict[str, Any] = {}
    abandoned = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn(abandoned)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="switchboard-ask", daemon=True)
    thread.start()
    thread.join(max(0.0, timeout))
    if thread.is_alive():
        abandoned.set()
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box["value"]


def _rounds(
    client: httpx.Client,
    path: str,
    body: dict[str, Any],
    urls: Sequence[str],
    deadline_at: float,
    abandoned: threading.Event,
    attempts: list[str],
    accept: Callable[[str, httpx.Response], T | None],
) -> T:
    """POST to ``urls`` in turn, in rounds with backoff, until ``accept`` takes an answer.

    ``accept`` sees every 2xx/3xx answer and returns the result, or None to try the next
    URL (it notes why in ``attempts``). Transport errors, 429 and 5xx move on to the next
    URL; another 4xx is the service's final word (ServiceRefused, never retried).
    Between rounds: exponential backoff with full jitter, at least Retry-After.
    """
    round_no = 0
    while True:
        retry_after = 0.0
        for index, url in enumerate(urls):
            remaining = deadline_at - time.monotonic()
            if (remaining <= 0 and attempts) or abandoned.is_set():
                raise ServiceUnavailable("deadline passed", attempts)
            # Share what is left among the URLs not yet tried this round, so that
            # one hanging replica cannot eat the time of the others; the first URL is
            # always tried (briefly), so a failure says what went wrong, not only that
            # time ran out on a slow machine before anything was asked.
            budget = max(remaining / (len(urls) - index), FIRST_TRY_S)
            try:
                response = client.post(f"{url}{path}", json=body, timeout=budget)
            except httpx.TransportError as exc:
                attempts.append(f"{url}: {type(exc).__name__}: {exc}".rstrip(": "))
                continue
            status = response.status_code
            if status < 400:
                result = accept(url, response)
                if result is not None:
                    return result
                continue
            if status == 429 or status >= 500:
                attempts.append(f"{url}: HTTP {status}")
                retry_after = max(retry_after, _retry_after(response) or 0.0)
                continue
            try:
                data = response.json()
                detail = data.get("detail", data) if isinstance(data, dict) else data
            except ValueError:
                detail = response.text
            raise ServiceRefused(status, detail, url)
        round_no += 1
        backoff = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**round_no)
        delay = max(retry_after, random.uniform(0, backoff))
        if time.monotonic() + delay >= deadline_at:
            asked = f" (service asked to retry after {retry_after:.1f}s)" if retry_after else ""
            raise ServiceUnavailable("no answer before the deadline" + asked, attempts)
        if abandoned.wait(delay):
            raise ServiceUnavailable("deadline passed", attempts)


def _exchange(
    body: dict[str, Any],
    urls: Sequence[str],
    token: BearerToken,
    etag: str | None,
    deadline_at: float,
    abandoned: threading.Event,
    attempts: list[str],
    dry_run: bool = False,
) -> AskResult:
    def accept(url: str, response: httpx.Response) -> AskResult | None:
        status = response.status_code
        if status == 304 and etag is None:
            attempts.append(f"{url}: 304 to a request without If-None-Match")
            return None
        if status == 304:
            return AskResult(
                url,
                None,
                response.headers.get("ETag") or etag,
                response.headers.get("X-Decision-Id"),
                attempts,
            )
        if status != 200:
            attempts.append(f"{url}: unexpected HTTP {status}")
            return None
        try:
            parsed = SelectResponse.model_validate_json(response.content)
        except ValidationError as exc:
            attempts.append(f"{url}: unreadable 200 answer: {exc.errors()[:1]}")
            return None
        return AskResult(
            url,
            parsed,
            response.headers.get("ETag"),
            parsed.decision_id or response.headers.get("X-Decision-Id"),
            attempts,
        )

    path = "/v1/select?dry_run=true" if dry_run else "/v1/select"
    with httpx.Client(headers=_headers(token, etag), verify=_verify(urls)) as client:
        return _rounds(client, path, body, urls, deadline_at, abandoned, attempts, accept)


def ask_service(
    request: SelectRequest,
    *,
    urls: Sequence[str],
    token: BearerToken,
    deadline_s: float,
    etag: str | None = None,
    dry_run: bool = False,
) -> AskResult:
    """``POST /v1/select`` to ``urls`` in turn, retrying, for at most ``deadline_s``.
    ``dry_run``: the service decides and records nothing (a pretend GPU is no pod).

    Raises ServiceUnavailable (outage or deadline) or ServiceRefused (a 4xx answer).
    """
    if not urls:
        raise ServiceUnavailable(f"no service URL configured ({URL})")
    deadline_at = time.monotonic() + deadline_s
    body = request.model_dump(mode="json")
    attempts: list[str] = []  # shared with the thread, so a timeout can still say what failed
    finished, result = run_within(
        lambda abandoned: _exchange(
            body,
            urls,
            token,
            etag,
            deadline_at,
            abandoned,
            attempts,
            dry_run,
        ),
        deadline_s,
    )
    if not finished or result is None:
        raise ServiceUnavailable(f"no answer within the {deadline_s:g}s deadline", list(attempts))
    return result


def report_failure(
    decision_id: str,
    backend: str,
    error: str,
    *,
    urls: Sequence[str],
    token: BearerToken,
    timeout_s: float = 1.0,
) -> str | None:
    """Best-effort ``POST /v1/selections/{id}/failure``; None when recorded, else why not.

    Never raises and never blocks longer than ``timeout_s``: the pod is booting and a
    lost report costs less than a late boot.
    """
    if not urls:
        return "no service URL configured"
    payload = {"backend": backend, "error": error[:8000] or "unknown error"}
    deadline_at = time.monotonic() + timeout_s

    def send(abandoned: threading.Event) -> str | None:
        problems: list[str] = []
        with httpx.Client(headers=_headers(token), verify=_verify(urls)) as client:
            for url in urls:
                remaining = deadline_at - time.monotonic()
                if remaining <= 0 or abandoned.is_set():
                    break
                try:
                    response = client.post(
                        f"{url}/v1/selections/{decision_id}/failure",
                        json=payload,
                        timeout=remaining,
                    )
                except httpx.HTTPError as exc:
                    problems.append(f"{url}: {type(exc).__name__}")
                    continue
                if response.status_code < 300:
                    return None
                problems.append(f"{url}: HTTP {response.status_code}")
                if response.status_code < 500:
                    break  # another replica shares the same store and would say the same
        return "; ".join(problems) or "deadline passed"

    try:
        finished, outcome = run_within(send, timeout_s)
    except Exception as exc:  # best effort by contract
        return f"{type(exc).__name__}: {exc}"
    return outcome if finished else f"no answer within {timeout_s:g}s"


@dataclass
class PostResult:
    """A 2xx answer to :func:`post_json`: which URL took it, the status and the body."""

    url: str
    status: int
    body: Any
    attempts: list[str] = field(default_factory=list)


def _post_rounds(
    path: str,
    body: dict[str, Any],
    urls: Sequence[str],
    token: BearerToken,
    deadline_at: float,
    abandoned: threading.Event,
    attempts: list[str],
) -> PostResult:
    """The retry rounds of :func:`ask_service` for a plain JSON POST (no ETag, no 304)."""

    def accept(url: str, response: httpx.Response) -> PostResult | None:
        if not 200 <= response.status_code < 300:
            attempts.append(f"{url}: unexpected HTTP {response.status_code}")
            return None
        try:
            data = response.json()
        except ValueError:
            data = None
        return PostResult(url, response.status_code, data, attempts)

    with httpx.Client(headers=_headers(token), verify=_verify(urls)) as client:
        return _rounds(client, path, body, urls, deadline_at, abandoned, attempts, accept)


def post_json(
    path: str,
    body: dict[str, Any],
    *,
    urls: Sequence[str],
    token: BearerToken,
    deadline_s: float,
) -> PostResult:
    """``POST path`` with a JSON body to ``urls`` in turn, with the same retries and hard
    deadline as :func:`ask_service` (used for ``POST /v1/measurements``).

    A retried POST whose first answer was lost in transit reaches the service again:
    bodies that must be stored once carry their own id (measurement reports do:
    ``report_id``). Raises ServiceUnavailable or ServiceRefused.
    """
    if not urls:
        raise ServiceUnavailable(f"no service URL configured ({URL})")
    deadline_at = time.monotonic() + deadline_s
    attempts: list[str] = []
    finished, result = run_within(
        lambda abandoned: _post_rounds(path, body, urls, token, deadline_at, abandoned, attempts),
        deadline_s,
    )
    if not finished or result is None:
        raise ServiceUnavailable(f"no answer within the {deadline_s:g}s deadline", list(attempts))
    return result
