"""The last answer the service gave for this pod's situation, kept on local disk.

It serves twice: when the service is down the pod boots on the cached answer
(fail static), and when it is up the stored ETag lets the service answer 304 without
a body. The key is a hash of everything in the request that can change the decision
(cluster, device, model, dtype, packages, requested backend, strict), i.e. the request
without ``node`` and ``pod``, which name the pod rather than describe it: a pod
restarted under a new name still finds its answer.

Writes go to a temporary file in the same directory and are renamed into place, so a
reader sees the old file or the new one, never half of one; a file that is corrupt
anyway (a full disk, a hand edit) is ignored with a warning, never a crash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mla_switchboard.core.schemas import SelectRequest, SelectResponse
from mla_switchboard.core.version import PROGRAM
from pydantic import ValidationError

__all__ = ["AnswerCache", "CacheEntry", "cache_key", "default_cache_dir"]

FORMAT = 1
_IDENTITY_FIELDS = {"node", "pod"}


def default_cache_dir(base: str) -> Path:
    """``$XDG_CACHE_HOME/switchboard`` (``base``, as the settings read it), else
    ``~/.cache/switchboard`` (XDG: a relative ``XDG_CACHE_HOME`` is invalid and
    ignored)."""
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / PROGRAM


def cache_key(request: SelectRequest) -> str:
    """Hash of the decision-relevant part of ``request`` (canonical JSON)."""
    relevant = request.model_dump(mode="json", exclude=_IDENTITY_FIELDS)
    canonical = json.dumps(
        {"format": FORMAT, "request": relevant}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    response: SelectResponse
    etag: str | None
    stored_at: float
    url: str | None

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.stored_at)


class AnswerCache:
    """One JSON file per key under ``directory``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).expanduser()

    def path_for(self, request: SelectRequest) -> Path:
        return self.directory / f"select-{cache_key(request)[:40]}.json"

    def load(self, request: SelectRequest) -> tuple[CacheEntry | None, str | None]:
        """(entry, None) on a hit, (None, None) on a miss, (None, warning) when the file
        is there but unusable."""
        path = self.path_for(request)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"cannot read cache file {path}: {exc.strerror or exc}; ignoring it"
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("unknown format")
            if data.get("key") != cache_key(request):
                raise ValueError("entry belongs to another request")
            entry = CacheEntry(
                response=SelectResponse.model_validate(data["response"]),
                etag=data.get("etag") if isinstance(data.get("etag"), str) else None,
                stored_at=float(data.get("stored_at", 0.0)),
                url=data.get("url") if isinstance(data.get("url"), str) else None,
            )
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return None, f"cache file {path} is corrupt ({reason}); ignoring it"
        return entry, None

    def store(
        self, request: SelectRequest, response: SelectResponse, etag: str | None, url: str | None
    ) -> str | None:
        """Write atomically; None on success, else a warning (a read-only disk must not
        stop the pod)."""
        path = self.path_for(request)
        document: dict[str, Any] = {
            "format": FORMAT,
            "key": cache_key(request),
            "stored_at": time.time(),
            "etag": etag,
            "url": url,
            "request": request.model_dump(mode="json"),
            "response": response.model_dump(mode="json"),
        }
        tmp_name: str | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=self.directory, prefix=".select-", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=1)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, path)
            tmp_name = None
        except OSError as exc:
            return f"cannot write cache file {path}: {exc.strerror or exc}"
        finally:
            if tmp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)
        return None
