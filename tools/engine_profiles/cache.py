"""Where the profile tools keep downloaded wheels, extracted trees and helper packages.

Several gigabytes of engine releases must never land inside the repository nor, on a
shared machine, in a home directory nobody watches: ``$SWITCHBOARD_ENGINE_CACHE``
moves the cache for every tool (vLLM, SGLang, the FlashInfer releases SGLang pins),
and each run ends by stating how much the cache holds, so it can be cleaned knowingly.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root", "cache_summary"]

DEFAULT = "~/.cache/switchboard-engines"


def cache_root() -> Path:
    """The cache every profile tool writes under (read at call time, so a test or a
    caller that sets the variable late is obeyed)."""
    return Path(os.environ.get("SWITCHBOARD_ENGINE_CACHE", DEFAULT)).expanduser()


def _size(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(folder) / name).lstat().st_size
            except OSError:
                continue  # removed while walking: nothing left to count
    return total


def cache_summary(root: Path | None = None) -> str:
    """One line for the end of a run: the cache's path and size, and how to clean it."""
    root = cache_root() if root is None else root
    if not root.exists():
        return f"engine cache {root}: empty"
    size = _size(root)
    return (
        f"engine cache {root}: {size / 2**30:.2f} GiB "
        f"(remove the folder to clean it; $SWITCHBOARD_ENGINE_CACHE moves it)"
    )
