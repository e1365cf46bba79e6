"""Turning exceptions into one-line messages that are safe to log and to answer with."""

from __future__ import annotations


def first_line(error: BaseException | str | None, limit: int = 200) -> str:
    """The first non-empty line of an error's text (its type name when it has none):
    ``str(exc).splitlines()[0]`` fails on an empty message, which once killed the
    thread that was reporting it."""
    if isinstance(error, BaseException):
        text = str(getattr(error, "orig", None) or error)
        fallback = type(error).__name__
    else:
        text, fallback = error or "", "(no message)"
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:limit]
    return fallback
