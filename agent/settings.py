"""The agent's settings: every environment variable it reads, named and read here.

A pod is configured by its environment (``SWITCHBOARD_URL`` and the rest, set in its
manifest), and the agent's commands and ``select_backend`` read it once, at their
start, into :class:`AgentSettings`, which they hand to what needs a value; no other
module reads ``os.environ`` for them. The names are written here only, so a command's
``--help``, its errors and the reader cannot disagree about what a variable is called.
Standard library only: the agent must not need the server's dependencies.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CACHE_DIR",
    "CLUSTER",
    "DEADLINE",
    "DEFAULT_DEADLINE_S",
    "ENGINE",
    "ENVIRONMENT",
    "NODE",
    "POD",
    "TOKEN",
    "TOKEN_FILE",
    "URL",
    "XDG_CACHE_HOME",
    "AgentSettings",
    "BearerToken",
    "TokenFile",
]

URL = "SWITCHBOARD_URL"
TOKEN = "SWITCHBOARD_TOKEN"
TOKEN_FILE = "SWITCHBOARD_TOKEN_FILE"
KUBERNETES_TOKEN_FILE = "/var/run/secrets/tokens/switchboard-token"
"""Where docs/security.md's pod manifest mounts the projected service-account token
(a ``serviceAccountToken`` volume source with the service's audience)."""
CLUSTER = "SWITCHBOARD_CLUSTER"
NODE = "SWITCHBOARD_NODE"
POD = "SWITCHBOARD_POD"
ENGINE = "SWITCHBOARD_ENGINE"
DEADLINE = "SWITCHBOARD_DEADLINE"
CACHE_DIR = "SWITCHBOARD_CACHE_DIR"
XDG_CACHE_HOME = "XDG_CACHE_HOME"

DEFAULT_DEADLINE_S = 2.0

ENVIRONMENT = {
    URL: "service URL(s), comma-separated (default of --url)",
    TOKEN: "bearer token with the agent role (default of --token)",
    TOKEN_FILE: "file holding the bearer token, read again at each request (default of "
    f"--token-file; the pod's projected service-account token, e.g. {KUBERNETES_TOKEN_FILE}); "
    f"{TOKEN} when it cannot be read",
    CLUSTER: "cluster name (default of --cluster)",
    NODE: "node name (default of --node)",
    POD: "pod name (default of --pod; else the pod the token file's service-account token "
    "names, else the hostname)",
    ENGINE: "serving engine, as --engine (default: detected)",
    DEADLINE: f"seconds for the decision (select's default of --deadline: {DEFAULT_DEADLINE_S:g})",
    CACHE_DIR: "answer cache (default of --cache-dir)",
    XDG_CACHE_HOME: "answer cache under $XDG_CACHE_HOME/switchboard when no cache dir is set",
}
"""Every environment variable a command reads, as its ``--help`` lists it."""


BearerToken = str | Callable[[], str | None] | None
"""A bearer token, or where to read it at each request (:class:`TokenFile`)."""


@dataclass(frozen=True)
class TokenFile:
    """The bearer token in a file, read afresh at each call: the kubelet rewrites a
    projected service-account token well before it expires, so a token read once at
    boot would be refused an hour later. ``fallback`` (the static token) when the file
    cannot be read or is empty."""

    path: str
    fallback: str | None = None

    def __call__(self) -> str | None:
        text, _ = self._read()
        return text or self.fallback

    def problem(self) -> str | None:
        """Why the file gives no token now, which file, and what is sent instead; None
        when it gives one. Said on the pod's log: a mistyped path would otherwise
        surface only as the service's "missing bearer token"."""
        text, why = self._read()
        if text:
            return None
        instead = f"sending {TOKEN} (or --token) instead" if self.fallback else "sending no token"
        return (
            f"cannot read the token file {self.path} (--token-file or {TOKEN_FILE}): "
            f"{why}; {instead}"
        )

    def _read(self) -> tuple[str, str]:
        """(the file's token, or "" and why there is none)."""
        try:
            text = Path(self.path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            return "", exc.strerror or type(exc).__name__
        except UnicodeDecodeError:
            return "", "it is not UTF-8 text"
        return (text, "") if text else ("", "it is empty")


def token_source_problem(token: BearerToken) -> str | None:
    """What is wrong with where the token comes from (an unreadable token file); None
    for a static token or none at all."""
    return token.problem() if isinstance(token, TokenFile) else None


def bearer_of(token: BearerToken) -> str | None:
    """The token to send now."""
    return token() if callable(token) else token


@dataclass(frozen=True)
class AgentSettings:
    """What the environment says, as read once. An empty variable counts as unset.

    ``deadline`` stays text: a bad value is the caller's bad input, reported when the
    deadline is needed (:meth:`deadline_s`), not when the settings are read.
    """

    url: str = ""
    token: str | None = None
    token_file: str | None = None
    cluster: str | None = None
    node: str | None = None
    pod: str | None = None
    engine: str | None = None
    deadline: str | None = None
    cache_dir: str | None = None
    xdg_cache_home: str = ""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> AgentSettings:
        """The settings of ``environ`` (default: this process's environment, now)."""
        env = os.environ if environ is None else environ
        return cls(
            url=env.get(URL, ""),
            token=env.get(TOKEN) or None,
            token_file=env.get(TOKEN_FILE) or None,
            cluster=env.get(CLUSTER) or None,
            node=env.get(NODE) or None,
            pod=env.get(POD) or None,
            engine=env.get(ENGINE) or None,
            deadline=env.get(DEADLINE),
            cache_dir=env.get(CACHE_DIR) or None,
            xdg_cache_home=env.get(XDG_CACHE_HOME, ""),
        )

    @property
    def bearer(self) -> BearerToken:
        """What requests authenticate with: the token file's content at each request
        when one is set, else the static token."""
        if self.token_file:
            return TokenFile(self.token_file, self.token)
        return self.token

    def deadline_s(self, default: float = DEFAULT_DEADLINE_S) -> float:
        """``SWITCHBOARD_DEADLINE`` in seconds; ValueError for a bad value, never the
        default in its place."""
        raw = self.deadline
        if raw is None or not raw.strip():
            return default
        value = float(raw)  # ValueError is the caller's bad input
        if not value > 0:
            raise ValueError(f"{DEADLINE} must be positive, got {raw!r}")
        return value
